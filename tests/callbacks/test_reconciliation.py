import io
import json
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from callbacks import sqs
from callbacks.reconciliation import _events_to_publish, payments_reconcile
from payments.exceptions import ProcessorUnavailable
from payments.models import LedgerEntry, Payment, PaymentEvent, ProcessorAttempt
from payments.services import payment_submit
from tests.callbacks.worker_support import run_worker
from tests.factories import PaymentFactory
from tests.waiting import wait_for
from triage.models import Alert

# The worker commits in its own transactions, as in production.
pytestmark = pytest.mark.django_db(transaction=True)


def wait_for_status(sandbox, payment, status, timeout=10.0):
    def reported() -> bool:
        debit = sandbox.debit(str(payment.idempotency_key))
        return debit is not None and debit.status == status

    wait_for(reported, timeout, f"the sandbox to report {status} for {payment.id}")


def queued_bodies(sqs_queues) -> list[dict]:
    """The first message of each group on the main queue, left in place (visibility 0)."""
    bodies = {}
    for _ in range(3):
        response = sqs_queues.client.receive_message(
            QueueUrl=sqs_queues.url, MaxNumberOfMessages=10, VisibilityTimeout=0
        )
        for message in response.get("Messages", []):
            bodies[message["MessageId"]] = json.loads(message["Body"])
    return list(bodies.values())


def queue_depth(sqs_queues) -> int:
    attributes = sqs_queues.client.get_queue_attributes(
        QueueUrl=sqs_queues.url, AttributeNames=["ApproximateNumberOfMessages"]
    )["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"])


def applied_events(payment):
    return list(
        PaymentEvent.objects.filter(payment=payment, kind="processor_event", outcome="applied")
        .order_by("id")
        .values_list("event_type", "processor_event_id")
    )


def test_submitted_payment_whose_callbacks_were_lost_is_confirmed_through_the_queue(
    sandbox, sqs_queues
):
    payment = PaymentFactory()
    assert payment_submit(payment_id=payment.id).outcome == "submitted"
    wait_for_status(sandbox, payment, "settled")  # its callbacks went nowhere
    payment.refresh_from_db()
    assert payment.state == "submitted"

    # Not stuck yet: ACH takes days.
    assert payments_reconcile(now=timezone.now() + timedelta(days=2)) == 0
    assert payments_reconcile(now=timezone.now() + timedelta(days=4)) == 1

    (envelope,) = queued_bodies(sqs_queues)
    body = envelope["event"]
    key = payment.idempotency_key
    assert envelope["kind"] == "processor_event"
    assert body["event_type"] == "settled"
    assert body["processor_event_id"] == f"recon:{key}:settled"
    assert body["amount"] == "125.00"
    assert body["source"] == "reconciliation"

    run_worker()

    payment.refresh_from_db()
    assert payment.state == "confirmed"
    assert applied_events(payment) == [("settled", f"recon:{key}:settled")]
    assert LedgerEntry.objects.filter(payment=payment).count() == 1
    # Confirmed now: no longer a candidate, even after the recheck interval.
    assert payments_reconcile(now=timezone.now() + timedelta(days=10)) == 0


def test_pending_payment_after_a_timed_out_submission_reaches_its_final_state(sandbox, sqs_queues):
    payment = PaymentFactory(source_token="tok_timeout_1_recon")
    with pytest.raises(ProcessorUnavailable):
        payment_submit(payment_id=payment.id)  # the processor records the debit anyway
    wait_for_status(sandbox, payment, "settled")
    payment.refresh_from_db()
    assert payment.state == "pending"

    assert payments_reconcile(now=timezone.now() + timedelta(minutes=1)) == 0  # too early
    assert payments_reconcile(now=timezone.now() + timedelta(minutes=10)) == 1

    key = payment.idempotency_key
    # Both events in the payment's group, "submitted" first.
    assert queue_depth(sqs_queues) == 2
    assert [b["event"]["processor_event_id"] for b in queued_bodies(sqs_queues)] == [
        f"recon:{key}:submitted"
    ]

    run_worker()

    payment.refresh_from_db()
    assert payment.state == "confirmed"
    assert applied_events(payment) == [
        ("submitted", f"recon:{key}:submitted"),
        ("settled", f"recon:{key}:settled"),
    ]
    # Charged once: the retry-free path never submitted a second debit.
    assert sandbox.stats()["charges"] == {str(key): 1}


