"""A validation service that cannot answer (connection refused, a timeout, an HTTP 5xx or 429,
its own ``ValidationServiceUnavailable``) leaves the validation pending and is asked again by
the periodic round, a bounded number of times, then the validation fails; a 4xx or a definite
no fails it at once. The evidence of an account's earlier validations is kept."""

import socket
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from payments.exceptions import ValidationRefused
from payments.models import (
    AccountValidation,
    OutboxMessage,
    Payment,
    PaymentEvent,
    PaymentState,
    ReviewStatus,
    ValidationState,
)
from payments.services import payment_create
from payments.services.validation import (
    SERVICE_MAX_TRIES,
    SERVICE_RETRY_BASE,
    account_validation_start,
    account_validations_advance,
    service_validations_retry,
)
from payments.services.validation_rule import account_number_changed
from payments.validation_methods import (
    Outcome,
    ValidationService,
    ValidationServiceUnavailable,
)
from tests.payments.validation_service_example import BankDataDouble

pytestmark = pytest.mark.django_db

MERCHANT = "m-val"
TOKEN = "tok_validation_svc_01"
SERVICE = "tests.payments.validation_service_example.BankDataService"


class UnavailableService(ValidationService):
    """A host's service that says, in its own words, it cannot answer now."""

    def validate(self, *, account_token: str, merchant_id: str) -> Outcome:
        raise ValidationServiceUnavailable("the consortium is in maintenance")


@pytest.fixture
def bank_data(settings, module_settings):
    double = BankDataDouble().start()
    settings.BANK_DATA_API_URL = double.url
    settings.BANK_DATA_API_TIMEOUT = 0.3
    module_settings.ACCOUNT_VALIDATION_SERVICE = SERVICE
    module_settings.UNVALIDATED_WEB_DEBITS = "hold"
    yield double
    double.stop()


def _closed_port_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def _start() -> AccountValidation:
    return account_validation_start(account_token=TOKEN, merchant_id=MERCHANT, method="service")


def _held() -> Payment:
    payment = payment_create(
        merchant_id=MERCHANT, amount=Decimal("20.00"), source_token=TOKEN, sec_code="WEB"
    )
    assert payment.review_status == ReviewStatus.VALIDATION
    return payment


def _submit_commands(payment: Payment) -> int:
    return OutboxMessage.objects.filter(group_id=str(payment.id), kind="submit_payment").count()


@pytest.mark.parametrize(
    ("status", "named"),
    [("500", "HTTP 500"), ("503", "HTTP 503"), ("429", "HTTP 429"), ("slow", "ReadTimeout")],
)
def test_a_service_failing_for_a_while_leaves_the_validation_pending_to_retry(
    bank_data, status, named
):
    held = _held()
    bank_data.statuses[TOKEN] = status
    before = timezone.now()

    validation = _start()

    assert validation.state == ValidationState.PENDING
    assert validation.attempts == 1
    assert before + SERVICE_RETRY_BASE <= validation.retry_at <= timezone.now() + SERVICE_RETRY_BASE
    (unavailable,) = validation.evidence["unavailable"]
    assert unavailable["reason"] == f"the validation service is unavailable: {named}"
    assert validation.failure_reason == ""
    held.refresh_from_db()
    assert (held.state, held.review_status) == (PaymentState.PENDING, ReviewStatus.VALIDATION)
    assert _submit_commands(held) == 0


def test_a_service_that_refuses_the_connection_leaves_it_pending(bank_data, settings):
    settings.BANK_DATA_API_URL = _closed_port_url()

    validation = _start()

    assert (validation.state, validation.attempts) == (ValidationState.PENDING, 1)
    reason = validation.evidence["unavailable"][0]["reason"]
    assert reason == "the validation service is unavailable: ConnectionError"
    assert "127.0.0.1" not in str(validation.evidence)


def test_the_services_own_unavailable_word_leaves_it_pending(module_settings):
    module_settings.ACCOUNT_VALIDATION_SERVICE = f"{__name__}.UnavailableService"

    validation = _start()

    assert validation.state == ValidationState.PENDING
    assert "maintenance" in validation.evidence["unavailable"][0]["reason"]


def test_the_round_asks_again_only_when_due_and_the_answer_releases_the_held_debit_once(
    bank_data,
):
    held = _held()
    bank_data.statuses[TOKEN] = "503"
    validation = _start()
    asked = len(bank_data.requests)

    assert service_validations_retry(now=validation.retry_at - timedelta(seconds=1)) == 0
    assert len(bank_data.requests) == asked  # not due: not asked
    bank_data.statuses[TOKEN] = "open"
    assert account_validations_advance(now=validation.retry_at) == 1
    assert account_validations_advance(now=validation.retry_at + timedelta(days=1)) == 0

    validation.refresh_from_db()
    assert validation.state == ValidationState.VALIDATED
    assert validation.retry_at is None
    assert validation.evidence["answer"]["status"] == "open"
    assert len(bank_data.requests) == asked + 1
    held.refresh_from_db()
    assert held.review_status == ReviewStatus.NONE and _submit_commands(held) == 1


