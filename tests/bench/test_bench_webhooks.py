"""The bench's webhooks phase, small: real sender processes deliver every event to the
verifying receiver, and the figures and the report rows come from that run."""

import pytest
from django.db import connection

from bench import webhooks
from bench.report import summary_rows
from bench.stack import Stack
from tests.payments.webhook_support import loopback_webhooks  # noqa: F401 - fixture

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.subprocess]


@pytest.mark.usefixtures("loopback_webhooks")
def test_the_phase_delivers_every_event_and_reports_rate_and_cpu(monkeypatch, tmp_path):
    monkeypatch.setitem(webhooks.CONFIG, "webhook_events", 60)
    monkeypatch.setitem(webhooks.CONFIG, "webhook_senders", 2)
    monkeypatch.setattr(webhooks, "RESULTS", tmp_path)
    problems: list[str] = []
    monkeypatch.setattr(webhooks, "problems", problems)
    db = connection.settings_dict
    stack = Stack(
        database_url=f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        sqs_endpoint="http://127.0.0.1:9",
        secrets=["bench-secret"],
    )

    result = webhooks.webhooks_phase(stack)

    assert problems == []
    assert (result["events"], result["senders"], result["repeats"]) == (60, 2, 0)
    assert result["deliveries_per_second"] > 0 and result["cpu_ms_per_delivery"] > 0
    rows = summary_rows({"webhooks": result, "e2e": {"pipeline_cpu_ms_per_event": 2.0}})
    assert [row[0] for row in rows] == [
        "webhooks: deliveries/s, 2 senders",
        "webhooks: sender CPU ms per delivery",
    ]
    assert rows[1][2] == "pipeline 2.00 per event"
