"""Canceling a payment before origination (``payments.services.payment_cancel``): ``pending ->
canceled`` once, and one winner against the worker's submission, forced both ways on
PostgreSQL with the sandbox processor counting what reached it."""

import pytest
from prometheus_client import REGISTRY

from payments.exceptions import (
    CancelRefused,
    InvalidTransition,
    PaymentNotFound,
    ProcessorCircuitOpen,
    ProcessorUnavailable,
)
from payments.models import (
    EventKind,
    LedgerEntry,
    Payment,
    PaymentEvent,
    PaymentState,
    ProcessorAttempt,
)
from payments.selectors import merchant_balance
from payments.services import payment_apply_event, payment_cancel, payment_submit
from payments.services.submission import SubmitOutcome
from payments.signals import payment_transition_committed, payment_transitioned
from tests.factories import PaymentFactory, open_breaker, processor_event
from tests.waiting import race, race_in_order

pytestmark = pytest.mark.django_db(transaction=True)


def _canceled_count() -> float:
    labels = {"from_state": "pending", "to_state": "canceled"}
    return REGISTRY.get_sample_value("payments_transitions_total", labels) or 0.0


def test_a_pending_payment_is_canceled_once_logged_and_counted():
    payment = PaymentFactory()
    before = _canceled_count()

    result = payment_cancel(payment_id=payment.id, caused_by="api:alice")

    payment.refresh_from_db()
    assert result.canceled and payment.state == PaymentState.CANCELED
    row = PaymentEvent.objects.get(payment=payment)
    assert (row.kind, row.outcome, row.from_state, row.to_state, row.caused_by) == (
        EventKind.CANCELLATION,
        "applied",
        "pending",
        "canceled",
        "api:alice",
    )
    assert _canceled_count() == before + 1


def test_a_second_cancel_answers_the_canceled_payment_and_writes_nothing():
    payment = PaymentFactory()
    payment_cancel(payment_id=payment.id)
    before = _canceled_count()

    again = payment_cancel(payment_id=payment.id)

    assert not again.canceled and again.payment.state == PaymentState.CANCELED
    assert PaymentEvent.objects.filter(payment=payment).count() == 1
    assert _canceled_count() == before


@pytest.mark.parametrize(
    ("state", "rule"),
    [
        ("submitted", "already_submitted"),
        ("confirmed", "already_submitted"),
        ("returned", "already_submitted"),
        ("failed", "payment_not_cancelable"),
    ],
)
def test_a_payment_past_pending_is_refused_naming_the_rule(state, rule):
    payment = PaymentFactory(state=state)

    with pytest.raises(CancelRefused) as refused:
        payment_cancel(payment_id=payment.id)

    assert refused.value.rule == rule
    payment.refresh_from_db()
    assert payment.state == state
    assert not PaymentEvent.objects.filter(payment=payment).exists()


def test_a_pending_payment_whose_submission_began_is_refused_as_already_submitted(sandbox):
    # A call that failed retryably may still have reached the processor.
    payment = PaymentFactory(source_token="tok_timeout_1_cancel")
    with pytest.raises(ProcessorUnavailable):
        payment_submit(payment_id=payment.id)
    payment.refresh_from_db()
    assert payment.state == PaymentState.PENDING and payment.submission_started_at is not None

    with pytest.raises(CancelRefused) as refused:
        payment_cancel(payment_id=payment.id)

    assert refused.value.rule == "already_submitted"
    assert "may have reached the processor" in str(refused.value)


def test_an_unknown_or_malformed_payment_is_not_found():
    with pytest.raises(PaymentNotFound):
        payment_cancel(payment_id="8e4f9d1e-1111-4b5e-9c1b-2f5b6a7c8d9e")
    with pytest.raises(PaymentNotFound):
        payment_cancel(payment_id="not-a-uuid")


def test_a_canceled_payment_moves_no_money():
    payment = PaymentFactory(merchant_id="m-cancel")
    settled = PaymentFactory(merchant_id="m-cancel", state="submitted")
    payment_apply_event(event=processor_event(settled, "settled"))
    before = merchant_balance(merchant_id="m-cancel")

    payment_cancel(payment_id=payment.id)

    assert not LedgerEntry.objects.filter(payment=payment).exists()
    assert merchant_balance(merchant_id="m-cancel") == before


