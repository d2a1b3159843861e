"""The fraud rules' history of a merchant, read on PostgreSQL by a statement written once: the
same figures the ORM's aggregate (the other databases' read) gives, for every kind of entry the
figures count or leave out."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from payments.fraud_rules import Entry
from payments.models import (
    AccountValidation,
    Payment,
    PaymentDirection,
    PaymentPurpose,
    PaymentState,
)
from payments.services.fraud import (
    MerchantHistory,
    history_sums_orm,
    history_sums_sql,
    history_window,
)
from tests.factories import PaymentFactory

pytestmark = pytest.mark.django_db

MERCHANT = "m-history"
TOKEN = "tok_history_acct_01"


def _payment(days_ago: float, amount: str, **fields) -> Payment:
    fields = {"merchant_id": MERCHANT, "source_token": "tok_history_other_1", **fields}
    payment = PaymentFactory(amount=Decimal(amount), **fields)
    Payment.objects.filter(pk=payment.pk).update(
        created_at=timezone.now() - timedelta(days=days_ago)
    )
    return payment


@pytest.fixture
def history():
    """A merchant's entries of every kind the figures tell apart, and another merchant's."""
    _payment(0, "10.00")
    _payment(0, "20.00", source_token=TOKEN)
    _payment(0, "40.00", state=PaymentState.FAILED)
    _payment(0, "80.00", state=PaymentState.CANCELED)
    _payment(0, "160.00", currency="CAD")
    _payment(0, "320.00", direction=PaymentDirection.CREDIT, purpose=PaymentPurpose.PAYOUT)
    validation = AccountValidation.objects.create(account_token=TOKEN, merchant_id=MERCHANT)
    _payment(
        0,
        "640.00",
        source_token=TOKEN,
        purpose=PaymentPurpose.MICRO_ENTRY,
        account_validation=validation,
    )
    _payment(8, "1.00")
    _payment(15, "2.00", source_token=TOKEN, state=PaymentState.FAILED)
    _payment(20, "4.00", direction=PaymentDirection.CREDIT, purpose=PaymentPurpose.PAYOUT)
    _payment(90, "8.00")
    _payment(200, "16.00", source_token=TOKEN)
    _payment(0, "5000.00", merchant_id="m-history-other", source_token=TOKEN)


def _entry(direction: str, token: str, currency: str = "USD") -> Entry:
    return Entry(
        merchant_id=MERCHANT,
        direction=direction,
        purpose=PaymentPurpose.COLLECTION,
        amount=Decimal("1.00"),
        currency=currency,
        account_token=token,
        now=timezone.now(),
    )


@pytest.mark.parametrize(
    ("direction", "token", "currency"),
    [
        (PaymentDirection.DEBIT, TOKEN, "USD"),
        (PaymentDirection.CREDIT, TOKEN, "USD"),
        (PaymentDirection.DEBIT, "tok_history_never_1", "USD"),
        (PaymentDirection.DEBIT, TOKEN, "CAD"),
    ],
)
def test_the_written_statement_gives_the_figures_the_orm_gives(history, direction, token, currency):
    window = history_window(_entry(direction, token, currency))

    assert history_sums_sql(window) == history_sums_orm(window)


def test_the_figures_count_what_the_rules_count_and_leave_out_the_rest(history):
    window = history_window(_entry(PaymentDirection.DEBIT, TOKEN))

    sums = history_sums_sql(window)

    # Today: the two counted debits in USD; not the failed, canceled, CAD, credit, micro-entry
    # or the other merchant's. The trailing days: the debit of 8 days ago, not older ones.
    # Today's effective banking day may be Monday's on a weekend: a weekend's entries count
    # forward, the Friday's back, so the 8-day-old one lies in the trailing days either way.
    assert sums["today"] == Decimal("30.00")
    assert sums["trailing"] == Decimal("1.00")
    assert sums["first_seen"] < timezone.now() - timedelta(days=199)
    # The account's counted debits at any age: today's and the 200-day-old one.
    assert sums["account_debits"] == 2


def test_a_merchant_without_entries_reads_empty_figures():
    history = MerchantHistory(_entry(PaymentDirection.DEBIT, TOKEN))

    assert (history.today_total, history.daily_mean) == (Decimal("0.00"), Decimal("0.00"))
    assert (history.account_first_seen, history.account_debits) == (None, 0)


def test_the_history_is_read_once_in_one_statement(history, django_assert_num_queries):
    history = MerchantHistory(_entry(PaymentDirection.DEBIT, TOKEN))

    with django_assert_num_queries(1):
        figures = (history.today_total, history.daily_mean, history.account_debits)
        first_seen = history.account_first_seen

    assert figures == (Decimal("30.00"), Decimal("0.03"), 2)
    assert first_seen is not None
