"""Money out through the submission path: a credit payment (a refund or a payout, its
``source_token`` the account the credit goes to) is sent as a credit, looked up as one, and a
backend without credits refuses it at once. Real HTTP against the sandbox processor."""

from decimal import Decimal

import pytest

from payments.exceptions import ProcessorUnavailable
from payments.models import (
    AttemptOutcome,
    PaymentDirection,
    PaymentPurpose,
    PaymentState,
    ProcessorAttempt,
)
from payments.processor.backend import CreditsUnsupported, reset_backend
from payments.processor.backends.example import OtherProcessorBackend
from payments.processor.backends.http import get_client
from payments.services import payment_status_check, payment_submit
from tests.factories import PaymentFactory
from tests.payments.other_processor import OtherProcessorServer

pytestmark = pytest.mark.django_db(transaction=True)


def payout(**fields):
    return PaymentFactory(
        direction=PaymentDirection.CREDIT, purpose=PaymentPurpose.PAYOUT, **fields
    )


def refund_of(debit, **fields):
    return PaymentFactory(
        merchant_id=debit.merchant_id,
        direction=PaymentDirection.CREDIT,
        purpose=PaymentPurpose.REFUND,
        refund_of=debit,
        source_token=debit.source_token,
        **fields,
    )


def test_a_payout_is_sent_as_a_credit_to_its_destination_token(sandbox):
    payment = payout(amount=Decimal("19.99"), source_token="tok_merchant_bank_01")

    result = payment_submit(payment_id=payment.id)

    assert result.outcome == "submitted"
    payment.refresh_from_db()
    assert payment.state == PaymentState.SUBMITTED
    sent = sandbox.credit(str(payment.idempotency_key))
    assert (sent.direction, sent.payment_id, sent.amount) == ("credit", str(payment.id), "19.99")
    assert sent.source_token == "tok_merchant_bank_01"  # the sandbox's field for either token
    assert payment.processor_id == sent.processor_id
    assert sandbox.debit(str(payment.idempotency_key)) is None
    stats = sandbox.stats()
    assert (stats["total_credits_sent"], stats["total_charges"]) == (1, 0)
    [attempt] = ProcessorAttempt.objects.filter(payment=payment)
    assert (attempt.outcome, attempt.http_status) == (AttemptOutcome.ACCEPTED, 201)
    assert attempt.idempotency_key == payment.idempotency_key


def test_a_refund_is_credited_back_to_the_debits_account(sandbox):
    debit = PaymentFactory(state=PaymentState.CONFIRMED, source_token="tok_customer_07")
    refund = refund_of(debit, amount=Decimal("5.00"))

    payment_submit(payment_id=refund.id)

    sent = sandbox.credit(str(refund.idempotency_key))
    assert (sent.payment_id, sent.amount, sent.source_token) == (
        str(refund.id),
        "5.00",
        "tok_customer_07",
    )
    assert sandbox.stats()["credits_sent_by_payment"] == {str(refund.id): 1}


def test_a_credit_retried_after_a_5xx_is_sent_once_under_its_key(sandbox):
    payment = payout(source_token="tok_fail5xx_1_payout")

    with pytest.raises(ProcessorUnavailable):
        payment_submit(payment_id=payment.id)
    payment_submit(payment_id=payment.id)

    assert sandbox.stats()["credits_sent"] == {str(payment.idempotency_key): 1}
    assert list(
        ProcessorAttempt.objects.filter(payment=payment)
        .order_by("attempt_number")
        .values_list("outcome", flat=True)
    ) == [AttemptOutcome.RETRYABLE, AttemptOutcome.ACCEPTED]


def test_the_status_check_of_a_credit_reads_the_credit(sandbox):
    payment = payout(source_token="tok_merchant_bank_02")
    payment_submit(payment_id=payment.id)

    checked = payment_status_check(payment_id=payment.id)

    assert checked.found
    assert checked.processor_id == sandbox.credit(str(payment.idempotency_key)).processor_id
    attempt = ProcessorAttempt.objects.get(payment=payment, operation="status")
    assert (attempt.outcome, attempt.http_status) == (AttemptOutcome.ACCEPTED, 200)
    assert sandbox.stats()["requests"] == {"credit_create": 1, "credit_get": 1}


def test_the_status_check_of_a_credit_never_sent_is_not_found(sandbox):
    payment = payout()

    assert not payment_status_check(payment_id=payment.id).found


@pytest.fixture
def without_credits(settings, module_settings):
    server = OtherProcessorServer(token="other-token").start()
    module_settings.PROCESSOR_BACKEND = "payments.processor.backends.example.OtherProcessorBackend"
    settings.OTHER_PROCESSOR_URL = server.base_url
    settings.OTHER_PROCESSOR_TOKEN = "other-token"
    yield server
    server.stop()
    reset_backend()


def test_a_backend_without_credits_says_so_and_refuses_one_by_name(without_credits):
    backend = get_client()
    assert isinstance(backend, OtherProcessorBackend)
    assert not backend.supports_credits
    with pytest.raises(CreditsUnsupported, match="OtherProcessorBackend cannot send credits"):
        backend.credit_get(idempotency_key="k")


def test_a_credit_through_a_backend_without_credits_fails_at_once(without_credits):
    payment = payout()

    result = payment_submit(payment_id=payment.id)

    assert result.outcome == "rejected"
    payment.refresh_from_db()
    assert payment.state == PaymentState.FAILED
    [attempt] = ProcessorAttempt.objects.filter(payment=payment)
    assert attempt.outcome == AttemptOutcome.REJECTED
    assert "OtherProcessorBackend cannot send credits" in attempt.error
