"""``web_debits_validated_first``: a clean history with WEB debits from validated accounts (and a
reinitiation, and a debit held and failed with its validation) passes; a WEB debit that left
before its account's validation fails the one check that names it."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from payments.models import AccountValidation, Payment
from payments.services import payment_create, payment_reinitiate
from payments.services.validation import prenote_returned
from tests.chaos.histories import check, deliver, failed_checks
from tests.factories import account_validated

pytestmark = pytest.mark.django_db

CHECK = "web_debits_validated_first"
TOKEN = "tok_chaos_web_01"


def _web(token: str = TOKEN, amount: str = "12.00") -> Payment:
    return payment_create(
        merchant_id="m-1", amount=Decimal(amount), source_token=token, sec_code="WEB"
    )


@pytest.fixture
def validated(history, module_settings):
    """The clean history, plus two WEB debits of a validated account (one returned and
    reinitiated) and a WEB debit held for a prenote that came back R03."""
    account_validated(TOKEN, "m-1")
    sent = _web()
    deliver(history, sent, "submitted")
    deliver(history, sent, "settled", timestamp=timezone.now())
    returned = _web(amount="7.00")
    deliver(history, returned, "submitted")
    deliver(history, returned, "settled", timestamp=timezone.now())
    deliver(history, returned, "returned", reason_code="R01", timestamp=timezone.now())
    again = payment_reinitiate(payment_id=returned.id)
    deliver(history, again, "submitted")

    module_settings.UNVALIDATED_WEB_DEBITS = "hold"
    AccountValidation.objects.create(
        account_token="tok_chaos_web_02", merchant_id="m-1", state="pending", method="prenote"
    )
    held = _web(token="tok_chaos_web_02")
    prenote_returned(account_token="tok_chaos_web_02", return_code="R03")
    history["payments"].update(web_sent=sent, web_returned=returned, web_again=again, held=held)
    return history


def test_a_clean_history_of_validated_web_debits_passes(validated):
    report = check(validated)

    assert CHECK not in failed_checks(report), report.render()
    assert report.checked[CHECK] == {"debits that left": 2, "classes": "WEB"}


def test_a_web_debit_that_left_before_its_account_was_validated_fails(validated):
    before = failed_checks(check(validated))
    sent = validated["payments"]["web_sent"]
    AccountValidation.objects.filter(account_token=TOKEN).update(
        validated_at=timezone.now() + timedelta(hours=1)
    )

    report = check(validated)

    assert failed_checks(report) - before == {CHECK}
    [violation] = report.violations_of(CHECK)
    assert set(violation.ids) == {str(sent.id), str(validated["payments"]["web_returned"].id)}


def test_a_web_debit_whose_account_has_no_validation_at_all_fails(validated):
    before = failed_checks(check(validated))
    AccountValidation.objects.filter(account_token=TOKEN).delete()

    report = check(validated)

    assert failed_checks(report) - before == {CHECK}
    assert "left before their account was validated" in report.violations_of(CHECK)[0].detail


def test_a_held_web_debit_whose_submission_began_fails(validated):
    before = failed_checks(check(validated))
    held = validated["payments"]["held"]
    Payment.objects.filter(pk=held.pk).update(submission_started_at=timezone.now())

    report = check(validated)

    # It left before its account was validated, and it was not failed with its validation alone.
    assert failed_checks(report) - before == {CHECK, "held_debits_decided_once"}
    assert report.violations_of(CHECK)[0].ids == (str(held.id),)
    [decided] = report.violations_of("held_debits_decided_once")
    assert decided.ids == (f"{held.id} (failed with its validation, yet a submission started)",)


# --- prenotes_waited ---------------------------------------------------------------------------

PRENOTES = "prenotes_waited"


def _prenote_validated(token: str, *, waited: timedelta, trace: str = "") -> AccountValidation:
    live_from = timezone.now() - timedelta(days=1)
    evidence = {"prenote": {"trace_number": trace}} if trace else {"prenote": {}}
    return AccountValidation.objects.create(
        account_token=token,
        merchant_id="m-1",
        state="validated",
        method="prenote",
        live_from=live_from,
        validated_at=live_from + waited,
        evidence=evidence,
    )


def test_accounts_validated_by_prenotes_after_their_wait_pass(validated):
    _prenote_validated("tok_chaos_pn_01", waited=timedelta(0))
    _prenote_validated("tok_chaos_pn_02", waited=timedelta(hours=3))

    report = check(validated)

    assert PRENOTES not in failed_checks(report), report.render()
    assert report.checked[PRENOTES] == {"validated by prenote": 2}


@pytest.mark.parametrize("corruption", ["before live_from", "no live_from"])
def test_an_account_validated_by_a_prenote_before_its_wait_fails(validated, corruption):
    before = failed_checks(check(validated))
    early = _prenote_validated("tok_chaos_pn_03", waited=timedelta(seconds=-1))
    if corruption == "no live_from":
        AccountValidation.objects.filter(pk=early.pk).update(
            live_from=None, validated_at=timezone.now()
        )

    report = check(validated)

    assert failed_checks(report) - before == {PRENOTES}
    [violation] = report.violations_of(PRENOTES)
    assert list(violation.ids) == [str(early.pk)]


def test_a_bank_prenote_validated_before_its_file_was_delivered_fails(validated):
    from bank.nacha.models import NachaPrenote

    before = failed_checks(check(validated))
    early = _prenote_validated("tok_chaos_pn_04", waited=timedelta(0), trace="021000020000099")
    NachaPrenote.objects.create(
        validation=early,
        account_token=early.account_token,
        merchant_id="m-1",
        trace_number="021000020000099",
    )

    report = check(validated)

    assert failed_checks(report) - before == {PRENOTES}
    [violation] = report.violations_of(PRENOTES)
    assert list(violation.ids) == [str(early.pk)]
