"""The pull against events the queue cannot take and events that carry bank numbers: one event
SQS cannot take is dead-lettered on its own with an alert and the cursor moves past it, batches
stay within SQS's byte limits, and every dead letter is stored with its bank numbers masked."""

import uuid

import pytest

from callbacks import sqs
from callbacks.events_pull import UNQUEUED_ALERT_KEY, processor_events_pull
from payments.models import PaymentState
from tests.bank_number_scan import bank_number_scan
from tests.callbacks.test_events_pull_hostile import (  # noqa: F401 (the fixture)
    event,
    page,
    scripted,
    stored_cursor,
)
from tests.callbacks.worker_support import run_worker
from tests.factories import PaymentFactory
from triage.ingestion import dead_letters_ingest
from triage.models import Alert, DeadLetter

pytestmark = pytest.mark.django_db(transaction=True)

ACCOUNT = "4455667788991"
GROUPED = "7766-8056-8693"
FULL_WIDTH = "\uff13\uff13\uff14\uff14\uff15\uff15\uff16\uff16\uff17"


def test_an_event_larger_than_a_queue_message_is_dead_lettered_alone_and_the_pull_goes_on(
    sqs_queues,
    scripted,  # noqa: F811
):
    stuck, after = (PaymentFactory(state=PaymentState.SUBMITTED) for _ in range(2))
    huge = event(stuck, "settled", notes=f"ACCT {ACCOUNT} " + "x" * (sqs.BATCH_MAX_BYTES + 1))
    scripted(lambda a, limit: page([huge, event(after, "settled")], "c1"))

    result = processor_events_pull()

    assert (result.outcome, result.new, result.unqueued) == ("done", 1, 1)
    assert stored_cursor() == "c1"  # moved past it
    run_worker()
    after.refresh_from_db()
    stuck.refresh_from_db()
    assert after.state == PaymentState.CONFIRMED  # the event behind it applied
    assert stuck.state == PaymentState.SUBMITTED  # the big one waits for a person
    [alert] = Alert.objects.filter(key=UNQUEUED_ALERT_KEY)
    assert alert.details["processor_event_id"] == huge["processor_event_id"]
    assert dead_letters_ingest() == 1
    dead = DeadLetter.objects.get()
    assert dead.last_error_class == "UnqueuedPulledEvent" and dead.payment_id == stuck.id
    assert dead.processor_event_id == huge["processor_event_id"]
    assert "notes" not in dead.body["event"]  # left out to fit; the contract fields whole
    assert dead.body["event"]["amount"] == huge["amount"]
    assert bank_number_scan([ACCOUNT]) == []
    # Pulled again: the same dead letter, not a second one.
    from callbacks.models import ProcessorEventsCursor

    ProcessorEventsCursor.objects.update(cursor="")
    assert processor_events_pull().outcome == "done"
    dead_letters_ingest()
    assert DeadLetter.objects.count() == 1


def test_an_event_sqs_refuses_for_its_own_fault_is_dead_lettered_not_retried_forever(
    sqs_queues,
    scripted,  # noqa: F811
):
    # A queue whose messages may have 2 KiB: SQS refuses the entry (SenderFault), not the call.
    sqs_queues.client.set_queue_attributes(
        QueueUrl=sqs_queues.url, Attributes={"MaximumMessageSize": "2048"}
    )
    stuck, after = (PaymentFactory(state=PaymentState.SUBMITTED) for _ in range(2))
    big = event(stuck, "settled", notes="y" * 4096)
    scripted(lambda a, limit: page([big, event(after, "settled")], "c1"))

    result = processor_events_pull()

    assert (result.outcome, result.new, result.unqueued) == ("done", 1, 1)
    assert stored_cursor() == "c1"
    assert "SQS refused" in Alert.objects.get(key=UNQUEUED_ALERT_KEY).details["reason"]
    assert dead_letters_ingest() == 1


def test_a_page_of_large_events_is_sent_in_batches_within_the_byte_limit(
    sqs_queues,
    scripted,  # noqa: F811
):
    payments = [PaymentFactory(state=PaymentState.SUBMITTED) for _ in range(10)]
    # Ten messages of about 120 KiB: 1.2 MiB together, over any batch call SQS takes.
    events = [event(p, "settled", notes="z" * 120_000) for p in payments]
    scripted(lambda a, limit: page(events, "c1"))

    result = processor_events_pull()

    assert (result.outcome, result.new, result.unqueued) == ("done", 10, 0)
    run_worker()
    assert {p.state for p in (PaymentFactory._meta.model.objects.all())} == {PaymentState.CONFIRMED}


