"""A submission's breaker is read once: the worker's gate answers before the message starts,
and its submission's admission takes that answer when the breaker was closed
(``callbacks.handlers``, ``payments.services.calls.breaker_admit``)."""

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from callbacks.handlers import _breaker_gate_passed, processor_breaker_gate
from callbacks.sqs import ReceivedMessage
from payments.models import BreakerState, CircuitBreaker
from payments.processor.breaker import PROCESSOR, processor_breaker_get
from payments.services.calls import breaker_admit
from tests.factories import PaymentFactory

pytestmark = pytest.mark.django_db


def _message() -> ReceivedMessage:
    return ReceivedMessage(
        message_id=str(uuid.uuid4()),
        receipt_handle="handle",
        raw_body="{}",
        body={"kind": "submit_payment"},
        group_id=str(uuid.uuid4()),
        deduplication_id=str(uuid.uuid4()),
        sequence_number="1",
        enqueued_at=timezone.now(),
        receive_count=1,
    )


def test_the_gates_answer_goes_to_its_own_message_once_and_to_no_other():
    processor_breaker_get()
    first, second = _message(), _message()

    assert processor_breaker_gate(first) is None
    assert _breaker_gate_passed(second) is None  # another message's answer
    assert processor_breaker_gate(first) is None
    passed = _breaker_gate_passed(first)

    assert passed is not None and passed.allowed and passed.row_read
    assert _breaker_gate_passed(first) is None  # taken once


def test_a_closed_breakers_gate_answer_admits_without_reading_it_again(django_assert_num_queries):
    processor_breaker_get()
    message = _message()
    processor_breaker_gate(message)
    gate = _breaker_gate_passed(message)

    with django_assert_num_queries(0):
        admission = breaker_admit(PaymentFactory.build(), "submit", gate=gate)

    assert admission is gate and admission.state == BreakerState.CLOSED


def test_a_gate_answer_without_the_breakers_row_is_asked_again_and_makes_the_row():
    message = _message()
    processor_breaker_gate(message)  # never used: no row, allowed
    gate = _breaker_gate_passed(message)

    admission = breaker_admit(PaymentFactory.build(), "submit", gate=gate)

    assert (gate.row_read, admission.row_read) == (False, True)
    assert CircuitBreaker.objects.filter(name=PROCESSOR).exists()


def test_an_open_breaker_defers_at_the_gate_and_hands_nothing_on():
    processor_breaker_get()
    CircuitBreaker.objects.filter(name=PROCESSOR).update(
        state=BreakerState.OPEN, open_until=timezone.now() + timedelta(seconds=30)
    )
    message = _message()

    deferral = processor_breaker_gate(message)

    assert deferral is not None and deferral.label == "breaker_open"
    assert _breaker_gate_passed(message) is None
