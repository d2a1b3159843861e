"""run_sqs_worker against PostgreSQL and the local SQS server (fauxqs) over HTTP."""


import pytest
from django.core.management import call_command

from callbacks.models import QueueMessage
from payments.models import LedgerEntry, PaymentEvent, PaymentState
from tests.callbacks.worker_support import drain, send_event
from tests.factories import PaymentFactory

pytestmark = pytest.mark.django_db(transaction=True)


def run_worker(**options):
    options.setdefault("until_empty", True)
    options.setdefault("wait_time", 0)
    options.setdefault("visibility_timeout", 30)
    options.setdefault("relay", False)
    call_command("run_sqs_worker", **options)


def test_processor_event_is_applied_and_deleted(sqs_queues):
    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    message_id, _ = send_event(sqs_queues.client, sqs_queues.url, payment, "settled")

    run_worker()

    payment.refresh_from_db()
    assert payment.state == PaymentState.CONFIRMED
    assert LedgerEntry.objects.filter(payment=payment).count() == 1
    record = QueueMessage.objects.get(message_id=message_id)
    assert (record.status, record.outcome, record.attempts) == ("done", "applied", 1)
    assert drain(sqs_queues.client, sqs_queues.url) == []
    assert PaymentEvent.objects.get(payment=payment, outcome="applied").caused_by == (
        f"sqs:{message_id}"
    )
