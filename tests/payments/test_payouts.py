"""Payouts from a merchant's available balance: checked and held in one transaction, so twenty
concurrent payouts never overdraw; refused with 409 naming the rule; a returned payout puts the
money back once; hostile bodies get a 400 naming the field."""

import json
from decimal import Decimal

import pytest

from payments.exceptions import MoneyOutRefused
from payments.models import (
    LedgerEntry,
    LedgerEntryKind,
    LedgerEntryStatus,
    Payment,
    PaymentPurpose,
    PaymentState,
)
from payments.selectors import merchant_money_figures
from payments.services import payment_apply_event
from payments.services.payouts import payout_create
from tests.factories import PaymentFactory, grant, processor_event
from tests.waiting import race, race_in_order

pytestmark = pytest.mark.django_db

TOKEN = "tok_payout_acct_0001"


@pytest.fixture(autouse=True)
def available_at_once(module_settings):
    module_settings.AVAILABLE_AFTER_BANKING_DAYS = 0


def _collected(merchant: str, amount: str) -> Payment:
    """A debit settled through the apply path: its credit posted and, at once, available."""
    debit = PaymentFactory(
        merchant_id=merchant, state=PaymentState.SUBMITTED, amount=Decimal(amount)
    )
    payment_apply_event(event=processor_event(debit, "settled"))
    return debit


def _available(merchant: str) -> Decimal:
    return Decimal(merchant_money_figures(merchant_id=merchant)["USD"]["available"])


def test_a_payout_holds_its_money_pending_and_posts_it_when_it_settles():
    _collected("acme", "100.00")
    payout = payout_create(merchant_id="acme", amount=Decimal("60.00"), destination_token=TOKEN)

    assert (payout.purpose, payout.direction, payout.state) == ("payout", "credit", "pending")
    entry = LedgerEntry.objects.get(payment=payout)
    assert (entry.kind, entry.amount, entry.status) == ("payout", Decimal("-60.00"), "pending")
    assert _available("acme") == Decimal("40.00")

    Payment.objects.filter(pk=payout.pk).update(state=PaymentState.SUBMITTED)
    payout.refresh_from_db()
    payment_apply_event(event=processor_event(payout, "settled", direction="credit"))
    entry.refresh_from_db()
    assert entry.status == LedgerEntryStatus.POSTED


def test_a_payout_over_the_available_balance_is_refused_and_writes_nothing():
    _collected("acme", "50.00")
    with pytest.raises(MoneyOutRefused) as refused:
        payout_create(merchant_id="acme", amount=Decimal("50.01"), destination_token=TOKEN)
    assert refused.value.rule == "insufficient_available_balance"
    assert not Payment.objects.filter(purpose=PaymentPurpose.PAYOUT).exists()


def test_money_inside_the_return_reserve_is_not_available(module_settings):
    from django.utils import timezone

    module_settings.AVAILABLE_AFTER_BANKING_DAYS = 2
    debit = PaymentFactory(merchant_id="acme", state=PaymentState.SUBMITTED, amount=Decimal("50"))
    payment_apply_event(event=processor_event(debit, "settled", timestamp=timezone.now()))
    with pytest.raises(MoneyOutRefused):
        payout_create(merchant_id="acme", amount=Decimal("1.00"), destination_token=TOKEN)


def test_a_return_after_a_payout_shows_a_negative_balance_and_refuses_the_next():
    debit = _collected("acme", "80.00")
    payout_create(merchant_id="acme", amount=Decimal("80.00"), destination_token=TOKEN)
    payment_apply_event(event=processor_event(debit, "returned", reason_code="R10"))

    assert _available("acme") == Decimal("-80.00")  # shown, never hidden
    _collected("acme", "30.00")
    with pytest.raises(MoneyOutRefused, match="exceeds the -50.00 USD available"):
        payout_create(merchant_id="acme", amount=Decimal("1.00"), destination_token=TOKEN)


