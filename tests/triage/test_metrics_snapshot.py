"""The gauges /metrics reads from SQS and the database are read at most once per interval in a
process, however often it is scraped."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from callbacks import sqs
from tests.triage.test_metrics import scrape, value
from triage.models import DeadLetter
from triage.operations import monitoring
from triage.operations.dependencies import dependencies_reset

pytestmark = pytest.mark.django_db


@pytest.fixture
def sqs_calls(sqs_queues):
    """The queue reads (GetQueueAttributes) made through the gateway's client; the queue URLs
    it looks up once and keeps are not counted."""
    calls: list[str] = []

    def record(*, model, **kwargs) -> None:
        if model.name == "GetQueueAttributes":
            calls.append(model.name)

    client = sqs.sqs_client()
    client.meta.events.register("provide-client-params.sqs", record)
    yield calls
    client.meta.events.unregister("provide-client-params.sqs", record)


@pytest.fixture
def clock(monkeypatch):
    """The snapshots' clock, moved by hand: ``clock.now += 16``."""

    class Clock:
        now = 1000.0

    monkeypatch.setattr(monitoring, "_clock", lambda: Clock.now)
    return Clock


def dead_letter_open(n: int) -> None:
    DeadLetter.objects.create(
        original_message_id=f"m{n}",
        dlq_message_id=f"d{n}",
        kind="processor_event",
        group_id="g",
        body={},
        source="worker",
        status="open",
    )


def test_scrapes_within_the_interval_share_one_snapshot_and_a_later_one_refreshes_it(
    client, module_settings, sqs_calls, clock
):
    module_settings.METRICS_SNAPSHOT_SECONDS = 15
    dependencies_reset()
    dead_letter_open(1)
    with CaptureQueriesContext(connection) as first:
        samples = scrape(client)
    assert value(samples, "payments_dead_letters_open") == 1
    assert first.captured_queries
    reads = list(sqs_calls)
    # The main queue and the DLQ for the queue gauges, the main queue for payments_dependency_up.
    assert len(reads) == 3

    dead_letter_open(2)
    clock.now += 14
    with CaptureQueriesContext(connection) as second:
        samples = scrape(client)
    assert second.captured_queries == []
    assert sqs_calls == reads  # no SQS call either
    assert value(samples, "payments_dead_letters_open") == 1  # the snapshot, 14 s old

    clock.now += 1
    dependencies_reset()  # the dependency checks' own 5 s cache runs on the real clock
    with CaptureQueriesContext(connection) as third:
        samples = scrape(client)
    assert len(third.captured_queries) == len(first.captured_queries)
    assert sqs_calls == reads * 2
    assert value(samples, "payments_dead_letters_open") == 2


def test_the_snapshot_says_when_it_was_taken(client, module_settings, sqs_queues, clock):
    module_settings.METRICS_SNAPSHOT_SECONDS = 15
    taken = value(scrape(client), "payments_ops_snapshot_timestamp_seconds")
    clock.now += 5
    assert value(scrape(client), "payments_ops_snapshot_timestamp_seconds") == taken > 0


def test_an_interval_of_zero_reads_on_every_scrape(client, module_settings, sqs_calls):
    module_settings.METRICS_SNAPSHOT_SECONDS = 0
    dependencies_reset()
    scrape(client)
    reads = len(sqs_calls)
    dependencies_reset()  # the dependency checks keep their own 5 s cache against probe storms
    scrape(client)
    assert len(sqs_calls) == 2 * reads > 0
