"""ACH returns: the returned state, the ledger reversal, reason codes, late and unknown flags."""

import threading
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone
from django_fsm import TransitionNotAllowed

from payments.banking_days import ACH_TIME_ZONE
from payments.exceptions import EventConflict
from payments.models import (
    EventOutcome,
    LedgerEntry,
    MerchantReturnDay,
    Payment,
    PaymentEvent,
    PaymentReturn,
    PaymentState,
)
from payments.return_codes import (
    RETURN_CODES,
    ReturnCategory,
    add_banking_days,
    return_code_get,
    return_code_label,
)
from payments.selectors import merchant_balance
from payments.services import payment_apply_event, payment_transition
from tests.factories import PaymentFactory, processor_event
from tests.waiting import backend_pid, race, wait_for, waits_on_a_lock
from triage.models import Alert, AlertStatus

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("event_write_path")]

NOW = datetime(2026, 11, 30, 15, 0, tzinfo=UTC)  # a Monday


def _settled(merchant: str = "m-1", amount: str = "40.00", **fields) -> Payment:
    """A payment that went through submitted -> confirmed, with its credit."""
    payment = PaymentFactory(
        state=PaymentState.SUBMITTED, merchant_id=merchant, amount=Decimal(amount), **fields
    )
    payment_apply_event(event=processor_event(payment, "settled"))
    payment.refresh_from_db()
    return payment


def _settled_at(payment: Payment, moment: datetime) -> None:
    Payment.objects.filter(pk=payment.pk).update(state_changed_at=moment)


# --- the table of codes ----------------------------------------------------------------------


def test_the_table_holds_the_defined_codes_from_r01_to_r85_with_their_categories():
    assert "R01" in RETURN_CODES and "R85" in RETURN_CODES
    assert len(RETURN_CODES) == 70
    assert all(code.startswith("R") and 1 <= int(code[1:]) <= 85 for code in RETURN_CODES)
    by_category = {
        c: {r.code for r in RETURN_CODES.values() if r.category == c} for c in ReturnCategory
    }
    assert by_category[ReturnCategory.UNAUTHORIZED] == {"R05", "R07", "R10", "R11", "R29", "R51"}
    assert by_category[ReturnCategory.ADMINISTRATIVE] == {"R02", "R03", "R04"}
    assert by_category[ReturnCategory.NSF] == {"R01", "R09"}
    assert RETURN_CODES["R10"].time_frame == "60 calendar days"
    assert RETURN_CODES["R01"].time_frame == "2 banking days"
    assert RETURN_CODES["R01"].title == "Insufficient Funds"


def test_codes_are_looked_up_case_insensitively_and_unknown_ones_are_labelled_as_such():
    assert return_code_get(" r01 ").code == "R01"
    assert return_code_get("R99") is None
    assert return_code_get("") is None
    assert return_code_label("R02") == "R02 Account Closed"
    assert return_code_label("R99") == "R99 (unknown code)"


def test_banking_days_skip_the_weekend_and_end_at_the_end_of_the_day():
    friday = datetime(2026, 11, 27, 10, 0, tzinfo=UTC)
    assert add_banking_days(friday, 2) == datetime(
        2026, 12, 1, 23, 59, 59, 999999, tzinfo=ACH_TIME_ZONE
    )
    saturday = datetime(2026, 11, 28, 10, 0, tzinfo=UTC)
    assert add_banking_days(saturday, 1).date() == datetime(2026, 11, 30).date()


# --- the transition and the reversal ---------------------------------------------------------