def test_a_service_that_never_answers_fails_the_validation_after_the_last_try(bank_data):
    held = _held()
    bank_data.statuses[TOKEN] = "500"
    validation = _start()
    due = [validation.started_at]

    while validation.state == ValidationState.PENDING:
        due.append(validation.retry_at)
        service_validations_retry(now=validation.retry_at)
        validation.refresh_from_db()

    assert len(bank_data.requests) == SERVICE_MAX_TRIES
    assert validation.state == ValidationState.FAILED
    assert validation.failure_reason.startswith(f"no answer after {SERVICE_MAX_TRIES} tries")
    assert len(validation.evidence["unavailable"]) == SERVICE_MAX_TRIES
    # The waits double: each try is asked at the moment the one before it was due.
    waits = [later - earlier for earlier, later in zip(due, due[1:], strict=False)]
    assert [round(w / SERVICE_RETRY_BASE) for w in waits] == [1, 2, 4, 8]
    held.refresh_from_db()
    assert held.state == PaymentState.FAILED
    failures = PaymentEvent.objects.filter(payment=held, event_type="account_validation_failed")
    assert failures.count() == 1
    assert service_validations_retry(now=timezone.now() + timedelta(days=30)) == 0


def test_a_retry_due_after_the_service_was_unset_fails_with_the_reason(bank_data, module_settings):
    bank_data.statuses[TOKEN] = "503"
    validation = _start()
    module_settings.ACCOUNT_VALIDATION_SERVICE = ""

    assert service_validations_retry(now=validation.retry_at) == 1

    validation.refresh_from_db()
    assert validation.state == ValidationState.FAILED
    assert "no validation service is configured" in validation.failure_reason


def test_a_pending_retry_refuses_another_start_as_in_progress(bank_data):
    bank_data.statuses[TOKEN] = "503"
    _start()

    with pytest.raises(ValidationRefused) as refused:
        _start()
    assert refused.value.rule == "account_validation_in_progress"


# --- the evidence of earlier rounds ------------------------------------------------------------


def test_the_evidence_of_earlier_validations_is_kept_newest_last(bank_data):
    bank_data.statuses[TOKEN] = "closed"
    first = _start()
    assert first.state == ValidationState.FAILED
    bank_data.statuses[TOKEN] = "open"
    _start()
    with pytest.raises(ValidationRefused):
        _start()  # validated: not started again
    account_number_changed(account_token=TOKEN, change_code="C01", source="noc_received")

    third = _start()

    assert third.state == ValidationState.VALIDATED
    rounds = third.evidence["earlier"]
    assert [(r["method"], r["state"]) for r in rounds] == [
        ("service", "failed"),
        ("service", "unvalidated"),
    ]
    assert rounds[0]["failure_reason"] == "bank data: closed"
    assert rounds[0]["evidence"]["answer"]["status"] == "closed"
    assert rounds[1]["evidence"]["answer"]["status"] == "open"
    assert rounds[1]["ended_at"] is not None
    assert "earlier" not in rounds[1]["evidence"]
    assert third.evidence["nocs"] == [{"change_code": "C01", "source": "noc_received"}]
    assert third.evidence["answer"]["check_id"] == "chk_3"


def test_a_start_cut_after_its_commit_is_asked_again_by_the_periodic_round(bank_data):
    """The state a start leaves when its process dies between the commit and the service's
    answer: pending, due for a retry once the answer's wait is over."""
    from payments.validation_methods import SERVICE_ANSWER_WAIT, Service

    held = _held()
    now = timezone.now()
    validation = AccountValidation.objects.get(account_token=TOKEN)
    validation.start()
    validation.method = "service"
    validation.started_at = now
    Service().begin(validation, now=now)
    validation.save()

    assert service_validations_retry(now=now + SERVICE_ANSWER_WAIT - timedelta(seconds=1)) == 0
    assert service_validations_retry(now=now + SERVICE_ANSWER_WAIT) == 1

    validation.refresh_from_db()
    assert (validation.state, validation.retry_at) == (ValidationState.VALIDATED, None)
    assert len(bank_data.requests) == 1
    held.refresh_from_db()
    assert held.review_status == ReviewStatus.NONE
    assert _submit_commands(held) == 1


def test_a_start_answered_at_once_is_not_asked_again(bank_data):
    validation = _start()

    assert (validation.state, validation.retry_at) == (ValidationState.VALIDATED, None)
    assert service_validations_retry(now=timezone.now() + timedelta(days=1)) == 0
    assert len(bank_data.requests) == 1
