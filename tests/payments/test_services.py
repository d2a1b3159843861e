from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError
from django.db import DataError, transaction
from django_fsm import TransitionNotAllowed

from payments.exceptions import AmountMismatch, EventConflict, InvalidTransition, PaymentNotFound
from payments.models import (
    EventOutcome,
    LedgerEntry,
    MerchantReturnDay,
    OutboxMessage,
    Payment,
    PaymentEvent,
    PaymentState,
    ProcessedEvent,
)
from payments.selectors import merchant_balance
from payments.services import payment_apply_event, payment_create, processed_events_purge
from tests.factories import PaymentFactory, processor_event
from tests.history import history_rewritten
from tests.waiting import race_in_order

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("event_write_path")]


def _create(**overrides) -> Payment:
    fields = {"merchant_id": "m-1", "amount": Decimal("10.50"), "source_token": "tok_abcdef12"}
    fields.update(overrides)
    return payment_create(**fields)


def test_payment_create_writes_pending_payment_event_and_outbox_row_together():
    payment = _create()

    assert payment.state == PaymentState.PENDING
    assert payment.idempotency_key is not None
    outbox = OutboxMessage.objects.get()
    assert outbox.kind == "submit_payment"
    assert outbox.group_id == str(payment.id)
    assert outbox.body == {"kind": "submit_payment", "payment_id": str(payment.id)}
    assert payment.events.get().kind == "created"


@pytest.mark.django_db(transaction=True)
def test_payment_create_rolls_back_everything_when_the_outbox_write_fails(monkeypatch):
    # A kind longer than its column: PostgreSQL refuses the outbox row, written last. Called
    # outside a transaction, as a task or a command calls it: the create's own rolls back.
    monkeypatch.setattr("payments.services.create.SUBMIT_PAYMENT", "x" * 33)
    with pytest.raises(DataError):
        _create()

    assert Payment.objects.count() == 0
    assert PaymentEvent.objects.count() == 0


def test_a_create_in_the_callers_transaction_rolls_back_with_it_when_a_write_fails(monkeypatch):
    # Inside the caller's transaction (the API's) the create adds no savepoint: a refused
    # write fails the caller's transaction, which rolls back whole, the create's rows with it.
    monkeypatch.setattr("payments.services.create.SUBMIT_PAYMENT", "x" * 33)
    with pytest.raises(DataError), transaction.atomic():
        PaymentFactory(merchant_id="m-before")
        _create()

    assert Payment.objects.count() == 0
    assert PaymentEvent.objects.count() == 0


def test_payment_create_rejects_a_raw_account_number_as_source_token():
    with pytest.raises(ValidationError, match="raw bank account"):
        _create(source_token="021000021")
    assert Payment.objects.count() == 0


def test_payment_create_rejects_other_currencies_and_non_positive_amounts():
    with pytest.raises(ValidationError, match="currency"):
        _create(currency="EUR")
    with pytest.raises(ValidationError, match="greater than zero"):
        _create(amount=Decimal("0"))


def test_idempotency_key_is_unique_per_payment_and_never_changes_on_save():
    a, b = _create(), _create()
    key = a.idempotency_key
    a.description = "changed"
    a.save()
    a.refresh_from_db()

    assert a.idempotency_key == key
    assert a.idempotency_key != b.idempotency_key


@pytest.mark.parametrize(
    ("start", "event_type", "end"),
    [
        ("pending", "submitted", "submitted"),
        ("submitted", "settled", "confirmed"),
        ("submitted", "failed", "failed"),
        ("submitted", "returned", "failed"),
        ("confirmed", "returned", "returned"),
    ],
)
def test_each_valid_event_applies_its_transition(start, event_type, end):
    payment = PaymentFactory(state=start)

    result = payment_apply_event(event=processor_event(payment, event_type))

    payment.refresh_from_db()
    assert result.outcome == EventOutcome.APPLIED
    assert (result.from_state, result.to_state) == (start, end)
    assert payment.state == end
    log = payment.events.get()
    assert (log.outcome, log.from_state, log.to_state) == ("applied", start, end)


def test_state_field_is_protected_from_direct_assignment():
    payment = PaymentFactory()
    with pytest.raises(AttributeError):
        payment.state = PaymentState.CONFIRMED


def test_model_has_no_transition_from_pending_to_confirmed():
    payment = PaymentFactory()
    with pytest.raises(TransitionNotAllowed):
        payment.confirm()
    assert payment.state == PaymentState.PENDING


