"""Fields of the payment an event restates (amount, currency, direction, processor id) are
compared with the payment's before anything is written, on both write paths: a difference is a
mismatch for a human, never applied, never credited."""

import hashlib
import json
from decimal import Decimal

import pytest

from payments.events import RESTATED_FIELDS
from payments.exceptions import (
    AmountMismatch,
    CurrencyMismatch,
    DirectionMismatch,
    EventConflict,
    EventMismatch,
    ProcessorIdMismatch,
)
from payments.models import (
    LedgerEntry,
    MerchantReturnDay,
    PaymentEvent,
    PaymentReturn,
    PaymentState,
    ProcessedEvent,
)
from payments.services import payment_apply_event
from tests.factories import PaymentFactory, processor_event

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("event_write_path")]

# One mismatching value per restated field, and the error each one raises.
MISMATCHES = {
    "amount": (Decimal("125.01"), AmountMismatch),
    "currency": ("EUR", CurrencyMismatch),
    "direction": ("credit", DirectionMismatch),
    "processor_id": ("pr_someone_elses_debit", ProcessorIdMismatch),
}


def _payment(state=PaymentState.SUBMITTED, **fields):
    return PaymentFactory(state=state, processor_id="pr_ours_0001", **fields)


def _nothing_written(payment, state) -> None:
    payment.refresh_from_db()
    assert payment.state == state
    assert not ProcessedEvent.objects.filter(payment=payment).exists()
    assert not LedgerEntry.objects.filter(payment=payment).exists()
    assert not PaymentEvent.objects.filter(payment=payment).exists()
    assert not PaymentReturn.objects.filter(payment=payment).exists()
    assert not MerchantReturnDay.objects.filter(merchant_id=payment.merchant_id).exists()


def test_every_restated_field_has_a_mismatch_case():
    assert set(MISMATCHES) == set(RESTATED_FIELDS)


@pytest.mark.parametrize("field", sorted(MISMATCHES))
@pytest.mark.parametrize("event_type", ["settled", "failed", "returned"])
def test_a_restated_field_with_another_value_is_refused_and_writes_nothing(field, event_type):
    value, error = MISMATCHES[field]
    payment = _payment()

    with pytest.raises(error) as raised:
        payment_apply_event(event=processor_event(payment, event_type, **{field: value}))

    assert isinstance(raised.value, EventMismatch) and not raised.value.retryable
    assert str(value) in str(raised.value)
    _nothing_written(payment, PaymentState.SUBMITTED)


@pytest.mark.parametrize("field", sorted(MISMATCHES))
def test_a_mismatch_is_refused_even_where_the_event_would_be_stale(field):
    """A stale event changes nothing, but a wrong currency says the processor's books disagree
    with ours: a human hears of it all the same."""
    value, error = MISMATCHES[field]
    payment = _payment(state=PaymentState.CONFIRMED)

    with pytest.raises(error):
        payment_apply_event(event=processor_event(payment, "submitted", **{field: value}))

    assert not PaymentEvent.objects.filter(payment=payment).exists()


def test_a_settled_event_in_euros_for_a_dollar_payment_credits_nothing():
    payment = _payment(amount=Decimal("10.00"), currency="USD")

    with pytest.raises(CurrencyMismatch, match="EUR.*USD"):
        payment_apply_event(event=processor_event(payment, "settled", currency="EUR"))

    _nothing_written(payment, PaymentState.SUBMITTED)


def test_restating_the_payments_own_values_applies_the_event():
    payment = _payment(currency="USD")

    result = payment_apply_event(
        event=processor_event(
            payment, "settled", currency="USD", direction="debit", processor_id="pr_ours_0001"
        )
    )

    assert result.outcome == "applied"
    assert LedgerEntry.objects.get(payment=payment).amount == payment.amount


def test_a_processor_id_is_not_compared_before_the_payment_has_one():
    """The callback can overtake our record of the submission's answer: there is nothing to
    compare with yet, and an event never sets the id (only the processor's answer to us does)."""
    payment = PaymentFactory(state=PaymentState.SUBMITTED, processor_id="")

    result = payment_apply_event(
        event=processor_event(payment, "settled", processor_id="pr_not_known_yet")
    )

    assert result.outcome == "applied"
    payment.refresh_from_db()
    assert payment.processor_id == ""


def test_a_resend_under_the_same_id_in_another_currency_is_a_conflict():
    payment = _payment()
    first = processor_event(payment, "settled", currency="USD")
    payment_apply_event(event=first)

    with pytest.raises(EventConflict):
        payment_apply_event(
            event=processor_event(
                payment, "settled", currency="EUR", processor_event_id=first.processor_event_id
            )
        )
    assert payment_apply_event(event=first).outcome == "duplicate"
    assert LedgerEntry.objects.filter(payment=payment).count() == 1


def test_an_event_without_the_optional_fields_keeps_its_old_fingerprint():
    """Dedup records written before the fields existed still recognise their repeats."""
    payment = _payment()
    plain = processor_event(payment, "settled")
    stated = processor_event(
        payment, "settled", currency="USD", processor_event_id=plain.processor_event_id
    )

    assert "currency" not in plain.as_payload()
    assert stated.as_payload()["currency"] == "USD"
    assert plain.fingerprint != stated.fingerprint
    before = json.dumps(  # the canonical form before the optional fields existed
        {
            "payment_id": str(payment.id),
            "event_type": "settled",
            "amount": f"{payment.amount:.2f}",
            "timestamp": plain.timestamp.isoformat(),
            "reason_code": "",
        },
        sort_keys=True,
    )
    assert plain.fingerprint == hashlib.sha256(before.encode()).hexdigest()