def test_a_returned_payout_puts_the_money_back_once():
    _collected("acme", "100.00")
    payout = payout_create(merchant_id="acme", amount=Decimal("100.00"), destination_token=TOKEN)
    Payment.objects.filter(pk=payout.pk).update(state=PaymentState.SUBMITTED)
    payout.refresh_from_db()
    payment_apply_event(event=processor_event(payout, "settled", direction="credit"))
    returned = processor_event(payout, "returned", reason_code="R03")
    payment_apply_event(event=returned)
    payment_apply_event(event=returned)

    back = LedgerEntry.objects.filter(payment=payout, kind=LedgerEntryKind.PAYOUT_RETURN)
    assert [e.amount for e in back] == [Decimal("100.00")]
    assert _available("acme") == Decimal("100.00")


@pytest.mark.django_db(transaction=True)
def test_twenty_concurrent_payouts_never_overdraw():
    _collected("acme", "100.00")

    results = race(
        *(
            lambda: payout_create(
                merchant_id="acme", amount=Decimal("15.00"), destination_token=TOKEN
            )
            for _ in range(20)
        )
    )

    made = [r for r in results if isinstance(r, Payment)]
    refused = [r for r in results if isinstance(r, MoneyOutRefused)]
    assert (len(made), len(refused)) == (6, 14), results  # 6 x 15.00 = 90.00 of 100.00
    assert {r.rule for r in refused} == {"insufficient_available_balance"}
    assert _available("acme") == Decimal("10.00")


# --- the API -----------------------------------------------------------------------------------


def _post(client, body, **headers):
    data = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return client.post("/api/payouts/", data, content_type="application/json", **headers)


def test_the_api_answers_201_with_the_payout_and_replays_its_key(api_client, user):
    grant(user, "acme")
    _collected("acme", "100.00")
    body = {"merchant_id": "acme", "amount": "25.00", "destination_token": TOKEN}

    first = _post(api_client, body, HTTP_IDEMPOTENCY_KEY="po-1")
    again = _post(api_client, body, HTTP_IDEMPOTENCY_KEY="po-1")

    assert first.status_code == 201, first.json()
    assert set(first.json()) == {
        "id",
        "object",
        "merchant_id",
        "amount",
        "currency",
        "state",
        "idempotency_key",
        "description",
        "destination",
        "metadata",
        "created_at",
        "updated_at",
        "sec_code",
        "entry_description",
    }
    assert first.json()["object"] == "payout"
    # A processor token carries no digits the module may read.
    assert first.json()["destination"] == {"token": body["destination_token"], "last4": None}
    assert again.json() == first.json()
    assert Payment.objects.filter(purpose=PaymentPurpose.PAYOUT).count() == 1


def test_the_api_refuses_an_overdraft_with_409_and_another_merchant_with_403(api_client, user):
    grant(user, "acme")
    _collected("acme", "10.00")
    _collected("globex", "500.00")

    over = _post(api_client, {"merchant_id": "acme", "amount": "10.01", "destination_token": TOKEN})
    theirs = _post(
        api_client, {"merchant_id": "globex", "amount": "1.00", "destination_token": TOKEN}
    )

    assert over.status_code == 409
    assert over.json()["error"]["code"] == "insufficient_available_balance"
    assert theirs.status_code == 403
    assert not Payment.objects.filter(purpose=PaymentPurpose.PAYOUT).exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"amount": "1.00", "destination_token": TOKEN}, "merchant_id"),
        ({"merchant_id": "acme", "amount": "NaN", "destination_token": TOKEN}, "amount"),
        (
            {"merchant_id": "acme", "amount": "1.00", "destination_token": "77668056869313516"},
            "destination_token",
        ),
        (
            {"merchant_id": "acme", "amount": "1.00", "destination_token": "tok\u0000bad_____"},
            "destination_token",
        ),
        (
            {
                "merchant_id": "acme",
                "amount": "1.00",
                "destination_token": TOKEN,
                "currency": "EUR",
            },
            "currency",
        ),
        ({"merchant_id": "acme", "amount": "1.00", "destination_token": TOKEN, "x": 1}, "x"),
        (
            {"merchant_id": "acme\ud800", "amount": "1.00", "destination_token": TOKEN},
            "merchant_id",
        ),
    ],
    ids=["no-merchant", "nan", "bank-number", "nul", "currency", "unknown-field", "surrogate"],
)
def test_hostile_bodies_answer_400_naming_the_field(api_client, user, body, field):
    grant(user, "acme")
    _collected("acme", "100.00")
    response = _post(api_client, body)
    assert response.status_code == 400, response.content
    assert field in response.json()["error"]["errors"]
    assert "77668056869313516" not in response.content.decode()
    assert not Payment.objects.filter(purpose=PaymentPurpose.PAYOUT).exists()


