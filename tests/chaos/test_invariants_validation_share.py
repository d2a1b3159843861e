"""The chaos run's validation share, checked: a clean history of WEB debits held for their
accounts' validation (one released and charged once, one failed with its validation, a create
refused after it, micro-entries failed at their try limit) passes; each hand-made violation
fails the one check that names it; a run configured with the share that checked nothing fails
each check."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from chaos.invariants import check_invariants
from payments.exceptions import AccountNotValidated
from payments.models import (
    AccountValidation,
    EventKind,
    EventOutcome,
    Payment,
    PaymentEvent,
)
from payments.services import payment_create
from payments.services.validation import (
    FAILED_EVENT,
    prenote_returned,
    prenotes_mature,
)
from tests.chaos.histories import deliver, failed_checks, totals_rebuild

pytestmark = pytest.mark.django_db

WEB_FIRST = "web_debits_validated_first"
DECIDED = "held_debits_decided_once"
REFUSED = "refused_web_debits_left_nothing"
TRIES = "micro_entry_attempts_bounded"
OK_TOKEN = "tok_chaosval_ok_01"
FAILED_TOKEN = "tok_chaosval_no_01"
MICRO_TOKEN = "tok_chaosval_micro_01"


def _web(token: str, amount: str) -> Payment:
    return payment_create(
        merchant_id="m-1", amount=Decimal(amount), source_token=token, sec_code="WEB"
    )


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _pending_prenote(token: str) -> None:
    AccountValidation.objects.create(
        account_token=token,
        merchant_id="m-1",
        state="pending",
        method="prenote",
        live_from=timezone.now() - timedelta(seconds=1),
    )


@pytest.fixture
def share(history, module_settings):
    """The clean history, plus the share: a WEB debit held then released by its validation and
    charged once (the processor's record of it arrived after the validation), one held and
    failed with its validation, a create refused after that, and micro-entries failed by their
    third wrong try (three answered a try spent, three more nothing to verify)."""
    module_settings.UNVALIDATED_WEB_DEBITS = "hold"
    _pending_prenote(OK_TOKEN)
    released = _web(OK_TOKEN, "21.00")
    assert released.review_status == "validation"
    assert prenotes_mature() == 1
    released.refresh_from_db()
    history["stats"]["charges"][str(released.idempotency_key)] = 1
    history["stats"]["charges_by_payment"][str(released.id)] = 1
    deliver(history, released, "submitted")

    _pending_prenote(FAILED_TOKEN)
    failed = _web(FAILED_TOKEN, "22.00")
    assert prenote_returned(account_token=FAILED_TOKEN, return_code="R03")
    sent = _now()
    with pytest.raises(AccountNotValidated):
        _web(FAILED_TOKEN, "23.00")
    refused = [
        {"source_token": FAILED_TOKEN, "merchant_id": "m-1", "amount": "23.00",
         "sent_at": sent, "answered_at": _now()}
    ]  # fmt: skip

    AccountValidation.objects.create(
        account_token=MICRO_TOKEN,
        merchant_id="m-1",
        state="failed",
        method="micro_entries",
        attempts=3,
        failure_reason="micro-entry amounts wrong too often",
        failed_at=timezone.now(),
    )
    answers = [{"account_token": MICRO_TOKEN, "status": 409, "code": "micro_entries_mismatch"}] * 3
    answers += [{"account_token": MICRO_TOKEN, "status": 409, "code": "validation_not_verifiable"}]
    validated_at = AccountValidation.objects.get(account_token=OK_TOKEN).validated_at
    debits = [
        {
            "idempotency_key": str(released.idempotency_key),
            "payment_id": str(released.id),
            "source_token": OK_TOKEN,
            "sec_code": "WEB",
            "company_entry_description": "PAYMENT",
            "received_at": (validated_at + timedelta(seconds=1)).isoformat(),
        }
    ]
    history.update(debits=debits, refused=refused, answers=answers)
    history["payments"].update(released=released, failed=failed)
    return history


def _check(history, **overrides):
    arguments = {
        "sandbox_stats": history["stats"],
        "callbacks_sent": history["sent"],
        "processor_debits": history["debits"],
        "refused_creates": history["refused"],
        "verify_answers": history["answers"],
        "expect_validation": True,
        **overrides,
    }
    totals_rebuild()
    return check_invariants(**arguments)


def _only(report, check: str, finding: str) -> tuple[str, ...]:
    """The one violation, of ``check``, naming ``finding``; its ids."""
    assert {v.check for v in report.violations} == {check}, report.render()
    [violation] = report.violations
    assert finding in violation.detail, violation.detail
    return violation.ids


def test_a_clean_validation_share_passes_every_check(share):
    report = _check(share)

    assert report.ok, report.render()
    assert report.checked[WEB_FIRST]["WEB debits at the processor"] == 1
    assert report.checked[DECIDED] == {
        "held for validation": 2,
        "released": 1,
        "released and charged once": 1,
        "failed with its validation": 1,
    }
    assert report.checked[REFUSED] == {
        "accounts whose validation failed": 2,
        "creates refused account_not_validated": 1,
    }
    assert report.checked[TRIES]["tries spent (409 mismatch)"] == 3


# --- web_debits_validated_first, by the processor's record -------------------------------------


def test_a_web_debit_that_reached_the_processor_before_its_validation_fails(share):
    share["debits"][0]["received_at"] = (
        AccountValidation.objects.get(account_token=OK_TOKEN).validated_at - timedelta(seconds=1)
    ).isoformat()

    ids = _only(_check(share), WEB_FIRST, "reached the processor before")
    assert ids[0].startswith(str(share["payments"]["released"].id))


def test_a_web_debit_of_an_account_never_validated_at_the_processor_fails(share):
    failed = share["payments"]["failed"]
    share["debits"].append(
        {"idempotency_key": str(failed.idempotency_key), "payment_id": str(failed.id),
         "source_token": FAILED_TOKEN, "sec_code": "WEB", "received_at": _now()}
    )  # fmt: skip

    ids = _only(_check(share), WEB_FIRST, "reached the processor before")
    assert "never validated" in ids[0]


# --- held_debits_decided_once -------------------------------------------------------------------


def test_a_held_debit_decided_twice_fails(share):
    failed = share["payments"]["failed"]
    PaymentEvent.objects.create(
        payment=failed,
        kind=EventKind.REVIEW,
        outcome=EventOutcome.RECORDED,
        event_type=FAILED_EVENT,
        from_state="failed",
        to_state="failed",
        payload={},
        caused_by="corruption",
    )

    ids = _only(_check(share), DECIDED, "not decided exactly once")
    assert ids == (f"{failed.id} (decided 2 times)",)


def test_a_debit_still_held_after_its_validation_failed_fails(share):
    failed = share["payments"]["failed"]
    Payment.objects.filter(pk=failed.pk).update(review_status="validation")

    ids = _only(_check(share), DECIDED, "not decided exactly once")
    assert ids == (f"{failed.id} (still held, its validation failed)",)


def test_a_released_debit_the_processor_never_charged_fails(share):
    released = share["payments"]["released"]
    del share["stats"]["charges"][str(released.idempotency_key)]
    del share["stats"]["charges_by_payment"][str(released.id)]

    ids = _only(_check(share), DECIDED, "not decided exactly once")
    assert ids == (f"{released.id} (released, charged 0 times, submitted)",)


@pytest.mark.parametrize("expected", [True, False])
def test_a_debit_held_on_a_validation_never_started_fails_only_a_run_that_validates_all(
    share, expected
):
    held = _web("tok_chaosval_waits_01", "24.00")
    assert held.review_status == "validation"

    report = _check(share, expect_validation=expected)

    if not expected:
        assert report.ok, report.render()
        assert report.checked[DECIDED]["still held"] == 1
        return
    ids = _only(report, DECIDED, "not decided exactly once")
    assert ids == (f"{held.id} (still held: its validation, unvalidated, never ended)",)


# --- refused_web_debits_left_nothing ------------------------------------------------------------


def test_a_web_debit_made_after_its_account_failed_fails(share):
    made = share["payments"]["failed"]
    # The refused create's payment, as a create that ignored the failure would have written it.
    Payment.objects.filter(pk=made.pk).update(
        amount=Decimal("23.00"),
        created_at=datetime.fromisoformat(share["refused"][0]["sent_at"])
        + timedelta(microseconds=1),
    )

    report = _check(share)
    assert failed_checks(report) == {REFUSED}, report.render()
    [violation] = report.violations
    assert set(violation.ids) == {
        f"{made.id} (made after its account's validation failed)",
        f"{made.id} (made by a create answered account_not_validated)",
    }


# --- micro_entry_attempts_bounded ---------------------------------------------------------------


def test_micro_entries_counting_a_try_past_the_limit_fail(share):
    AccountValidation.objects.filter(account_token=MICRO_TOKEN).update(attempts=4)

    report = _check(share)
    assert failed_checks(report) == {TRIES}, report.render()
    assert f"{MICRO_TOKEN} (4 tries counted)" in report.violations[0].ids


def test_a_client_answered_a_try_spent_past_the_limit_fails(share):
    share["answers"].append(
        {"account_token": MICRO_TOKEN, "status": 409, "code": "micro_entries_mismatch"}
    )

    ids = _only(_check(share), TRIES, "past the micro-entries' try limit")
    assert ids == (f"{MICRO_TOKEN} (answered micro_entries_mismatch 4 times)",)


def test_micro_entries_validated_after_their_last_try_fail(share):
    share["answers"].append({"account_token": MICRO_TOKEN, "status": 200, "code": ""})

    ids = _only(_check(share), TRIES, "past the micro-entries' try limit")
    assert ids == (f"{MICRO_TOKEN} (validated after its last try was spent)",)


# --- a run configured with the share that checked nothing ---------------------------------------


def test_a_run_with_the_share_configured_that_checked_nothing_fails_each_check(history):
    totals_rebuild()
    report = check_invariants(
        sandbox_stats=history["stats"],
        callbacks_sent=history["sent"],
        processor_debits=[],
        refused_creates=[],
        verify_answers=[],
        expect_validation=True,
    )

    assert failed_checks(report) == {WEB_FIRST, DECIDED, REFUSED, TRIES}
    assert all("proved nothing" in v.detail for v in report.violations), report.render()


def test_the_same_history_without_the_share_configured_passes(history):
    totals_rebuild()
    report = check_invariants(sandbox_stats=history["stats"], callbacks_sent=history["sent"])

    assert report.ok, report.render()