def test_a_return_after_settlement_moves_to_returned_and_reverses_the_credit_once():
    payment = _settled(amount="40.00")

    result = payment_apply_event(
        event=processor_event(payment, "returned", reason_code="R01", timestamp=timezone.now())
    )

    payment.refresh_from_db()
    assert result.outcome == EventOutcome.APPLIED
    assert (result.from_state, result.to_state) == ("confirmed", "returned")
    assert payment.state == PaymentState.RETURNED
    entries = dict(LedgerEntry.objects.filter(payment=payment).values_list("kind", "amount"))
    assert entries == {"credit": Decimal("40.00"), "reversal": Decimal("-40.00")}
    record = PaymentReturn.objects.get(payment=payment)
    assert (record.reason_code, record.reason_title, record.category) == (
        "R01",
        "Insufficient Funds",
        "nsf",
    )
    assert record.after_settlement and not record.late and not record.unknown_code
    assert record.flags == []
    log = payment.events.filter(event_type="returned").get()
    assert (log.outcome, log.from_state, log.to_state) == ("applied", "confirmed", "returned")


def test_returned_is_final_and_only_reachable_from_confirmed():
    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    with pytest.raises(TransitionNotAllowed):
        payment.return_after_settlement()
    returned = PaymentFactory(state=PaymentState.CONFIRMED)
    returned.return_after_settlement()
    for name in ("submit", "confirm", "fail", "reject", "return_after_settlement"):
        with pytest.raises(TransitionNotAllowed):
            getattr(returned, name)()


@pytest.mark.django_db(transaction=True)
def test_the_return_waits_for_the_payments_row_lock_and_writes_nothing_before_it():
    payment = _settled()
    event = processor_event(payment, "returned", reason_code="R01", timestamp=timezone.now())
    locked, release, applied = threading.Event(), threading.Event(), threading.Event()
    errors: list = []
    pid: list[int] = []  # the applying thread's backend

    def hold_lock():
        try:
            with transaction.atomic():
                Payment.objects.select_for_update().get(pk=payment.pk)
                locked.set()
                release.wait(10)
        finally:
            connection.close()

    def apply():
        try:
            locked.wait(10)
            pid.append(backend_pid())
            payment_apply_event(event=event)
            applied.set()
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            errors.append(exc)
        finally:
            connection.close()

    holder, applier = threading.Thread(target=hold_lock), threading.Thread(target=apply)
    holder.start()
    applier.start()
    locked.wait(10)
    wait_for(lambda: pid and waits_on_a_lock(pid[0]), 10, "the return to wait on the row lock")
    # While another transaction holds the row, the return has neither moved nor written.
    assert not applied.is_set()
    assert not LedgerEntry.objects.filter(payment=payment, kind="reversal").exists()
    assert Payment.objects.get(pk=payment.pk).state == PaymentState.CONFIRMED
    release.set()
    holder.join(10)
    applier.join(10)

    assert errors == []
    assert applied.is_set()
    assert Payment.objects.get(pk=payment.pk).state == PaymentState.RETURNED
    assert LedgerEntry.objects.filter(payment=payment, kind="reversal").count() == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("attempt", range(3))
def test_two_threads_racing_a_return_and_its_duplicate_write_one_reversal(attempt):
    payment = _settled()
    event = processor_event(payment, "returned", reason_code="R10", timestamp=timezone.now())

    results = race(
        lambda: payment_apply_event(event=event), lambda: payment_apply_event(event=event)
    )

    assert sorted(r.outcome for r in results) == ["applied", "duplicate"]
    assert LedgerEntry.objects.filter(payment=payment, kind="reversal").count() == 1
    assert PaymentReturn.objects.filter(payment=payment).count() == 1
    assert PaymentEvent.objects.filter(payment=payment, event_type="returned").count() == 2
    day = MerchantReturnDay.objects.get(merchant_id=payment.merchant_id)
    assert (day.debits, day.returns, day.unauthorized_returns) == (1, 1, 1)


@pytest.mark.django_db(transaction=True)
def test_two_threads_racing_two_returns_with_different_ids_write_one_reversal():
    payment = _settled()

    results = race(
        lambda: payment_apply_event(event=processor_event(payment, "returned", reason_code="R01")),
        lambda: payment_apply_event(event=processor_event(payment, "returned", reason_code="R01")),
    )

    assert sorted(r.outcome for r in results) == ["applied", "stale"]
    assert LedgerEntry.objects.filter(payment=payment, kind="reversal").count() == 1
    assert MerchantReturnDay.objects.get(merchant_id=payment.merchant_id).returns == 1


