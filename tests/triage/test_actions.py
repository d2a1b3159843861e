"""Redrive, resolve, discard and hold release: through the worker and the local SQS server."""

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType

from callbacks import sqs
from callbacks.models import ParkedMessage, PaymentHold, QueueMessage, QueueMessageStatus
from payments.models import LedgerEntry, PaymentEvent, PaymentState, ProcessedEvent
from payments.services import payment_apply_event
from tests.factories import (
    DeadLetterFactory,
    ParkedMessageFactory,
    PaymentFactory,
    PaymentHoldFactory,
    QueueMessageFactory,
    processor_event,
)
from tests.triage.deadletters import (
    event_publish,
    operator,
    viewer,
    worker_run,
)
from triage import ingestion, services
from triage.exceptions import DeadLetterNotOpen, NotAllowed, NoteRequired, RedrivePublishFailed
from triage.models import DeadLetter, DeadLetterStatus, TriageAction


@pytest.fixture
def held(sqs_queues, fast_retries):
    """A pending payment whose "settled" event died (no valid transition from pending), with a
    late "submitted" and a resent "settled" parked behind it, ingested as a dead letter."""
    payment = PaymentFactory()
    dead_event, _ = event_publish(payment, "settled")
    submitted, _ = event_publish(payment, "submitted")
    settled_again, _ = event_publish(payment, "settled")
    worker_run()
    assert ingestion.dead_letters_ingest() == 1
    parked = list(ParkedMessage.objects.filter(payment_id=str(payment.id)))
    assert [p.body["event"]["processor_event_id"] for p in parked] == [
        submitted.processor_event_id,
        settled_again.processor_event_id,
    ]
    return {
        "payment": payment,
        "dead_letter": DeadLetter.objects.get(group_id=str(payment.id)),
        "dead_event": dead_event,
        "parked_events": [submitted, settled_again],
    }


def processor_event_ids(payment) -> list[str]:
    return list(
        PaymentEvent.objects.filter(payment=payment, kind="processor_event")
        .order_by("created_at", "id")
        .values_list("processor_event_id", flat=True)
    )


