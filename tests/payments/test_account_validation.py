"""NACHA's account validation rule: a WEB debit waits for its account's validation (refused, or
held and then released or failed once), by a prenote, micro-entries or a validation service; a
change of the account number makes the account new; a reinitiation is not held back."""

import logging
import threading
from datetime import timedelta
from decimal import Decimal

import pytest
from django.core.checks import run_checks
from django.utils import timezone

from payments.exceptions import AccountNotValidated, AmountsInvalid, ValidationRefused
from payments.models import (
    AccountValidation,
    OutboxMessage,
    Payment,
    PaymentEvent,
    PaymentState,
    ReviewStatus,
    ValidationState,
)
from payments.processor.backend import reset_backend
from payments.processor.backends.http import ProcessorClient
from payments.services import payment_create, payment_reinitiate
from payments.services.nocs import noc_record
from payments.services.submission import payment_submit
from payments.services.validation import (
    account_validation_start,
    micro_entries_verify,
    prenote_returned,
    prenotes_mature,
)
from tests.factories import PaymentFactory, processor_event
from tests.payments.test_reinitiation import _settle_and_return
from tests.payments.validation_service_example import BankDataDouble

pytestmark = pytest.mark.django_db

MERCHANT = "m-val"
TOKEN = "tok_validation_01"
SERVICE = "tests.payments.validation_service_example.BankDataService"


class PrenoteClient(ProcessorClient):
    """The reference backend, saying it can send prenotes: the module's prenote bookkeeping
    (returns, NOCs, the wait) is the same whatever sends the entry."""

    supports_prenotes = True


@pytest.fixture
def bank_data(settings, module_settings):
    double = BankDataDouble().start()
    settings.BANK_DATA_API_URL = double.url
    module_settings.ACCOUNT_VALIDATION_SERVICE = SERVICE
    yield double
    double.stop()


@pytest.fixture
def prenotes(module_settings):
    module_settings.PROCESSOR_BACKEND = f"{__name__}.PrenoteClient"
    reset_backend()
    yield
    reset_backend()


@pytest.fixture
def hold(module_settings):
    module_settings.UNVALIDATED_WEB_DEBITS = "hold"


def _web(token: str = TOKEN, amount: str = "20.00", **fields) -> Payment:
    return payment_create(
        merchant_id=MERCHANT,
        amount=Decimal(amount),
        source_token=token,
        sec_code="WEB",
        **fields,
    )


def _submit_commands(payment: Payment) -> int:
    return OutboxMessage.objects.filter(group_id=str(payment.id), kind="submit_payment").count()


# --- enforcement at create ---------------------------------------------------------------------


def test_a_web_debit_from_an_account_never_validated_is_refused_and_nothing_is_written():
    with pytest.raises(AccountNotValidated) as refused:
        _web()

    assert refused.value.code == "account_not_validated"
    assert "unvalidated" in str(refused.value)
    assert not Payment.objects.exists() and not OutboxMessage.objects.exists()


@pytest.mark.parametrize("sec_code", ["PPD", "CCD"])
def test_ppd_and_ccd_debits_need_no_validation_by_the_rule_default(sec_code):
    payment = payment_create(
        merchant_id=MERCHANT, amount=Decimal("5.00"), source_token=TOKEN, sec_code=sec_code
    )

    assert payment.review_status == ReviewStatus.NONE
    assert _submit_commands(payment) == 1


def test_the_per_class_setting_can_require_validation_of_ppd_and_keeps_web_required(
    module_settings,
):
    module_settings.ACCOUNT_VALIDATION_REQUIRED = {"PPD": True}

    for sec_code in ("PPD", "WEB"):
        with pytest.raises(AccountNotValidated):
            payment_create(
                merchant_id=MERCHANT, amount=Decimal("5.00"), source_token=TOKEN, sec_code=sec_code
            )


def test_a_web_debit_from_a_validated_account_goes_out(bank_data):
    account_validation_start(account_token=TOKEN, merchant_id=MERCHANT, method="service")

    payment = _web()

    assert payment.review_status == ReviewStatus.NONE
    assert _submit_commands(payment) == 1


def test_a_failed_validation_refuses_even_in_hold_mode(bank_data, hold):
    bank_data.statuses[TOKEN] = "closed"
    account_validation_start(account_token=TOKEN, merchant_id=MERCHANT, method="service")

    with pytest.raises(AccountNotValidated) as refused:
        _web()
    assert refused.value.state == ValidationState.FAILED