def test_repeated_runs_publish_identical_messages_that_deduplicate(
    sandbox, sqs_queues, module_settings
):
    payment = PaymentFactory()
    payment_submit(payment_id=payment.id)
    wait_for_status(sandbox, payment, "settled")
    Payment.objects.filter(pk=payment.pk).update(
        state_changed_at=timezone.now() - timedelta(days=5)
    )
    assert payments_reconcile() == 1
    # Checked a moment ago: skipped until the recheck interval has passed.
    assert payments_reconcile() == 0
    module_settings.RECONCILE_RECHECK_AFTER = timedelta(0)
    assert payments_reconcile() == 1

    assert queue_depth(sqs_queues) == 1  # the second publication was deduplicated
    run_worker()
    payment.refresh_from_db()
    assert payment.state == "confirmed"
    assert ProcessorAttempt.objects.filter(payment=payment, operation="status").count() == 2


def test_payment_the_processor_does_not_know_raises_an_alert_and_publishes_nothing(
    sandbox, sqs_queues
):
    payment = PaymentFactory(state="submitted")  # never reached this processor
    Payment.objects.filter(pk=payment.pk).update(
        state_changed_at=timezone.now() - timedelta(days=5)
    )
    assert payments_reconcile() == 0
    assert queued_bodies(sqs_queues) == []
    alert = Alert.objects.get(key="reconcile.debit_unknown")
    assert alert.severity == "medium"
    assert alert.payment_id == payment.id


def test_processor_unavailable_leaves_the_payment_for_the_next_run(module_settings, sqs_queues):
    from payments.processor.backends.http import reset_client

    module_settings.PROCESSOR_BASE_URL = "http://127.0.0.1:9"
    reset_client()
    payment = PaymentFactory(state="submitted")
    Payment.objects.filter(pk=payment.pk).update(
        state_changed_at=timezone.now() - timedelta(days=5)
    )
    try:
        assert payments_reconcile() == 0
    finally:
        reset_client()
    attempt = ProcessorAttempt.objects.get(payment=payment, operation="status")
    assert attempt.outcome == "retryable"
    assert queued_bodies(sqs_queues) == []


def test_queue_down_raises_and_the_command_names_it(sandbox, sqs_queues, module_settings):
    payment = PaymentFactory()
    payment_submit(payment_id=payment.id)
    wait_for_status(sandbox, payment, "settled")
    Payment.objects.filter(pk=payment.pk).update(
        state_changed_at=timezone.now() - timedelta(days=5)
    )
    module_settings.SQS_ENDPOINT_URL = "http://127.0.0.1:9"
    sqs.reset()
    with pytest.raises(CommandError, match="could not publish to the queue"):
        call_command("reconcile_payments")
    payment.refresh_from_db()
    assert payment.state == "submitted"


def test_only_stuck_payments_are_candidates(sandbox, sqs_queues):
    now = timezone.now()
    recent = PaymentFactory(state="submitted")
    rejected_5xx = PaymentFactory(source_token="tok_fail5xx_1_recon")
    with pytest.raises(ProcessorUnavailable):
        payment_submit(payment_id=rejected_5xx.id)
    assert payments_reconcile(now=now + timedelta(hours=1)) == 0
    # Neither was asked: the submitted one is too recent, the 5xx one is the worker's to retry.
    assert not ProcessorAttempt.objects.filter(operation="status").exists()
    assert {recent.id, rejected_5xx.id} == set(Payment.objects.values_list("id", flat=True))


@pytest.mark.parametrize(
    ("state", "processor_status", "expected"),
    [
        ("pending", "submitted", ["submitted"]),
        ("pending", "settled", ["submitted", "settled"]),
        ("pending", "returned", ["submitted", "returned"]),
        ("submitted", "submitted", []),
        ("submitted", "settled", ["settled"]),
        ("submitted", "failed", ["failed"]),
        ("confirmed", "settled", []),
    ],
)
def test_processor_status_maps_to_the_events_still_missing(state, processor_status, expected):
    assert _events_to_publish(Payment(state=state), processor_status) == expected


def test_reconcile_command_reports_the_count(sandbox, sqs_queues):
    stuck = PaymentFactory()
    payment_submit(payment_id=stuck.id)
    wait_for_status(sandbox, stuck, "settled")
    Payment.objects.filter(pk=stuck.pk).update(state_changed_at=timezone.now() - timedelta(days=5))
    PaymentFactory(state="submitted")  # recent: not a candidate
    out = io.StringIO()

    call_command("reconcile_payments", "--limit", "5", stdout=out)

    assert out.getvalue() == "published events for 1 payment(s)\n"
    assert [b["event"]["event_type"] for b in queued_bodies(sqs_queues)] == ["settled"]
    with pytest.raises(CommandError, match="--limit: must be at least 1, got 0"):
        call_command("reconcile_payments", "--limit", "0")