@pytest.mark.parametrize(
    ("start", "event_type"),
    [
        ("pending", "settled"),
        ("pending", "failed"),
        ("pending", "returned"),
        ("confirmed", "failed"),
        ("failed", "settled"),
    ],
)
def test_event_without_valid_transition_raises_and_changes_nothing(start, event_type):
    payment = PaymentFactory(state=start)
    event = processor_event(payment, event_type)

    with pytest.raises(InvalidTransition):
        payment_apply_event(event=event)

    payment.refresh_from_db()
    assert payment.state == start
    assert not ProcessedEvent.objects.exists()
    assert not LedgerEntry.objects.exists()
    assert not PaymentEvent.objects.exists()


@pytest.mark.parametrize(
    ("start", "event_type"),
    [
        ("submitted", "submitted"),
        ("confirmed", "settled"),
        ("confirmed", "submitted"),
        ("failed", "failed"),
        ("failed", "submitted"),
        # ("failed", "returned") is a return after failure: recorded, not stale (test_returns).
    ],
)
def test_stale_event_is_logged_as_stale_and_changes_nothing(start, event_type):
    payment = PaymentFactory(state=start)

    result = payment_apply_event(event=processor_event(payment, event_type))

    payment.refresh_from_db()
    assert result.outcome == EventOutcome.STALE
    assert payment.state == start
    assert payment.events.get().outcome == "stale"
    assert not LedgerEntry.objects.exists()


def test_repeated_event_is_a_logged_duplicate_and_credits_once():
    payment = PaymentFactory(state="submitted")
    event = processor_event(payment, "settled")

    first = payment_apply_event(event=event)
    second = payment_apply_event(event=event)

    assert (first.outcome, second.outcome) == ("applied", "duplicate")
    assert LedgerEntry.objects.filter(payment=payment).count() == 1
    assert list(payment.events.values_list("outcome", flat=True)) == ["applied", "duplicate"]


def test_repeated_event_id_with_another_payload_is_a_conflict_not_a_duplicate():
    payment = PaymentFactory(state="submitted")
    event = processor_event(payment, "submitted", processor_event_id="evt_same")
    payment_apply_event(event=processor_event(payment, "settled", processor_event_id="evt_same"))

    with pytest.raises(EventConflict, match="evt_same"):
        payment_apply_event(event=event)
    assert payment.events.count() == 1


def test_an_id_claimed_for_another_payment_moves_nothing_of_this_one():
    """The state machine moves the payment in memory before the claim; the claim finds the id
    taken, so nothing is written, and the payment in hand is back in its stored state."""
    first = PaymentFactory(state="submitted", merchant_id="m-1")
    other = PaymentFactory(state="submitted", merchant_id="m-2")
    payment_apply_event(event=processor_event(first, "settled", processor_event_id="evt_x"))
    before = (other.state, other.state_changed_at, other.updated_at)

    with pytest.raises(EventConflict, match=f"for payment {first.id}"):
        payment_apply_event(event=processor_event(other, "settled", processor_event_id="evt_x"))

    other.refresh_from_db()
    assert (other.state, other.state_changed_at, other.updated_at) == before
    assert not LedgerEntry.objects.filter(payment=other).exists()
    assert not other.events.filter(kind="processor_event").exists()
    assert not MerchantReturnDay.objects.filter(merchant_id="m-2").exists()
    assert ProcessedEvent.objects.get(pk="evt_x").payment_id == first.id


def test_the_dedup_claim_governs_every_other_write():
    """A dedup record already there means nothing else is written, even when the payment is
    still where the event would move it from (here the record is planted by hand): the event
    is a duplicate, the payment stays, no credit, no counter, one duplicate log row."""
    payment = PaymentFactory(state="submitted", merchant_id="m-3")
    event = processor_event(payment, "settled")
    ProcessedEvent.objects.create(
        processor_event_id=event.processor_event_id,
        payment=payment,
        event_type="settled",
        payload_hash=event.fingerprint,
        outcome="applied",
    )

    result = payment_apply_event(event=event)

    assert (result.outcome, result.payment.state) == ("duplicate", "submitted")
    payment.refresh_from_db()
    assert payment.state == "submitted"
    assert not LedgerEntry.objects.filter(payment=payment).exists()
    assert not MerchantReturnDay.objects.filter(merchant_id="m-3").exists()
    assert list(payment.events.values_list("outcome", flat=True)) == ["duplicate"]


