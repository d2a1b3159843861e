"""A submission on SQLite (the one-machine quick start and the demo): no one-statement mark or
record there, the first transaction and the second are the ORM's statements one by one, and the
worker's done mark is the same ``UPDATE`` as on PostgreSQL. Accepted, retried and rejected
answers against the sandbox processor over HTTP, and the queue record marked done."""

import pytest

from tests.sqlite_quick_start import sqlite_script_answers

SCRIPT = """
import json

import django
django.setup()
from django.conf import settings
from django.core.management import call_command
from django.db import connection
from django.test.utils import override_settings
from django.utils import timezone

from callbacks.models import QueueMessage
from callbacks.services import queue_message_complete
from payments.exceptions import ProcessorUnavailable
from payments.models import PaymentEvent, ProcessorAttempt
from payments.processor.backends.http import reset_client
from payments.services import payment_submit
from sandbox import SandboxProcessor
from tests.factories import PaymentFactory

assert connection.vendor == "sqlite", connection.vendor
call_command("migrate", verbosity=0)
sandbox = SandboxProcessor().start()
answers = {}
try:
    with override_settings(PAYMENTS={**settings.PAYMENTS, "PROCESSOR_BASE_URL": sandbox.base_url}):
        reset_client()
        for name, token in [
            ("accepted", "tok_plain_sqlite_0001"),
            ("retried", "tok_fail5xx_1_sqlite"),
            ("rejected", "tok_reject_sqlite"),
        ]:
            payment = PaymentFactory(source_token=token)
            outcomes = []
            for _ in range(2):
                try:
                    outcomes.append(str(payment_submit(payment_id=payment.id).outcome))
                except ProcessorUnavailable:
                    outcomes.append("retryable")
            payment.refresh_from_db()
            answers[name] = {
                "outcomes": outcomes,
                "state": payment.state,
                "attempts": [
                    [a.attempt_number, a.outcome]
                    for a in ProcessorAttempt.objects.filter(payment=payment).order_by("id")
                ],
                "log": [
                    [e.outcome, e.to_state, e.payload["attempt_number"]]
                    for e in PaymentEvent.objects.filter(payment=payment, kind="submission")
                ],
                "charges": sandbox.stats()["charges"].get(str(payment.idempotency_key), 0),
            }
finally:
    sandbox.stop()
now = timezone.now()
record = QueueMessage.objects.create(
    message_id="m-sqlite", kind="submit_payment", group_id="g", first_started_at=now,
    last_started_at=now, attempts=1, status="in_progress",
)
queue_message_complete(queue_message=record, outcome="submitted")
record = QueueMessage.objects.get(pk=record.pk)
answers["record"] = [record.status, record.outcome, record.finished_at is not None]
print(json.dumps(answers))
"""


@pytest.mark.subprocess
def test_a_submission_on_sqlite_records_its_attempts_and_moves_the_payment(tmp_path):
    answers = sqlite_script_answers(SCRIPT, tmp_path)
    assert answers["accepted"] == {
        "outcomes": ["submitted", "skipped"],
        "state": "submitted",
        "attempts": [[1, "accepted"]],
        "log": [["applied", "submitted", 1]],
        "charges": 1,
    }
    # The 5xx came between another payment's success and the next: made again at once, on a
    # new connection (``breaker.degraded``), in the same submission.
    assert answers["retried"] == {
        "outcomes": ["submitted", "skipped"],
        "state": "submitted",
        "attempts": [[1, "retryable"], [2, "accepted"]],
        "log": [["applied", "submitted", 2]],
        "charges": 1,
    }
    assert answers["rejected"] == {
        "outcomes": ["rejected", "skipped"],
        "state": "failed",
        "attempts": [[1, "rejected"]],
        "log": [["applied", "failed", 1]],
        "charges": 0,
    }
    assert answers["record"] == ["done", "submitted", True]