def test_a_repeated_return_is_a_duplicate_and_one_with_another_payload_a_conflict():
    payment = _settled()
    event = processor_event(payment, "returned", reason_code="R01")
    payment_apply_event(event=event)

    assert payment_apply_event(event=event).outcome == EventOutcome.DUPLICATE
    with pytest.raises(EventConflict):
        payment_apply_event(
            event=processor_event(
                payment, "returned", reason_code="R10", processor_event_id=event.processor_event_id
            )
        )
    assert payment_apply_event(event=processor_event(payment, "returned")).outcome == "stale"
    assert LedgerEntry.objects.filter(payment=payment, kind="reversal").count() == 1


@pytest.mark.parametrize("event_type", ["settled", "submitted", "failed"])
def test_events_behind_a_returned_payment_are_stale(event_type):
    payment = _settled()
    payment_apply_event(event=processor_event(payment, "returned", reason_code="R01"))

    result = payment_apply_event(event=processor_event(payment, event_type))

    assert result.outcome == EventOutcome.STALE
    assert Payment.objects.get(pk=payment.pk).state == PaymentState.RETURNED
    assert LedgerEntry.objects.filter(payment=payment).count() == 2


def test_a_return_before_settlement_fails_the_payment_with_its_code_and_no_reversal():
    payment = PaymentFactory(state=PaymentState.SUBMITTED, merchant_id="m-pre")

    result = payment_apply_event(event=processor_event(payment, "returned", reason_code="R02"))

    payment.refresh_from_db()
    assert (result.to_state, payment.state) == ("failed", "failed")
    assert not LedgerEntry.objects.filter(payment=payment).exists()
    record = PaymentReturn.objects.get(payment=payment)
    assert (record.reason_code, record.category, record.after_settlement) == (
        "R02",
        "administrative",
        False,
    )
    assert record.settled_at is None and record.deadline is None and not record.late
    day = MerchantReturnDay.objects.get(merchant_id="m-pre")
    # Never settled, so the return counts as the debit the network answered as well.
    assert (day.debits, day.returns, day.administrative_returns) == (1, 1, 1)


def test_the_ledger_refuses_a_second_reversal_and_a_reversal_of_the_wrong_sign():
    payment = _settled()
    payment_apply_event(event=processor_event(payment, "returned", reason_code="R01"))

    with pytest.raises(IntegrityError), transaction.atomic():
        LedgerEntry.objects.create(
            payment=payment, merchant_id="m-1", kind="reversal", amount=-payment.amount
        )
    other = _settled()
    with pytest.raises(IntegrityError), transaction.atomic():
        LedgerEntry.objects.create(
            payment=other, merchant_id="m-1", kind="reversal", amount=other.amount
        )


# --- late returns and unknown codes ----------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "settled_ago", "late"),
    [
        ("R01", timedelta(days=1), False),
        # Tue 24 Nov: Wed 25 and Fri 27 (Thanksgiving skipped) are its 2 banking days.
        ("R01", timedelta(days=6), True),
        ("R10", timedelta(days=59), False),
        ("R10", timedelta(days=61), True),
    ],
)
def test_a_return_past_its_time_frame_is_applied_and_flagged_late(code, settled_ago, late):
    payment = _settled()
    _settled_at(payment, NOW - settled_ago)

    result = payment_apply_event(
        event=processor_event(payment, "returned", reason_code=code, timestamp=NOW)
    )

    assert result.to_state == PaymentState.RETURNED
    record = PaymentReturn.objects.get(payment=payment)
    assert record.late is late
    assert ("late return" in record.flags) is late
    assert LedgerEntry.objects.filter(payment=payment, kind="reversal").count() == 1