def test_in_hold_mode_the_debit_is_held_without_a_submit_command_and_not_submitted(hold, sandbox):
    payment = _web()

    assert (payment.state, payment.review_status) == (PaymentState.PENDING, "validation")
    assert payment.review_reason.startswith("account_not_validated")
    assert _submit_commands(payment) == 0
    # A stray submit command is skipped, as for a review hold.
    result = payment_submit(payment_id=payment.id)
    assert result.outcome == "skipped"
    assert sandbox.debit(str(payment.idempotency_key)) is None


def test_a_person_cannot_approve_a_debit_held_for_validation(hold):
    from payments.services.review import ReviewRefused, payment_review_approve
    from tests.factories import UserFactory

    reviewer = UserFactory(is_superuser=True)
    payment = _web()

    with pytest.raises(ReviewRefused):
        payment_review_approve(payment_id=payment.id, user=reviewer, note="looks fine")
    assert _submit_commands(payment) == 0


def test_the_validation_releases_each_held_debit_with_exactly_one_submit_command(hold, bank_data):
    held = [_web(amount=f"{n}.00") for n in (1, 2, 3)]
    other = _web(token="tok_validation_02")

    account_validation_start(account_token=TOKEN, merchant_id=MERCHANT, method="service")

    for payment in held:
        payment.refresh_from_db()
        assert payment.review_status == ReviewStatus.NONE
        assert _submit_commands(payment) == 1
        assert PaymentEvent.objects.filter(payment=payment, event_type="account_validated").count()
    other.refresh_from_db()
    assert other.review_status == ReviewStatus.VALIDATION and _submit_commands(other) == 0


# --- prenotes ----------------------------------------------------------------------------------


def test_a_prenote_validates_the_account_from_the_third_banking_day_after_settlement(
    prenotes, hold
):
    held = _web()
    validation = account_validation_start(
        account_token=TOKEN, merchant_id=MERCHANT, method="prenote"
    )
    assert validation.state == ValidationState.PENDING
    assert validation.live_from > timezone.now() + timedelta(days=2)

    assert prenotes_mature(now=validation.live_from - timedelta(seconds=1)) == 0
    assert prenotes_mature(now=validation.live_from) == 1
    assert prenotes_mature(now=validation.live_from) == 0

    validation.refresh_from_db()
    assert validation.state == ValidationState.VALIDATED
    assert _submit_commands(held) == 1


def test_a_prenote_returned_r03_fails_each_held_debit_once_with_the_reason(prenotes, hold):
    held = [_web(amount=f"{n}.00") for n in (4, 5)]
    account_validation_start(account_token=TOKEN, merchant_id=MERCHANT, method="prenote")

    assert prenote_returned(account_token=TOKEN, return_code="R03") is True
    assert prenote_returned(account_token=TOKEN, return_code="R03") is False

    validation = AccountValidation.objects.get(account_token=TOKEN)
    assert validation.state == ValidationState.FAILED
    assert validation.failure_reason == "prenote returned R03"
    assert validation.evidence["return"]["code"] == "R03"
    for payment in held:
        payment.refresh_from_db()
        assert payment.state == PaymentState.FAILED
        failures = PaymentEvent.objects.filter(
            payment=payment, event_type="account_validation_failed"
        )
        assert [row.payload["reason"] for row in failures] == ["prenote returned R03"]
        assert _submit_commands(payment) == 0
    # Matured later, nothing changes: the return came first.
    assert prenotes_mature(now=timezone.now() + timedelta(days=30)) == 0


def test_prenote_is_unavailable_on_a_backend_that_cannot_send_one():
    with pytest.raises(ValidationRefused) as refused:
        account_validation_start(account_token=TOKEN, merchant_id=MERCHANT, method="prenote")
    assert refused.value.rule == "validation_method_unavailable"
    assert not AccountValidation.objects.exists()


# --- a change of the account number -------------------------------------------------------------