@pytest.mark.django_db(transaction=True)
def test_redrive_publishes_once_and_parked_messages_apply_after_it_in_order(held):
    payment, dead_letter = held["payment"], held["dead_letter"]
    # Fixed elsewhere: the processor's status check shows the debit was submitted.
    reconciliation = processor_event(payment, "submitted")
    payment_apply_event(event=reconciliation, caused_by="reconciliation")
    user = operator()

    result = services.dead_letter_redrive(dead_letter=dead_letter, user=user, note="INC-42")

    assert result.dead_letter.status == DeadLetterStatus.REDRIVEN
    assert result.released == 2
    assert not PaymentHold.objects.filter(payment_id=str(payment.id), released_at=None).exists()
    with pytest.raises(DeadLetterNotOpen, match="not open"):
        services.dead_letter_redrive(dead_letter=dead_letter, user=user, note="again")

    worker_run()

    payment.refresh_from_db()
    assert payment.state == PaymentState.CONFIRMED
    assert LedgerEntry.objects.filter(payment=payment).count() == 1
    redriven = QueueMessage.objects.filter(
        body__redrive__original_message_id=dead_letter.original_message_id
    )
    assert [m.message_id for m in redriven] == [result.dead_letter.redrive_message_id]
    assert redriven[0].status == QueueMessageStatus.DONE
    assert processor_event_ids(payment) == [
        reconciliation.processor_event_id,
        held["dead_event"].processor_event_id,
        *[e.processor_event_id for e in held["parked_events"]],
    ]
    outcomes = list(
        PaymentEvent.objects.filter(payment=payment, kind="processor_event")
        .order_by("created_at", "id")
        .values_list("outcome", flat=True)
    )
    assert outcomes == ["applied", "applied", "stale", "stale"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("action", ["resolve", "discard"])
def test_resolve_and_discard_release_the_hold_without_applying_the_dead_message(held, action):
    payment, dead_letter = held["payment"], held["dead_letter"]

    result = services.ACTIONS[action](dead_letter=dead_letter, user=operator(), note="checked")

    assert result.dead_letter.status == {"resolve": "resolved", "discard": "discarded"}[action]
    assert result.released == 2
    assert result.dead_letter.redrive_message_id == ""
    worker_run()
    payment.refresh_from_db()
    # The parked "submitted" then "settled" apply; the dead "settled" never does.
    assert payment.state == PaymentState.CONFIRMED
    assert processor_event_ids(payment) == [e.processor_event_id for e in held["parked_events"]]
    assert not ProcessedEvent.objects.filter(pk=held["dead_event"].processor_event_id).exists()


@pytest.mark.django_db
@pytest.mark.parametrize("action", ["redrive", "resolve", "discard"])
def test_every_action_leaves_an_audit_row_and_a_log_entry(sqs_queues, action):
    dead_letter = DeadLetterFactory(payment=PaymentFactory())
    user = operator()

    services.ACTIONS[action](dead_letter=dead_letter, user=user, note="  ticket OPS-7  ")

    audit = TriageAction.objects.get(dead_letter=dead_letter, action=action)
    expected = {"redrive": "redriven", "resolve": "resolved", "discard": "discarded"}[action]
    assert (audit.user, audit.note, audit.status_before, audit.status_after) == (
        user,
        "ticket OPS-7",
        "open",
        expected,
    )
    assert audit.created_at is not None
    entry = LogEntry.objects.get(
        content_type=ContentType.objects.get_for_model(DeadLetter), object_id=str(dead_letter.pk)
    )
    assert (entry.user, entry.action_flag) == (user, CHANGE)
    assert entry.change_message == f"{action}: ticket OPS-7"
    dead_letter.refresh_from_db()
    assert dead_letter.status == expected


@pytest.mark.django_db
@pytest.mark.parametrize("action", ["redrive", "resolve", "discard"])
@pytest.mark.parametrize("note", ["", "   ", None])
def test_a_missing_note_is_refused_and_nothing_changes(action, note):
    dead_letter = DeadLetterFactory()
    with pytest.raises(NoteRequired, match="A note is required"):
        services.ACTIONS[action](dead_letter=dead_letter, user=operator(), note=note)
    dead_letter.refresh_from_db()
    assert dead_letter.status == DeadLetterStatus.OPEN
    assert not TriageAction.objects.exists() and not LogEntry.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("action", ["redrive", "resolve", "discard"])
def test_a_user_without_the_act_permission_is_refused(action):
    dead_letter = DeadLetterFactory()
    with pytest.raises(NotAllowed, match="act_on_deadletter"):
        services.ACTIONS[action](dead_letter=dead_letter, user=viewer(), note="n")
    dead_letter.refresh_from_db()
    assert dead_letter.status == DeadLetterStatus.OPEN


@pytest.mark.django_db
@pytest.mark.parametrize("action", ["redrive", "resolve", "discard"])
def test_only_open_dead_letters_can_be_acted_on(action):
    dead_letter = DeadLetterFactory(status=DeadLetterStatus.RESOLVED)
    with pytest.raises(DeadLetterNotOpen, match="is resolved, not open"):
        services.ACTIONS[action](dead_letter=dead_letter, user=operator(), note="n")
    assert not TriageAction.objects.exists()


@pytest.mark.django_db
def test_redrive_while_the_queue_is_down_changes_nothing_and_records_the_attempt(module_settings):
    dead_letter = DeadLetterFactory()
    module_settings.SQS_ENDPOINT_URL = "http://127.0.0.1:9"
    sqs.reset()
    try:
        with pytest.raises(RedrivePublishFailed, match="still open"):
            services.dead_letter_redrive(dead_letter=dead_letter, user=operator(), note="try")
    finally:
        sqs.reset()
    dead_letter.refresh_from_db()
    assert dead_letter.status == DeadLetterStatus.OPEN and dead_letter.redrive_message_id == ""
    audit = TriageAction.objects.get()
    assert (audit.status_before, audit.status_after) == ("open", "open")
    assert audit.details["outcome"] == "publish_failed" and audit.details["error"]


@pytest.mark.django_db
def test_a_body_that_was_not_json_cannot_be_redriven():
    dead_letter = DeadLetterFactory(body={"raw_body": "<garbage>"})
    with pytest.raises(services.TriageError, match="no JSON body"):
        services.dead_letter_redrive(dead_letter=dead_letter, user=operator(), note="n")


def _hold_with_parked(group: str, count: int) -> PaymentHold:
    hold = PaymentHoldFactory(payment_id=group)
    for i in range(count):
        ParkedMessageFactory(
            hold=hold,
            message_id=f"{group}-parked-{i}",
            sequence_number=str(i + 1).zfill(40),
            kind="processor_event",
            body={"kind": "processor_event", "n": i},
        )
    return hold


@pytest.mark.django_db
def test_the_hold_stays_until_the_payments_last_open_dead_letter_is_handled(sqs_queues):
    payment = PaymentFactory()
    first, second = DeadLetterFactory(payment=payment), DeadLetterFactory(payment=payment)
    hold = _hold_with_parked(str(payment.id), 2)
    user = operator()

    result = services.dead_letter_resolve(dead_letter=first, user=user, note="n")
    assert result.released is None
    assert f"dead letter {second.pk} is still open" in result.release_note
    hold.refresh_from_db()
    assert hold.released_at is None

    result = services.dead_letter_discard(dead_letter=second, user=user, note="n")
    assert result.released == 2
    hold.refresh_from_db()
    assert hold.released_at is not None and hold.released_by == user.username
    release = TriageAction.objects.get(action="release_hold")
    assert release.details == {"outcome": "released", "hold_id": hold.pk, "republished": 2}


@pytest.mark.django_db
def test_the_hold_stays_while_a_dead_lettered_message_is_not_ingested_yet(sqs_queues):
    payment = PaymentFactory()
    dead_letter = DeadLetterFactory(payment=payment)
    _hold_with_parked(str(payment.id), 1)
    QueueMessageFactory(
        message_id="still-in-the-dlq",
        group_id=str(payment.id),
        attempts=6,
        status=QueueMessageStatus.DEAD_LETTERED,
    )
    result = services.dead_letter_resolve(dead_letter=dead_letter, user=operator(), note="n")
    assert result.released is None
    assert "still-in-the-dlq was dead-lettered but is not ingested" in result.release_note


@pytest.mark.django_db
def test_a_failed_release_is_recorded_and_can_be_retried(sqs_queues, module_settings):
    payment = PaymentFactory()
    dead_letter = DeadLetterFactory(payment=payment)
    hold = _hold_with_parked(str(payment.id), 1)
    user = operator()
    endpoint = module_settings.SQS_ENDPOINT_URL
    module_settings.SQS_ENDPOINT_URL = "http://127.0.0.1:9"
    sqs.reset()
    result = services.dead_letter_resolve(dead_letter=dead_letter, user=user, note="n")
    assert result.release_failed and "stay parked" in result.release_note
    assert TriageAction.objects.get(action="release_hold").details["outcome"] == "release_failed"
    hold.refresh_from_db()
    assert hold.released_at is None

    module_settings.SQS_ENDPOINT_URL = endpoint
    sqs.reset()
    assert services.dead_letter_hold_release(dead_letter=dead_letter, user=user, note="retry") == 1
    hold.refresh_from_db()
    assert hold.released_at is not None


@pytest.mark.django_db
def test_bulk_acts_on_exactly_the_given_ids_and_reports_refusals():
    kept = DeadLetterFactory()
    targets = [DeadLetterFactory(), DeadLetterFactory()]
    closed = DeadLetterFactory(status=DeadLetterStatus.DISCARDED)
    result = services.dead_letters_act(
        action="resolve",
        dead_letter_ids=[t.pk for t in targets] + [closed.pk, 999999],
        user=operator(),
        note="bulk",
    )
    assert sorted(r.dead_letter.pk for r in result.done) == sorted(t.pk for t in targets)
    assert [pk for pk, _ in result.refused] == [closed.pk, 999999]
    kept.refresh_from_db()
    assert kept.status == DeadLetterStatus.OPEN


def _main_queue_messages(queues) -> list[dict]:
    import json

    found = []
    while True:
        got = queues.client.receive_message(
            QueueUrl=queues.url, MaxNumberOfMessages=10, WaitTimeSeconds=0, VisibilityTimeout=30
        ).get("Messages")
        if not got:
            return found
        found += [json.loads(m["Body"]) for m in got]


@pytest.mark.django_db
def test_two_operators_redriving_at_once_publish_one_message(sqs_queues, monkeypatch):
    dead_letter = DeadLetterFactory()
    first, second = operator(), operator()
    real_republish = services.message_republish

    def republish_while_the_other_operator_finishes(**kwargs):
        message_id = real_republish(**kwargs)
        monkeypatch.setattr(services, "message_republish", real_republish)
        services.dead_letter_redrive(dead_letter=dead_letter, user=first, note="first")
        return message_id

    monkeypatch.setattr(services, "message_republish", republish_while_the_other_operator_finishes)
    with pytest.raises(DeadLetterNotOpen, match="redriven by someone else"):
        services.dead_letter_redrive(dead_letter=dead_letter, user=second, note="second")

    assert len(_main_queue_messages(sqs_queues)) == 1
    late = TriageAction.objects.get(user=second)
    assert late.details["outcome"] == "deduplicated_concurrent_redrive"
    assert TriageAction.objects.get(user=first).status_after == "redriven"


@pytest.mark.django_db
def test_a_redrive_that_loses_the_race_to_a_resolve_is_recorded_and_reported(
    sqs_queues, monkeypatch
):
    dead_letter = DeadLetterFactory()
    real_republish = services.message_republish

    def republish_while_someone_resolves(**kwargs):
        message_id = real_republish(**kwargs)
        services.dead_letter_resolve(dead_letter=dead_letter, user=operator(), note="fixed")
        return message_id

    monkeypatch.setattr(services, "message_republish", republish_while_someone_resolves)
    user = operator()
    with pytest.raises(DeadLetterNotOpen, match="was sent anyway"):
        services.dead_letter_redrive(dead_letter=dead_letter, user=user, note="redrive")

    dead_letter.refresh_from_db()
    assert dead_letter.status == DeadLetterStatus.RESOLVED
    audit = TriageAction.objects.get(user=user)
    assert audit.details["outcome"] == "published_after_concurrent_action"
    assert audit.details["redrive_message_id"]
    assert len(_main_queue_messages(sqs_queues)) == 1