def test_a_late_return_raises_a_medium_alert_after_commit(django_capture_on_commit_callbacks):
    payment = _settled()
    _settled_at(payment, NOW - timedelta(days=70))

    with django_capture_on_commit_callbacks(execute=True):
        payment_apply_event(
            event=processor_event(payment, "returned", reason_code="R10", timestamp=NOW)
        )

    alert = Alert.objects.get(key=f"payment.late_return:{payment.id}")
    assert (alert.severity, alert.status) == ("medium", AlertStatus.FIRING)
    assert alert.payment_id == payment.id
    assert "late return R10" in alert.summary
    assert alert.details["flags"] == ["late return"]


def test_a_late_return_rolled_back_raises_no_alert(django_capture_on_commit_callbacks):
    payment = _settled()
    _settled_at(payment, NOW - timedelta(days=70))

    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        with pytest.raises(RuntimeError), transaction.atomic():
            payment_apply_event(
                event=processor_event(payment, "returned", reason_code="R10", timestamp=NOW)
            )
            raise RuntimeError("the caller's transaction fails")

    assert callbacks == []
    assert not Alert.objects.exists()
    assert not PaymentReturn.objects.exists()


@pytest.mark.parametrize("code", ["R99", "X1", ""])
def test_an_unknown_code_is_applied_and_flagged_never_dropped(
    code, django_capture_on_commit_callbacks
):
    payment = _settled(merchant="m-unknown")

    with django_capture_on_commit_callbacks(execute=True):
        result = payment_apply_event(event=processor_event(payment, "returned", reason_code=code))

    assert result.to_state == PaymentState.RETURNED
    record = PaymentReturn.objects.get(payment=payment)
    assert record.unknown_code and record.flags == ["unknown code"]
    assert (record.reason_code, record.category, record.reason_title) == (code, "", "")
    assert LedgerEntry.objects.filter(payment=payment, kind="reversal").count() == 1
    day = MerchantReturnDay.objects.get(merchant_id="m-unknown")
    assert (day.returns, day.unauthorized_returns, day.administrative_returns) == (1, 0, 0)
    alert = Alert.objects.get(key=f"payment.return_unknown_code:{payment.id}")
    assert alert.severity == "medium"


# --- the balance -----------------------------------------------------------------------------


def test_the_balance_shows_credits_reversals_net_and_counts_per_currency():
    kept = _settled(merchant="m-bal", amount="100.00")
    returned = _settled(merchant="m-bal", amount="30.25")
    payment_apply_event(event=processor_event(returned, "returned", reason_code="R01"))
    PaymentFactory(state=PaymentState.SUBMITTED, merchant_id="m-bal")  # not in the ledger

    [usd] = merchant_balance(merchant_id="m-bal")["balances"]

    assert usd["currency"] == "USD"
    assert (usd["credits"], usd["reversals"], usd["net"]) == ("130.25", "30.25", "100.00")
    assert (usd["confirmed_count"], usd["returned_count"]) == (1, 1)
    assert usd["confirmed_total"] == f"{kept.amount:.2f}" == usd["balance"]
    assert usd["returned_total"] == "30.25"
    assert usd["entries"] == 3


# --- returns after the payment failed --------------------------------------------------------


def _failed(how: str, merchant: str) -> Payment:
    """A payment that failed: the processor rejected its submission (4xx: the ``reject``
    transition our submission makes), or a ``failed`` event came."""
    if how == "rejected":
        payment = PaymentFactory(state=PaymentState.PENDING, merchant_id=merchant)
        with transaction.atomic():
            locked = Payment.objects.select_for_update().get(pk=payment.pk)
            payment_transition(payment=locked, target=PaymentState.FAILED)
    else:
        payment = PaymentFactory(state=PaymentState.SUBMITTED, merchant_id=merchant)
        payment_apply_event(event=processor_event(payment, "failed"))
    payment.refresh_from_db()
    assert payment.state == PaymentState.FAILED
    return payment