def test_a_noc_changing_the_account_number_while_a_debit_is_held_keeps_it_held_and_unvalidates(
    prenotes, hold, module_settings
):
    held = _web()
    account_validation_start(account_token=TOKEN, merchant_id=MERCHANT, method="prenote")

    noc = noc_record(
        payment=held,
        event=processor_event(held, "notification_of_change", change_code="C01", corrected_data={}),
    )

    validation = AccountValidation.objects.get(account_token=TOKEN)
    assert validation.state == ValidationState.UNVALIDATED
    assert validation.evidence["nocs"] == [
        {"change_code": "C01", "source": "noc_received", "noc_id": noc.id}
    ]
    # The prenote of the old number matures into nothing.
    assert prenotes_mature(now=timezone.now() + timedelta(days=30)) == 0
    held.refresh_from_db()
    assert (held.state, held.review_status) == (PaymentState.PENDING, ReviewStatus.VALIDATION)
    assert _submit_commands(held) == 0
    module_settings.UNVALIDATED_WEB_DEBITS = "refuse"
    with pytest.raises(AccountNotValidated):
        _web()


def test_a_validated_account_becomes_unvalidated_when_a_noc_changes_its_number(bank_data):
    account_validation_start(account_token=TOKEN, merchant_id=MERCHANT, method="service")
    payment = _web()

    noc_record(
        payment=payment,
        event=processor_event(payment, "notification_of_change", change_code="C06"),
    )

    assert AccountValidation.objects.get(account_token=TOKEN).state == "unvalidated"
    with pytest.raises(AccountNotValidated):
        _web()


def test_a_noc_of_another_detail_keeps_the_validation(bank_data):
    account_validation_start(account_token=TOKEN, merchant_id=MERCHANT, method="service")
    payment = _web()

    noc_record(
        payment=payment,
        event=processor_event(payment, "notification_of_change", change_code="C05"),
    )

    validation = AccountValidation.objects.get(account_token=TOKEN)
    assert validation.state == ValidationState.VALIDATED
    assert validation.evidence["nocs"][0]["change_code"] == "C05"


# --- reinitiation ------------------------------------------------------------------------------


def test_a_reinitiation_of_a_returned_web_debit_from_an_account_validated_since_goes_out(
    bank_data,
):
    original = PaymentFactory(
        state=PaymentState.SUBMITTED,
        merchant_id=MERCHANT,
        source_token=TOKEN,
        sec_code="WEB",
        amount=Decimal("42.00"),
    )
    original = _settle_and_return(original, "R01")
    account_validation_start(account_token=TOKEN, merchant_id=MERCHANT, method="service")

    again = payment_reinitiate(payment_id=original.id, caused_by="api:test")

    assert (again.sec_code, again.entry_description) == ("WEB", "RETRY PYMT")
    assert again.review_status == ReviewStatus.NONE
    assert _submit_commands(again) == 1


# --- micro-entries -----------------------------------------------------------------------------


def _micro(sandbox, token: str = TOKEN) -> tuple[AccountValidation, list[str]]:
    """Start micro-entries and submit them as the worker does (each payment's submission over
    HTTP); the amounts as the receiver reads them from its statement (the sandbox's record of
    the credits)."""
    validation = account_validation_start(
        account_token=token, merchant_id=MERCHANT, method="micro_entries"
    )
    entries = _micro_payments(validation)
    for entry in entries:
        payment_submit(payment_id=entry.id)
    credits = [
        sandbox.credit(str(entry.idempotency_key))
        for entry in entries
        if entry.direction == "credit"
    ]
    return validation, [f"{Decimal(credit.amount):.2f}" for credit in credits]


def _micro_payments(validation: AccountValidation) -> list[Payment]:
    ids = validation.evidence["micro_entries"]["payments"]
    return sorted(Payment.objects.filter(pk__in=ids), key=lambda p: ids.index(str(p.pk)))


def _wrong(amounts: list[str]) -> list[str]:
    first = Decimal(amounts[0])
    return [f"{(first % Decimal('0.98')) + Decimal('0.01'):.2f}", amounts[1]]


def test_micro_entries_send_two_credits_under_a_dollar_and_a_debit_of_their_sum(sandbox):
    validation, amounts = _micro(sandbox)

    *credits, debit = _micro_payments(validation)
    assert [c.direction for c in credits] == ["credit", "credit"] and debit.direction == "debit"
    sent = sandbox.debit(str(debit.idempotency_key))
    assert all(Decimal("0.01") <= Decimal(a) <= Decimal("0.99") for a in amounts)
    assert Decimal(sent.amount) == sum(Decimal(a) for a in amounts)
    assert sent.company_entry_description == "ACCTVERIFY"
    credit = sandbox.credit(str(credits[0].idempotency_key))
    assert credit.company_entry_description == "ACCTVERIFY"
    assert validation.expires_at > timezone.now() + timedelta(days=9)
    for entry in (*credits, debit):
        assert (entry.purpose, entry.sec_code, entry.entry_description) == (
            "micro_entry",
            "PPD",
            "ACCTVERIFY",
        )
        assert entry.account_validation_id == validation.pk
        assert entry.merchant_id == MERCHANT