def test_a_known_id_is_a_conflict_even_when_the_event_would_be_refused():
    """Whether an id was seen before is judged first: another payload under a known id is a
    conflict, whatever else is wrong with it (here its amount too)."""
    first = PaymentFactory(state="submitted")
    other = PaymentFactory(state="submitted", amount=Decimal("5.00"))
    payment_apply_event(event=processor_event(first, "settled", processor_event_id="evt_y"))

    with pytest.raises(EventConflict, match="evt_y"):
        payment_apply_event(
            event=processor_event(
                other, "settled", processor_event_id="evt_y", amount=Decimal("6.00")
            )
        )


def test_event_for_another_amount_is_refused():
    payment = PaymentFactory(state="submitted")
    with pytest.raises(AmountMismatch):
        payment_apply_event(event=processor_event(payment, "settled", amount=Decimal("999.00")))
    payment.refresh_from_db()
    assert payment.state == "submitted"


def test_event_for_unknown_payment_raises_payment_not_found():
    payment = PaymentFactory.build()
    with pytest.raises(PaymentNotFound):
        payment_apply_event(event=processor_event(payment, "settled"))


def test_confirmation_credits_the_merchant_ledger_once():
    payment = PaymentFactory(state="submitted", merchant_id="m-9", amount=Decimal("40.10"))
    payment_apply_event(event=processor_event(payment, "settled"))
    payment_apply_event(event=processor_event(payment, "settled"))  # new id: stale

    assert merchant_balance(merchant_id="m-9")["balances"] == [
        {
            "currency": "USD",
            "credits": "40.10",
            "reversals": "0.00",
            "recredits": "0.00",
            "net": "40.10",
            "confirmed_count": 1,
            "returned_count": 0,
            "balance": "40.10",
            "entries": 1,
            "confirmed_total": "40.10",
            "returned_total": "0.00",
            "pending": "40.10",
            "posted": "40.10",
            # Settled on 2 November by the event's timestamp: past the return reserve.
            "available": "40.10",
            "money_out": "0.00",
        }
    ]


def test_ledger_unique_constraint_refuses_a_second_credit():
    from django.db import IntegrityError

    payment = PaymentFactory(state="confirmed")
    LedgerEntry.objects.create(
        payment=payment, merchant_id="m", kind="credit", amount=1, currency="USD"
    )
    with pytest.raises(IntegrityError), transaction.atomic():
        LedgerEntry.objects.create(
            payment=payment, merchant_id="m", kind="credit", amount=1, currency="USD"
        )


def test_purge_removes_only_dedup_records_past_retention():
    from datetime import timedelta

    from django.utils import timezone

    payment = PaymentFactory(state="submitted")
    payment_apply_event(event=processor_event(payment, "settled", processor_event_id="old"))
    payment_apply_event(event=processor_event(payment, "settled", processor_event_id="new"))
    with history_rewritten():  # a record a month old
        ProcessedEvent.objects.filter(pk="old").update(
            processed_at=timezone.now() - timedelta(days=31)
        )

    assert processed_events_purge() == 1
    assert list(ProcessedEvent.objects.values_list("pk", flat=True)) == ["new"]


def _race_in_order(payment: Payment, *calls):
    """The calls forced to queue on the payment's row lock, in order (``race_in_order``)."""
    return race_in_order(lambda: Payment.objects.select_for_update().get(pk=payment.pk), *calls)


