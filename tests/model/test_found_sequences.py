"""Sequences of the model's moves, replayed as tests of their own: the one the model found and
shrank (a defect, fixed since), and the two cases next to it that the fix's rules decide. Every
invariant is checked after every move, as in a model run."""

import pytest

from payments.models import Payment, PaymentState, ReturnDishonor
from tests.model.machine import PipelineModel
from triage.models import Alert

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def model(model_world):
    state = PipelineModel()
    yield state
    state.teardown()


def play(state: PipelineModel, *moves) -> None:
    state.invariants_hold()
    for move in moves:
        move(state)
        state.invariants_hold()


def returned_r01(state: PipelineModel) -> Payment:
    """A debit settled and returned R01 (the processor's tok_model_nsf), five days on."""
    play(
        state, lambda s: s.first_payments(tokens=["tok_model_nsf"]), *[PipelineModel.day_passes] * 5
    )
    payment = Payment.objects.get(pk=state.payments[0])
    assert payment.state == PaymentState.RETURNED
    return payment


def test_a_reinitiated_r01_return_is_not_then_dishonored(model):
    # Found by MODEL_SEED=21 MODEL_EXAMPLES=400 MODEL_STEPS=40 and shrunk to these moves: the
    # dishonor was asked for and sent, and its answer would re-credit what the reinitiation
    # collected again.
    payment = returned_r01(model)

    play(
        model,
        lambda s: s.reinitiate(authorized=False, index=0),
        PipelineModel.day_passes,
        PipelineModel.day_passes,
        lambda s: s.dishonor_request(code="R61", index=0),
    )

    assert Payment.objects.filter(reinitiation_of=payment).count() == 1
    assert not ReturnDishonor.objects.filter(payment=payment).exists()


def test_a_dishonor_the_processor_may_have_taken_keeps_its_return_from_reinitiation(model):
    payment = returned_r01(model)

    play(
        model,
        lambda s: s.processor_mood(mood="5xx", calls=1),
        lambda s: s.dishonor_request(code="R61", index=0),
        lambda s: s.reinitiate(authorized=False, index=0),
        lambda s: s.dishonor_resend(index=0),
        PipelineModel.day_passes,
    )

    assert not Payment.objects.filter(reinitiation_of=payment).exists()
    assert ReturnDishonor.objects.get(payment=payment).dishonored_event_id


def test_a_timed_out_dishonor_that_stands_after_a_reinitiation_raises_the_alert(model):
    # The processor took the request and the answer was lost; past the window the return is
    # reinitiated, and then the processor's return_dishonored comes: booked, and alerted.
    payment = returned_r01(model)

    play(
        model,
        lambda s: s.processor_mood(mood="timeout_after_charge", calls=1),
        lambda s: s.dishonor_request(code="R61", index=0),
        lambda s: s.advance_clock(step="week"),
        lambda s: s.reinitiate(authorized=False, index=0),
        PipelineModel.day_passes,
    )

    assert Payment.objects.filter(reinitiation_of=payment).count() == 1
    assert ReturnDishonor.objects.get(payment=payment).dishonored_event_id
    assert Alert.objects.filter(key=f"payment.dishonor_after_reinitiation:{payment.pk}").exists()