def test_the_right_amounts_in_any_order_validate_and_nothing_keeps_them(sandbox, caplog):
    caplog.set_level(logging.DEBUG)
    validation, amounts = _micro(sandbox)

    validated = micro_entries_verify(
        account_token=TOKEN, merchant_id=MERCHANT, amounts=list(reversed(amounts))
    )

    assert validated.state == ValidationState.VALIDATED
    row = AccountValidation.objects.filter(pk=validation.pk).values()[0]
    for amount in amounts:
        assert amount not in str(row)
        assert amount not in caplog.text


@pytest.mark.parametrize(
    "amounts",
    [
        ["-0.12", "0.34"],
        ["0.123", "0.34"],
        [" 0.12", "0.34"],
        ["0.12 ", "0.34"],
        ["0 .12"],
        ["0.00"],
        ["1.00"],
        ["0.1"],
        [12, 34],
        [0.12, 0.34],
        "0.12,0.34",
        ["0.12", "0.34", "0.56"],
        [],
        None,
        {"a": "0.12"},
        ["0.1\x00"],
        ["0.\ud8002"],
        ["٠.١٢"],
        ["0.12" * 10_000],
    ],
)
def test_malformed_amounts_are_refused_by_name_without_spending_a_try(sandbox, amounts):
    _micro(sandbox)

    with pytest.raises(AmountsInvalid) as refused:
        micro_entries_verify(account_token=TOKEN, merchant_id=MERCHANT, amounts=amounts)

    assert "0.12" not in str(refused.value)
    assert AccountValidation.objects.get(account_token=TOKEN).attempts == 0


def test_wrong_amounts_spend_a_try_each_and_the_last_fails_the_validation(sandbox, hold):
    held = _web()
    _, amounts = _micro(sandbox)
    wrong = _wrong(amounts)

    codes = []
    for _ in range(3):
        with pytest.raises(ValidationRefused) as refused:
            micro_entries_verify(account_token=TOKEN, merchant_id=MERCHANT, amounts=wrong)
        codes.append(refused.value.rule)
        assert wrong[0] not in str(refused.value)
    with pytest.raises(ValidationRefused) as after:
        micro_entries_verify(account_token=TOKEN, merchant_id=MERCHANT, amounts=amounts)

    assert codes == ["micro_entries_mismatch"] * 3
    assert after.value.rule == "validation_not_verifiable"
    validation = AccountValidation.objects.get(account_token=TOKEN)
    assert (validation.state, validation.attempts) == (ValidationState.FAILED, 3)
    assert validation.secret_digest == ""
    held.refresh_from_db()
    assert held.state == PaymentState.FAILED


def test_a_single_wrong_amount_of_one_is_a_mismatch(sandbox):
    _, amounts = _micro(sandbox)

    with pytest.raises(ValidationRefused) as refused:
        micro_entries_verify(account_token=TOKEN, merchant_id=MERCHANT, amounts=amounts[:1])
    assert refused.value.rule == "micro_entries_mismatch"


def test_the_right_amounts_after_the_expiry_are_refused_and_the_validation_fails(sandbox):
    validation, amounts = _micro(sandbox)

    with pytest.raises(ValidationRefused) as refused:
        micro_entries_verify(
            account_token=TOKEN,
            merchant_id=MERCHANT,
            amounts=amounts,
            now=validation.expires_at + timedelta(seconds=1),
        )

    assert refused.value.rule == "micro_entries_expired"
    validation.refresh_from_db()
    assert validation.state == ValidationState.FAILED
    assert "expired" in validation.failure_reason


def test_another_merchants_token_is_not_found_to_verify(sandbox):
    _, amounts = _micro(sandbox)

    with pytest.raises(LookupError):
        micro_entries_verify(account_token=TOKEN, merchant_id="m-other", amounts=amounts)
    with pytest.raises(LookupError):
        account_validation_start(account_token=TOKEN, merchant_id="m-other", method="micro_entries")