@pytest.mark.parametrize("how", ["rejected", "failed event"])
@pytest.mark.parametrize(
    ("code", "unauthorized", "administrative"),
    [("R01", 0, 0), ("R10", 1, 0), ("R02", 0, 1), ("R99", 0, 0)],
)
def test_a_return_after_failure_is_recorded_counted_and_alerted_without_a_reversal(
    how, code, unauthorized, administrative, django_capture_on_commit_callbacks
):
    payment = _failed(how, merchant=f"m-after-{code}")

    with django_capture_on_commit_callbacks(execute=True):
        result = payment_apply_event(event=processor_event(payment, "returned", reason_code=code))

    assert (result.outcome, result.from_state, result.to_state) == ("recorded", "failed", "failed")
    payment.refresh_from_db()
    assert payment.state == PaymentState.FAILED
    assert not LedgerEntry.objects.filter(payment=payment).exists()  # no credit, no reversal
    record = PaymentReturn.objects.get(payment=payment)
    assert (record.reason_code, record.after_failure, record.after_settlement) == (
        code,
        True,
        False,
    )
    assert "after failure" in record.flags
    log = payment.events.get(event_type="returned")
    assert (log.outcome, log.from_state, log.to_state) == ("recorded", "failed", "failed")
    # The bank returned the entry, so it was originated: one debit and its return, by category.
    day = MerchantReturnDay.objects.get(merchant_id=payment.merchant_id)
    assert (day.debits, day.returns, day.unauthorized_returns, day.administrative_returns) == (
        1,
        1,
        unauthorized,
        administrative,
    )
    alert = Alert.objects.get(key=f"payment.return_after_failure:{payment.id}")
    assert (alert.severity, alert.status, alert.payment_id) == ("medium", "firing", payment.id)
    assert f"return {code}" in alert.summary and "had failed" in alert.summary
    assert alert.details["after_failure"] is True


def test_an_r10_after_failure_counts_toward_the_unauthorized_rate():
    from triage.operations.return_rates import RateKind, merchant_return_rates

    payment = _failed("failed event", merchant="m-r10")
    payment_apply_event(event=processor_event(payment, "returned", reason_code="R10"))

    [rates] = merchant_return_rates(merchant_ids=["m-r10"])
    unauthorized = {r.kind: r for r in rates.rates}[RateKind.UNAUTHORIZED]
    assert (rates.debits, rates.unauthorized_returns, unauthorized.returns) == (1, 1, 1)
    assert unauthorized.percent == 100.0


def test_a_return_after_failure_repeated_is_a_duplicate_another_payload_a_conflict():
    payment = _failed("rejected", merchant="m-dup")
    event = processor_event(payment, "returned", reason_code="R01")
    payment_apply_event(event=event)

    assert payment_apply_event(event=event).outcome == EventOutcome.DUPLICATE
    with pytest.raises(EventConflict):
        payment_apply_event(
            event=processor_event(
                payment, "returned", reason_code="R10", processor_event_id=event.processor_event_id
            )
        )
    # A second return under a new id finds the first one recorded: stale, counted once.
    assert payment_apply_event(event=processor_event(payment, "returned")).outcome == "stale"
    assert PaymentReturn.objects.filter(payment=payment).count() == 1
    day = MerchantReturnDay.objects.get(merchant_id="m-dup")
    assert (day.debits, day.returns) == (1, 1)
    outcomes = list(payment.events.filter(event_type="returned").values_list("outcome", flat=True))
    assert sorted(outcomes) == ["duplicate", "recorded", "stale"]


def test_a_payment_that_failed_by_a_return_takes_a_second_return_as_stale():
    payment = PaymentFactory(state=PaymentState.SUBMITTED, merchant_id="m-by-return")
    payment_apply_event(event=processor_event(payment, "returned", reason_code="R01"))

    result = payment_apply_event(event=processor_event(payment, "returned", reason_code="R10"))

    assert result.outcome == EventOutcome.STALE
    record = PaymentReturn.objects.get(payment=payment)
    assert (record.reason_code, record.after_failure) == ("R01", False)
    day = MerchantReturnDay.objects.get(merchant_id="m-by-return")
    assert (day.debits, day.returns, day.unauthorized_returns) == (1, 1, 0)
