"""The chaos run's money checks over micro-entry rounds (payments of their own, booked on the
account PAYMENTS["MICRO_ENTRY_COST"] names): a settled round, a returned offsetting debit and a
returned credit beside a collection leave every check green, on the sandbox's own stats."""

from decimal import Decimal

import pytest

from chaos.invariants.money import check_charges, check_ledger, check_returns_reversed
from chaos.invariants.money_out import check_balances, check_credits_sent
from chaos.invariants.report import Report
from payments.models import Payment
from payments.services import payment_apply_event, payment_create, payment_submit
from payments.services.validation import account_validation_start
from tests.factories import processor_event

pytestmark = pytest.mark.django_db


def _round(token: str) -> list[Payment]:
    validation = account_validation_start(
        account_token=token, merchant_id="m-chaos", method="micro_entries"
    )
    entries = list(Payment.objects.filter(account_validation=validation).order_by("direction"))
    for entry in entries:
        payment_submit(payment_id=entry.pk)
        payment_apply_event(event=processor_event(entry, "settled", direction=entry.direction))
    return entries


@pytest.mark.parametrize("cost", ["house", "merchant"])
def test_micro_entry_rounds_leave_the_money_checks_green(sandbox, module_settings, cost):
    module_settings.MICRO_ENTRY_COST = cost
    collected = payment_create(
        merchant_id="m-chaos", amount=Decimal("12.00"), source_token="tok_chaos_c", sec_code="PPD"
    )
    payment_submit(payment_id=collected.pk)
    payment_apply_event(event=processor_event(collected, "settled"))
    _round("tok_chaos_settled")
    credit, _, debit = _round("tok_chaos_returned")
    payment_apply_event(event=processor_event(debit, "returned", reason_code="R01"))
    payment_apply_event(
        event=processor_event(credit, "returned", reason_code="R03", direction="credit")
    )
    report = Report()
    stats = sandbox.stats()

    check_charges(report, stats)
    check_credits_sent(report, stats)
    check_ledger(report)
    check_returns_reversed(report)
    check_balances(report)

    assert report.ok, [str(v) for v in report.violations]