def test_a_failed_validation_may_be_started_again_and_then_validates(sandbox):
    _, amounts = _micro(sandbox)
    for _ in range(3):
        with pytest.raises(ValidationRefused):
            micro_entries_verify(account_token=TOKEN, merchant_id=MERCHANT, amounts=_wrong(amounts))

    _, again = _micro(sandbox)
    validated = micro_entries_verify(account_token=TOKEN, merchant_id=MERCHANT, amounts=again)

    assert validated.state == ValidationState.VALIDATED and validated.attempts == 0


@pytest.mark.django_db(transaction=True)
def test_the_attempt_limit_holds_under_a_hundred_parallel_tries(sandbox):
    _, amounts = _micro(sandbox)
    wrong = _wrong(amounts)
    tries, threads = 100, 25
    barrier = threading.Barrier(threads)
    codes: list[str] = []
    lock = threading.Lock()

    def run(share: int) -> None:
        from django.db import connection

        try:
            barrier.wait()
            for _ in range(share):
                try:
                    micro_entries_verify(account_token=TOKEN, merchant_id=MERCHANT, amounts=wrong)
                except ValidationRefused as exc:
                    with lock:
                        codes.append(exc.rule)
        finally:
            connection.close()

    workers = [threading.Thread(target=run, args=(tries // threads,)) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)

    assert len(codes) == tries
    assert codes.count("micro_entries_mismatch") == 3
    assert codes.count("validation_not_verifiable") == tries - 3
    validation = AccountValidation.objects.get(account_token=TOKEN)
    assert (validation.state, validation.attempts) == (ValidationState.FAILED, 3)


# --- a validation service ----------------------------------------------------------------------


def test_the_service_is_called_with_the_account_and_its_yes_is_recorded(bank_data):
    validation = account_validation_start(
        account_token=TOKEN, merchant_id=MERCHANT, method="service"
    )

    assert validation.state == ValidationState.VALIDATED
    assert validation.evidence["answer"]["status"] == "open"
    assert validation.evidence["answer"]["check_id"] == "chk_1"
    assert bank_data.requests == [{"account_token": TOKEN, "merchant_id": MERCHANT}]


@pytest.mark.parametrize(
    ("status", "reason"),
    [("closed", "bank data: closed"), ("400", "the validation service failed: 400 Client Error")],
)
def test_the_services_no_or_its_refusal_fails_the_validation_with_the_reason(
    bank_data, status, reason
):
    bank_data.statuses[TOKEN] = status

    validation = account_validation_start(
        account_token=TOKEN, merchant_id=MERCHANT, method="service"
    )

    assert validation.state == ValidationState.FAILED
    assert validation.failure_reason.startswith(reason)


def test_a_validated_account_is_not_started_again(bank_data):
    account_validation_start(account_token=TOKEN, merchant_id=MERCHANT, method="service")

    with pytest.raises(ValidationRefused) as refused:
        account_validation_start(account_token=TOKEN, merchant_id=MERCHANT, method="service")
    assert refused.value.rule == "account_already_validated"


def test_the_service_method_without_a_service_configured_is_unavailable():
    with pytest.raises(ValidationRefused) as refused:
        account_validation_start(account_token=TOKEN, merchant_id=MERCHANT, method="service")
    assert refused.value.rule == "validation_method_unavailable"


# --- settings checks ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value", "error_id"),
    [
        ("ACCOUNT_VALIDATION_SERVICE", "no.such.Service", "payments.E006"),
        ("ACCOUNT_VALIDATION_SERVICE", "payments.models.Payment", "payments.E006"),
        ("ACCOUNT_VALIDATION_SERVICE", "not a path", "payments.E003"),
        ("ACCOUNT_VALIDATION_REQUIRED", {"WEB": "yes"}, "payments.E003"),
        ("ACCOUNT_VALIDATION_REQUIRED", {"TEL": True}, "payments.E003"),
        ("ACCOUNT_VALIDATION_REQUIRED", ["WEB"], "payments.E003"),
        ("UNVALIDATED_WEB_DEBITS", "maybe", "payments.E003"),
        ("MICRO_ENTRY_MAX_ATTEMPTS", 0, "payments.E003"),
        ("MICRO_ENTRY_EXPIRY_DAYS", 1000, "payments.E003"),
        ("MICRO_ENTRY_COST", "customer", "payments.E003"),
    ],
)
def test_start_up_checks_refuse_bad_validation_settings(module_settings, name, value, error_id):
    setattr(module_settings, name, value)

    errors = [e for e in run_checks() if e.id == error_id]

    assert any(name in e.msg for e in errors), [e.msg for e in run_checks()]


def test_a_held_debit_past_an_exposure_limit_too_is_held_for_review_once_validated(
    hold, bank_data, module_settings
):
    module_settings.OVER_LIMIT = "hold"
    module_settings.EXPOSURE_LIMITS = {"USD": {"debit": {"single": "10.00"}}}
    payment = _web(amount="50.00")
    assert payment.review_status == ReviewStatus.VALIDATION

    account_validation_start(account_token=TOKEN, merchant_id=MERCHANT, method="service")

    payment.refresh_from_db()
    assert payment.review_status == ReviewStatus.HELD
    assert payment.review_reason.startswith("debit_single_limit")
    assert _submit_commands(payment) == 0


def test_the_periodic_round_fails_expired_micro_entries_and_their_held_debits(sandbox, hold):
    from payments.tasks import account_validations_advance

    held = _web()
    validation, _ = _micro(sandbox)
    assert account_validations_advance() == 0

    AccountValidation.objects.filter(pk=validation.pk).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert account_validations_advance() == 1
    assert account_validations_advance() == 0

    validation.refresh_from_db()
    held.refresh_from_db()
    assert validation.state == ValidationState.FAILED
    assert held.state == PaymentState.FAILED


def test_the_admin_shows_a_validation_read_only_and_never_its_digest(admin_client, sandbox):
    validation, _ = _micro(sandbox)

    listing = admin_client.get("/admin/payments/accountvalidation/?state=pending")
    page = admin_client.get(f"/admin/payments/accountvalidation/{validation.pk}/change/")

    assert listing.status_code == page.status_code == 200
    assert TOKEN in listing.content.decode()
    assert len(validation.secret_digest) == 64
    assert validation.secret_digest not in page.content.decode()
    assert admin_client.get("/admin/payments/accountvalidation/add/").status_code == 403
    response = admin_client.post(
        f"/admin/payments/accountvalidation/{validation.pk}/delete/", {"post": "yes"}
    )
    assert response.status_code == 403
    assert AccountValidation.objects.filter(pk=validation.pk).exists()


@pytest.mark.django_db(transaction=True)
def test_held_creates_racing_the_validations_end_each_go_out_exactly_once(
    hold, bank_data, sqs_queues
):
    """Creates in hold mode and the validation's end at the same moment, on PostgreSQL: every
    debit ends submitted once (held then released, or created after the end), none stuck."""
    creates, threads = 24, 8
    barrier = threading.Barrier(threads + 1)
    made: list = []
    lock = threading.Lock()

    def create(share: int) -> None:
        from django.db import connection

        try:
            barrier.wait()
            for n in range(share):
                payment = _web(amount=f"{n + 1}.00")
                with lock:
                    made.append(payment.id)
        finally:
            connection.close()

    def validate() -> None:
        from django.db import connection

        try:
            barrier.wait()
            account_validation_start(account_token=TOKEN, merchant_id=MERCHANT, method="service")
        finally:
            connection.close()

    workers = [threading.Thread(target=create, args=(creates // threads,)) for _ in range(threads)]
    workers.append(threading.Thread(target=validate))
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)

    assert len(made) == creates
    assert AccountValidation.objects.get(account_token=TOKEN).state == ValidationState.VALIDATED
    for payment in Payment.objects.filter(pk__in=made):
        assert payment.review_status == ReviewStatus.NONE, payment.review_reason
        assert _submit_commands(payment) == 1


def test_a_noc_marked_applied_makes_the_account_new_again(bank_data, admin_user):
    from payments.services.nocs import noc_mark_applied

    payment = _web_after_validation()
    noc = noc_record(
        payment=payment,
        event=processor_event(payment, "notification_of_change", change_code="C03"),
    )
    account_validation_start(account_token=TOKEN, merchant_id=MERCHANT, method="service")
    assert AccountValidation.objects.get(account_token=TOKEN).state == ValidationState.VALIDATED

    noc_mark_applied(noc_id=noc.id, user=admin_user, note="token updated at the processor")

    validation = AccountValidation.objects.get(account_token=TOKEN)
    assert validation.state == ValidationState.UNVALIDATED
    assert [n["source"] for n in validation.evidence["nocs"]] == ["noc_received", "noc_applied"]


def _web_after_validation() -> Payment:
    account_validation_start(account_token=TOKEN, merchant_id=MERCHANT, method="service")
    return _web()