def test_a_processor_event_for_a_canceled_payment_is_an_error_for_a_human():
    """The processor saying it moved money we canceled is never applied nor called stale."""
    payment = PaymentFactory()
    payment_cancel(payment_id=payment.id)

    for event_type in ("submitted", "settled"):
        with pytest.raises(InvalidTransition):
            payment_apply_event(event=processor_event(payment, event_type))

    payment.refresh_from_db()
    assert payment.state == PaymentState.CANCELED


def test_the_hosts_signals_fire_for_a_cancel_inside_and_after_its_transaction():
    payment = PaymentFactory()
    inside, after = [], []

    def on_transition(sender, payment, from_state, to_state, event, **kwargs):
        inside.append((str(payment.pk), from_state, to_state, event.kind))

    def on_commit(sender, payment, from_state, to_state, event, **kwargs):
        after.append((str(payment.pk), from_state, to_state))

    payment_transitioned.connect(on_transition, dispatch_uid="test-cancel-inside")
    payment_transition_committed.connect(on_commit, dispatch_uid="test-cancel-after")
    try:
        payment_cancel(payment_id=payment.id)
        payment_cancel(payment_id=payment.id)  # idempotent: no second announcement
    finally:
        payment_transitioned.disconnect(dispatch_uid="test-cancel-inside")
        payment_transition_committed.disconnect(dispatch_uid="test-cancel-after")

    assert inside == [(str(payment.pk), "pending", "canceled", "cancellation")]
    assert after == [(str(payment.pk), "pending", "canceled")]


def test_a_receiver_that_fails_rolls_the_cancel_back():
    payment = PaymentFactory()

    def failing(sender, **kwargs):
        raise RuntimeError("host table unavailable")

    payment_transitioned.connect(failing, dispatch_uid="test-cancel-failing")
    try:
        with pytest.raises(RuntimeError):
            payment_cancel(payment_id=payment.id)
    finally:
        payment_transitioned.disconnect(dispatch_uid="test-cancel-failing")

    payment.refresh_from_db()
    assert payment.state == PaymentState.PENDING
    assert not PaymentEvent.objects.filter(payment=payment).exists()


def test_a_canceled_payments_submit_message_is_done_and_never_calls_the_processor(sandbox):
    payment = PaymentFactory()
    payment_cancel(payment_id=payment.id)

    result = payment_submit(payment_id=payment.id)

    assert result.outcome == SubmitOutcome.SKIPPED
    assert sandbox.stats()["requests"] == {}
    assert not ProcessorAttempt.objects.filter(payment=payment).exists()


def test_a_submission_the_breaker_refused_leaves_the_payment_cancelable(sandbox):
    open_breaker()  # the real breaker, open: the submission's admission refuses the call
    payment = PaymentFactory()
    with pytest.raises(ProcessorCircuitOpen):
        payment_submit(payment_id=payment.id)

    payment.refresh_from_db()
    assert payment.submission_started_at is None
    assert sandbox.stats()["requests"] == {}
    assert payment_cancel(payment_id=payment.id).canceled


# --- the race against the submission, forced both ways -------------------------------------------


def _lock(payment: Payment):
    return lambda: Payment.objects.select_for_update().get(pk=payment.pk)


@pytest.mark.parametrize("attempt", range(2))
def test_a_submission_that_takes_the_lock_first_wins_and_the_cancel_is_refused(sandbox, attempt):
    payment = PaymentFactory(source_token=f"tok_plain_{attempt:04d}")

    submitted, canceled = race_in_order(
        _lock(payment),
        lambda: payment_submit(payment_id=payment.id),
        lambda: payment_cancel(payment_id=payment.id),
    )

    assert submitted.outcome == SubmitOutcome.SUBMITTED, submitted
    assert isinstance(canceled, CancelRefused) and canceled.rule == "already_submitted", canceled
    payment.refresh_from_db()
    assert payment.state == PaymentState.SUBMITTED
    assert sandbox.stats()["charges_by_payment"] == {str(payment.id): 1}
    assert not PaymentEvent.objects.filter(payment=payment, kind=EventKind.CANCELLATION).exists()