def test_the_reserve_counts_from_the_settled_events_timestamp_not_its_late_callback(
    module_settings,
):
    from datetime import timedelta

    from django.utils import timezone

    module_settings.AVAILABLE_AFTER_BANKING_DAYS = 2
    debit = PaymentFactory(merchant_id="acme", state=PaymentState.SUBMITTED, amount=Decimal("50"))
    # Settled ten days ago by the processor's word; its callback is applied only now.
    settled_then = timezone.now() - timedelta(days=10)
    payment_apply_event(event=processor_event(debit, "settled", timestamp=settled_then))

    assert LedgerEntry.objects.get(payment=debit).posted_at == settled_then
    assert _available("acme") == Decimal("50.00")


@pytest.mark.django_db(transaction=True)
def test_refunds_and_payouts_racing_for_one_merchants_money_never_overdraw():
    from chaos.invariants.money_out import check_payouts
    from chaos.invariants.report import Report
    from payments.services.refunds import refund_create

    debits = [_collected("acme", "50.00") for _ in range(4)]  # 200.00 available
    refunds = [lambda d=d: refund_create(payment_id=d.id, amount=Decimal("30.00")) for d in debits]
    payouts = [
        lambda: payout_create(merchant_id="acme", amount=Decimal("25.00"), destination_token=TOKEN)
        for _ in range(8)
    ]

    results = race(*refunds, *payouts)

    assert all(isinstance(r, Payment) for r in results[:4]), results  # refunds do not wait on it
    made = [r for r in results[4:] if isinstance(r, Payment)]
    refused = [r for r in results[4:] if isinstance(r, MoneyOutRefused)]
    assert len(made) + len(refused) == 8 and 3 <= len(made) <= 8, results
    # Refunds come out of collected money whatever the balance; payouts only out of what was
    # available when each read it, which the replay below holds each one to.
    assert _available("acme") == Decimal("200.00") - 4 * Decimal("30.00") - 25 * len(made)
    report = Report()
    check_payouts(report)
    assert report.ok, report.render()


@pytest.mark.django_db(transaction=True)
def test_a_payout_waits_for_a_refund_in_flight_and_reads_the_balance_after_it():
    from payments.services.refunds import refund_create

    refunded, _ = _collected("acme", "50.00"), _collected("acme", "50.00")  # 100.00 available

    [result] = race_in_order(
        lambda: refund_create(payment_id=refunded.id, amount=Decimal("50.00")),
        lambda: payout_create(merchant_id="acme", amount=Decimal("60.00"), destination_token=TOKEN),
    )

    # It waited on the refund's share of the merchant's lock: it read 50.00, not 100.00.
    assert isinstance(result, MoneyOutRefused), result
    assert result.rule == "insufficient_available_balance"
    assert _available("acme") == Decimal("50.00")


def test_a_payout_of_wages_is_described_payroll_and_any_other_payout(api_client, user):
    grant(user, "acme")
    _collected("acme", "100.00")
    body = {"merchant_id": "acme", "amount": "5.00", "destination_token": TOKEN}

    wages = _post(api_client, {**body, "payroll": True})
    other = _post(api_client, body)
    refused = _post(api_client, {**body, "payroll": "yes please"})

    assert wages.status_code == 201, wages.json()
    assert (wages.json()["entry_description"], wages.json()["sec_code"]) == ("PAYROLL", "PPD")
    assert other.json()["entry_description"] == "PAYOUT"
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "payroll"
    assert Payment.objects.filter(purpose="payout").count() == 2