@pytest.mark.parametrize(
    "fields",
    [
        {"amount": ACCOUNT},  # a contract field that broke its grammar
        {"processor_event_id": f"evt {GROUPED}"},
        {"message": f"paid from {FULL_WIDTH}", "amount": "1.5"},
        {"currency": ACCOUNT},
        {"timestamp": int(ACCOUNT)},
        {f"acct_{ACCOUNT}": "x", "amount": "-1.00"},  # a member's name
        {"corrected_data": {"account": ACCOUNT}, "amount": "NaN"},
        {"extra": [ACCOUNT, {"nested": GROUPED}], "event_type": "bogus"},
        {"message": f"acct {ACCOUNT}\x00", "amount": "1e400"},  # a NUL PostgreSQL cannot hold
        {"message": f"acct {ACCOUNT} \ud800"},  # a lone surrogate
        {f"k\x00{ACCOUNT}": "\udfff", "amount": 10**400},
        {"payment_id": str(uuid.uuid4()), "amount": ACCOUNT},  # a payment not ours
    ],
)
def test_a_malformed_event_is_dead_lettered_with_its_bank_numbers_masked(
    sqs_queues,
    scripted,  # noqa: F811
    fields,
):
    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    bad = {**event(payment, "settled"), **fields}
    scripted(lambda a, limit: page([bad], "c1"))

    result = processor_events_pull()

    assert (result.outcome, result.malformed) == ("done", 1)
    assert dead_letters_ingest() == 1
    dead = DeadLetter.objects.get()
    assert dead.last_error_class == "InvalidPulledEvent"
    assert str(dead.payment_id) == bad["payment_id"]
    assert bank_number_scan([ACCOUNT, GROUPED, FULL_WIDTH]) == []


def test_a_malformed_event_too_large_for_the_queue_is_dead_lettered_cut_down(
    sqs_queues,
    scripted,  # noqa: F811
):
    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    bad = event(payment, "settled", amount="12.5", notes=f"{ACCOUNT} " + "n" * 300_000)
    scripted(lambda a, limit: page([bad], "c1"))

    result = processor_events_pull()

    assert (result.outcome, result.malformed) == ("done", 1)
    assert stored_cursor() == "c1"
    assert dead_letters_ingest() == 1
    dead = DeadLetter.objects.get()
    assert dead.body["event"]["notes"].endswith("characters left out)")
    assert dead.body["event"]["processor_event_id"] == bad["processor_event_id"]
    assert "left out" in dead.last_error_message
    assert bank_number_scan([ACCOUNT], admin_pages=False) == []


@pytest.mark.parametrize(
    "bad_member",
    [
        '"message": "acct \\u0000"',  # a NUL PostgreSQL cannot hold
        '"message": "\\ud800"',  # an unpaired surrogate
        '"amount": 1' + "0" * 400,  # a number out of range
        '"amount": NaN',
        '"amount": "1.00", "amount": "2.00"',  # a duplicate key
        '"deep": ' + "[" * 40 + "]" * 40,  # nested too deep
    ],
)
def test_one_event_whose_json_cannot_be_taken_is_refused_alone_and_the_page_applied(
    sqs_queues,
    scripted,  # noqa: F811
    bad_member,
):
    import json

    stuck, after = (PaymentFactory(state=PaymentState.SUBMITTED) for _ in range(2))
    bad = json.dumps(event(stuck, "settled"))[:-1] + ", " + bad_member + "}"
    good = json.dumps(event(after, "settled"))
    body = f'{{"data": [{bad}, {good}], "next_cursor": "c1", "has_more": false}}'.encode()
    scripted(lambda a, limit: (200, body, 0.0))

    result = processor_events_pull()

    assert (result.outcome, result.new, result.malformed) == ("done", 1, 1)
    assert stored_cursor() == "c1"
    run_worker()
    after.refresh_from_db()
    assert after.state == PaymentState.CONFIRMED
    assert dead_letters_ingest() == 1
    dead = DeadLetter.objects.get()
    assert dead.payment_id == stuck.id and dead.last_error_class == "InvalidPulledEvent"
    assert any(
        word in dead.last_error_message
        for word in ("NUL", "surrogate", "out of range", "not a number", "more than once", "deeper")
    ), dead.last_error_message