@pytest.mark.parametrize("attempt", range(2))
def test_a_cancel_that_takes_the_lock_first_wins_and_nothing_reaches_the_processor(
    sandbox, attempt
):
    payment = PaymentFactory(source_token=f"tok_plain_{attempt:04d}")

    canceled, submitted = race_in_order(
        _lock(payment),
        lambda: payment_cancel(payment_id=payment.id),
        lambda: payment_submit(payment_id=payment.id),
    )

    assert canceled.canceled, canceled
    assert submitted.outcome == SubmitOutcome.SKIPPED, submitted
    payment.refresh_from_db()
    assert payment.state == PaymentState.CANCELED
    assert sandbox.stats()["requests"] == {}
    assert not ProcessorAttempt.objects.filter(payment=payment).exists()


def test_a_cancel_while_the_call_is_in_flight_is_refused_and_the_call_completes(
    sandbox, monkeypatch
):
    """The submission's mark is committed before its call: a cancel made while the call is at
    the processor (no lock held by anyone) is refused, and the payment ends submitted."""
    from payments.services import submission

    payment = PaymentFactory(source_token="tok_plain_0009")
    during: list = []
    real = submission._debit_create

    def call_then_cancel(locked):
        try:
            during.append(payment_cancel(payment_id=payment.id))
        except CancelRefused as exc:
            during.append(exc)
        return real(locked)

    monkeypatch.setattr(submission, "_debit_create", call_then_cancel)
    result = payment_submit(payment_id=payment.id)

    assert isinstance(during[0], CancelRefused) and during[0].rule == "already_submitted"
    assert result.outcome == SubmitOutcome.SUBMITTED
    assert sandbox.stats()["charges_by_payment"] == {str(payment.id): 1}


def test_a_debit_queued_by_a_backend_that_cannot_withdraw_it_counts_as_sent(monkeypatch):
    """A backend that answers DebitQueued but writes no debit_withdraw would send the debit
    later whatever the cancel said: the payment stays marked and the cancel is refused."""
    from payments.processor.backend import CallTimer, DebitQueued, get_backend
    from payments.services import submission

    queued = DebitQueued(reason="later", call=CallTimer("SUBMIT", "x").record(http_status=202))
    monkeypatch.setattr(submission, "_debit_create", lambda payment: queued)
    payment = PaymentFactory()

    assert payment_submit(payment_id=payment.id).outcome == SubmitOutcome.QUEUED

    assert not get_backend().withdraws_debits
    payment.refresh_from_db()
    assert payment.submission_started_at is not None
    with pytest.raises(CancelRefused) as refused:
        payment_cancel(payment_id=payment.id)
    assert refused.value.rule == "already_submitted"


def test_cancels_and_submissions_released_together_always_have_one_winner(sandbox):
    """Unforced: a barrier releases both, the scheduler picks. Whatever it picks, a payment is
    either canceled and never charged, or submitted, charged once and its cancel refused."""
    outcomes = []
    for n in range(10):
        payment = PaymentFactory(source_token=f"tok_plain_{n:04d}race")
        submitted, canceled = race(
            lambda p=payment: payment_submit(payment_id=p.id),
            lambda p=payment: payment_cancel(payment_id=p.id),
        )
        payment.refresh_from_db()
        charged = sandbox.stats()["charges_by_payment"].get(str(payment.id), 0)
        if payment.state == PaymentState.CANCELED:
            assert canceled.canceled and submitted.outcome == SubmitOutcome.SKIPPED
            assert charged == 0
        else:
            assert payment.state == PaymentState.SUBMITTED, payment.state
            assert submitted.outcome == SubmitOutcome.SUBMITTED
            assert isinstance(canceled, CancelRefused) and canceled.rule == "already_submitted"
            assert charged == 1
        outcomes.append(payment.state)
    assert len(outcomes) == 10