@pytest.mark.django_db(transaction=True)
def test_two_threads_applying_the_same_settled_event_make_one_transition_and_one_credit():
    payment = PaymentFactory(state="submitted")
    event = processor_event(payment, "settled")

    first, second = _race_in_order(
        payment, lambda: payment_apply_event(event=event), lambda: payment_apply_event(event=event)
    )

    assert first.outcome == EventOutcome.APPLIED
    assert second.outcome == EventOutcome.DUPLICATE
    assert (second.from_state, second.to_state) == ("confirmed", "confirmed")
    assert LedgerEntry.objects.filter(payment=payment).count() == 1
    assert PaymentEvent.objects.filter(payment=payment, outcome="applied").count() == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("winner", "loser", "end", "credits"),
    [("settled", "failed", "confirmed", 1), ("failed", "settled", "failed", 0)],
)
def test_two_threads_applying_different_final_events_leave_one_transition(
    winner, loser, end, credits
):
    payment = PaymentFactory(state="submitted")

    first, second = _race_in_order(
        payment,
        lambda: payment_apply_event(event=processor_event(payment, winner)),
        lambda: payment_apply_event(event=processor_event(payment, loser)),
    )

    payment.refresh_from_db()
    assert first.outcome == EventOutcome.APPLIED
    assert (first.from_state, first.to_state) == ("submitted", end)
    # The loser read the state the winner committed: a final state it has no transition from.
    assert isinstance(second, InvalidTransition), second
    assert f"from {end} to" in str(second)
    assert payment.state == end
    assert PaymentEvent.objects.filter(payment=payment, outcome="applied").count() == 1
    assert PaymentEvent.objects.filter(payment=payment).count() == 1  # the loser wrote nothing
    assert LedgerEntry.objects.filter(payment=payment).count() == credits


@pytest.mark.django_db(transaction=True)
def test_a_stale_event_losing_the_race_is_logged_stale_behind_the_winner():
    payment = PaymentFactory(state="pending")

    first, second = _race_in_order(
        payment,
        lambda: payment_apply_event(event=processor_event(payment, "submitted")),
        lambda: payment_apply_event(event=processor_event(payment, "submitted")),
    )

    assert first.outcome == EventOutcome.APPLIED
    assert second.outcome == EventOutcome.STALE
    assert (second.from_state, second.to_state) == ("submitted", "submitted")
    payment.refresh_from_db()
    assert payment.state == "submitted"


def test_a_settlement_pulled_back_after_the_return_it_preceded_ends_returned():
    """The processor settled, then returned; the settlement's callback was lost, the return
    failed the payment, and the pull brings the settlement back: the payment follows the
    processor's history (settled, then returned), with the credit and its reversal once each."""
    from datetime import timedelta

    from payments.models import PaymentReturn

    payment = PaymentFactory(state="submitted", amount=Decimal("12.00"))
    settled = processor_event(payment, "settled")
    returned = processor_event(
        payment, "returned", reason_code="R01", timestamp=settled.timestamp + timedelta(days=1)
    )
    payment_apply_event(event=returned)

    result = payment_apply_event(event=settled)

    assert result.outcome == "applied"
    assert (result.from_state, result.to_state) == ("failed", "returned")
    entries = {e.kind: e for e in LedgerEntry.objects.filter(payment=payment)}
    assert sorted(entries) == ["credit", "reversal"]
    assert entries["credit"].amount == Decimal("12.00")
    assert entries["credit"].posted_at == settled.timestamp
    assert entries["reversal"].amount == Decimal("-12.00")
    assert entries["reversal"].posted_at == returned.timestamp
    record = PaymentReturn.objects.get(payment=payment)
    assert record.after_settlement and record.settled_at == settled.timestamp
    assert record.deadline is not None and not record.late
    assert merchant_balance(merchant_id=payment.merchant_id)["balances"][0]["net"] == "0.00"
    # Delivered again, it is a duplicate; another settlement id is stale: nothing twice.
    assert payment_apply_event(event=settled).outcome == "duplicate"
    again = processor_event(payment, "settled", timestamp=settled.timestamp)
    assert payment_apply_event(event=again).outcome == "stale"
    assert LedgerEntry.objects.filter(payment=payment).count() == 2


def test_a_settlement_after_the_return_it_failed_by_is_refused():
    """A settlement the processor made after the return is a conflict, not history."""
    from datetime import timedelta

    payment = PaymentFactory(state="submitted")
    returned = processor_event(payment, "returned", reason_code="R01")
    payment_apply_event(event=returned)
    later = processor_event(payment, "settled", timestamp=returned.timestamp + timedelta(days=1))

    with pytest.raises(InvalidTransition):
        payment_apply_event(event=later)

    payment.refresh_from_db()
    assert payment.state == "failed"
    assert not LedgerEntry.objects.filter(payment=payment).exists()


def test_a_settlement_of_a_payment_failed_without_a_return_is_refused():
    payment = PaymentFactory(state="submitted")
    payment_apply_event(event=processor_event(payment, "failed"))

    with pytest.raises(InvalidTransition):
        payment_apply_event(event=processor_event(payment, "settled"))

    payment.refresh_from_db()
    assert payment.state == "failed"
