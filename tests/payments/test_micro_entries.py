"""Micro-entries are money like any other payment, on the processor backend (the sandbox over
HTTP): two credits and their offsetting debit, each a payment of ``purpose=micro_entry``, sent
exactly once however often the start is retried or raced, settled into the ledger of the
account ``PAYMENTS["MICRO_ENTRY_COST"]`` names, a returned credit failing the validation (and
its held debits, once), a NOC recorded; and never shown to the merchant: no event, no API
list or retrieve, no log line with an amount."""

import logging
from decimal import Decimal

import pytest
from django.db.models import Sum
from django.utils import timezone

from payments.exceptions import ValidationRefused
from payments.models import (
    HOUSE_ACCOUNT,
    AccountValidation,
    LedgerEntry,
    NotificationOfChange,
    OutboxMessage,
    Payment,
    PaymentEvent,
    PaymentState,
    ReviewStatus,
    ValidationState,
)
from payments.selectors import merchant_balances
from payments.services import payment_apply_event, payment_create, payment_submit
from payments.services.limits import exposure_limits_for, exposure_used
from payments.services.validation import (
    account_validation_start,
    account_validations_advance,
    micro_entries_verify,
)
from payments.webhooks.delivery import events_dispatch
from payments.webhooks.models import Event
from tests.factories import grant, processor_event
from tests.waiting import race

MERCHANT = "m-micro"
TOKEN = "tok_micro_0001"


def _start(token: str = TOKEN) -> AccountValidation:
    return account_validation_start(
        account_token=token, merchant_id=MERCHANT, method="micro_entries"
    )


def _entries(validation: AccountValidation) -> tuple[list[Payment], Payment]:
    ids = validation.evidence["micro_entries"]["payments"]
    rows = sorted(Payment.objects.filter(pk__in=ids), key=lambda p: ids.index(str(p.pk)))
    *credits, debit = rows
    return credits, debit


def _submit_all(validation: AccountValidation) -> None:
    credits, debit = _entries(validation)
    for entry in (*credits, debit):
        payment_submit(payment_id=entry.pk)


def _event(entry: Payment, event_type: str, **fields):
    return processor_event(entry, event_type, direction=entry.direction, **fields)


def _settle_all(validation: AccountValidation) -> None:
    credits, debit = _entries(validation)
    for entry in (*credits, debit):
        payment_apply_event(event=_event(entry, "settled"))


def _amounts(sandbox, validation: AccountValidation) -> list[str]:
    credits, _ = _entries(validation)
    return [f"{Decimal(sandbox.credit(str(c.idempotency_key)).amount):.2f}" for c in credits]


def _net(account: str) -> Decimal:
    return LedgerEntry.objects.filter(merchant_id=account).exclude(status="archived").aggregate(
        total=Sum("amount")
    )["total"] or Decimal("0")


@pytest.fixture
def hold(module_settings):
    module_settings.UNVALIDATED_WEB_DEBITS = "hold"


def _web_held(token: str = TOKEN) -> Payment:
    payment = payment_create(
        merchant_id=MERCHANT, amount=Decimal("20.00"), source_token=token, sec_code="WEB"
    )
    assert payment.review_status == ReviewStatus.VALIDATION
    return payment


# --- sent exactly once --------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_start_writes_three_payments_with_their_submit_commands_in_its_transaction(sandbox):
    validation = _start()

    credits, debit = _entries(validation)
    assert [c.direction for c in credits] == ["credit", "credit"]
    assert debit.direction == "debit" and debit.amount == sum(c.amount for c in credits)
    for entry in (*credits, debit):
        assert (entry.purpose, entry.sec_code, entry.entry_description, entry.state) == (
            "micro_entry",
            "PPD",
            "ACCTVERIFY",
            PaymentState.PENDING,
        )
        assert entry.account_validation_id == validation.pk
        commands = OutboxMessage.objects.filter(group_id=str(entry.pk), kind="submit_payment")
        assert commands.count() == 1
        # The audit row keeps no amount.
        (created,) = PaymentEvent.objects.filter(payment=entry)
        assert created.payload["amount"] == "(micro-entry)"


@pytest.mark.django_db
def test_a_retried_start_writes_nothing_more_and_a_retried_submission_sends_once(sandbox):
    validation = _start()
    with pytest.raises(ValidationRefused) as again:
        _start()
    assert again.value.rule == "account_validation_in_progress"

    _submit_all(validation)
    _submit_all(validation)

    assert Payment.objects.filter(purpose="micro_entry").count() == 3
    sent = sandbox.stats()
    assert (sent["total_credits_sent"], sent["total_charges"]) == (2, 1)
    credits, debit = _entries(validation)
    assert set(sent["credits_sent_by_payment"].values()) == {1}
    assert debit.pk and all(c.pk for c in credits)


@pytest.mark.django_db(transaction=True)
def test_two_starts_racing_write_one_round(sandbox):
    results = race(_start, _start)

    started = [r for r in results if isinstance(r, AccountValidation)]
    refused = [r for r in results if isinstance(r, ValidationRefused)]
    assert len(started) == 1 and len(refused) == 1, results
    assert refused[0].rule == "account_validation_in_progress"
    assert Payment.objects.filter(purpose="micro_entry").count() == 3
    assert OutboxMessage.objects.filter(kind="submit_payment").count() == 3


# --- settled, verified, in the ledger -----------------------------------------------------------


@pytest.mark.django_db
def test_settled_micro_entries_net_to_zero_on_the_house_account_and_verify(sandbox, hold):
    held = _web_held()
    validation = _start()
    _submit_all(validation)
    amounts = _amounts(sandbox, validation)
    credits, debit = _entries(validation)
    # In flight: the credits' money is out of the house's account, none of the merchant's.
    assert _net(HOUSE_ACCOUNT) == -sum(c.amount for c in credits)

    _settle_all(validation)
    verified = micro_entries_verify(account_token=TOKEN, merchant_id=MERCHANT, amounts=amounts)

    assert verified.state == ValidationState.VALIDATED
    for entry in (*credits, debit):
        entry.refresh_from_db()
        assert entry.state == PaymentState.CONFIRMED
    kinds = sorted(
        LedgerEntry.objects.filter(merchant_id=HOUSE_ACCOUNT).values_list("kind", "status")
    )
    assert kinds == [("credit", "posted"), ("micro_entry", "posted"), ("micro_entry", "posted")]
    assert _net(HOUSE_ACCOUNT) == 0
    assert not LedgerEntry.objects.filter(merchant_id=MERCHANT).exists()
    held.refresh_from_db()
    assert held.review_status == ReviewStatus.NONE


@pytest.mark.django_db
def test_with_the_merchants_cost_the_round_is_on_its_ledger_and_its_balance(
    sandbox, module_settings
):
    module_settings.MICRO_ENTRY_COST = "merchant"
    validation = _start()
    credits, _ = _entries(validation)
    _submit_all(validation)
    in_flight = sum(c.amount for c in credits)

    balance = merchant_balances(merchant_id=MERCHANT)["balances"][0]
    assert Decimal(balance["pending"]) == -in_flight
    _settle_all(validation)

    assert _net(MERCHANT) == 0
    assert not LedgerEntry.objects.filter(merchant_id=HOUSE_ACCOUNT).exists()
    assert LedgerEntry.objects.filter(merchant_id=MERCHANT).count() == 3


@pytest.mark.parametrize("cost", ["house", "merchant"])
@pytest.mark.django_db
def test_a_returned_offsetting_debit_leaves_the_cost_where_the_setting_says(
    sandbox, module_settings, cost
):
    module_settings.MICRO_ENTRY_COST = cost
    account = HOUSE_ACCOUNT if cost == "house" else MERCHANT
    validation = _start()
    _submit_all(validation)
    _settle_all(validation)
    credits, debit = _entries(validation)

    payment_apply_event(event=_event(debit, "returned", reason_code="R01"))

    debit.refresh_from_db()
    assert debit.state == PaymentState.RETURNED
    assert _net(account) == -sum(c.amount for c in credits)
    # The credits arrived: the amounts can still be read, the validation waits for them.
    validation.refresh_from_db()
    assert validation.state == ValidationState.PENDING


# --- a returned credit, a NOC ------------------------------------------------------------------


@pytest.mark.django_db
def test_a_credit_returned_r03_fails_the_validation_and_its_held_debits_once(sandbox, hold):
    held = [_web_held(), _web_held()]
    validation = _start()
    _submit_all(validation)
    credits, debit = _entries(validation)
    returned = _event(credits[0], "returned", reason_code="R03")

    payment_apply_event(event=returned)
    payment_apply_event(event=returned)
    payment_apply_event(event=_event(credits[1], "returned", reason_code="R03"))
    # The periodic round finds the returned credits failed by their return: nothing to do.
    assert account_validations_advance() == 0

    validation.refresh_from_db()
    assert validation.state == ValidationState.FAILED
    assert validation.failure_reason == "micro-entry returned R03"
    assert validation.evidence["return"]["code"] == "R03"
    for payment in held:
        payment.refresh_from_db()
        assert payment.state == PaymentState.FAILED
        failures = PaymentEvent.objects.filter(
            payment=payment, event_type="account_validation_failed"
        )
        assert [row.payload["reason"] for row in failures] == ["micro-entry returned R03"]
    # The money: each returned credit came back to the house, once.
    assert LedgerEntry.objects.filter(kind="micro_entry_return").count() == 2
    with pytest.raises(ValidationRefused) as late:
        micro_entries_verify(
            account_token=TOKEN, merchant_id=MERCHANT, amounts=_amounts(sandbox, validation)
        )
    assert late.value.rule == "validation_not_verifiable"


@pytest.mark.django_db
def test_a_credit_the_processor_refuses_fails_the_validation_and_its_held_debits_once(
    sandbox, hold
):
    token = "tok_reject_micro_0001"
    held = _web_held(token)
    validation = _start(token)

    _submit_all(validation)
    assert account_validations_advance() == 1
    assert account_validations_advance() == 0

    credits, debit = _entries(validation)
    for entry in (*credits, debit):
        entry.refresh_from_db()
        assert entry.state == PaymentState.FAILED
    validation.refresh_from_db()
    assert validation.state == ValidationState.FAILED
    assert validation.failure_reason == "a micro-entry credit failed and was not sent"
    held.refresh_from_db()
    assert held.state == PaymentState.FAILED
    failures = PaymentEvent.objects.filter(payment=held, event_type="account_validation_failed")
    assert failures.count() == 1
    # Nothing moved: the credits' held entries are archived.
    assert _net(HOUSE_ACCOUNT) == 0


@pytest.mark.django_db
def test_a_failed_event_for_a_sent_credit_fails_the_validation(sandbox):
    validation = _start()
    _submit_all(validation)
    credits, _ = _entries(validation)

    payment_apply_event(event=_event(credits[1], "failed"))
    assert account_validations_advance() == 1

    validation.refresh_from_db()
    assert validation.state == ValidationState.FAILED
    assert validation.evidence["failed"] == {"payment_id": str(credits[1].pk)}


@pytest.mark.django_db
def test_a_return_of_an_earlier_rounds_credit_does_not_fail_the_new_round(sandbox):
    first = _start()
    _submit_all(first)
    with pytest.raises(ValidationRefused):  # the first round expires unverified
        micro_entries_verify(
            account_token=TOKEN,
            merchant_id=MERCHANT,
            amounts=_amounts(sandbox, first),
            now=first.expires_at,
        )
    second = _start()
    old_credits, _ = _entries(first)

    payment_apply_event(event=_event(old_credits[0], "returned", reason_code="R03"))

    second.refresh_from_db()
    assert second.state == ValidationState.PENDING


@pytest.mark.django_db
def test_a_noc_on_a_micro_entry_is_recorded_on_the_validation(sandbox):
    validation = _start()
    _submit_all(validation)
    credits, _ = _entries(validation)
    payment_apply_event(event=_event(credits[0], "settled"))

    payment_apply_event(
        event=_event(
            credits[0],
            "notification_of_change",
            change_code="C01",
            corrected_data={"account_number_last4": "4321"},
        )
    )

    validation.refresh_from_db()
    assert validation.state == ValidationState.UNVALIDATED
    (noc,) = NotificationOfChange.objects.filter(payment=credits[0])
    assert validation.evidence["nocs"] == [
        {"change_code": "C01", "source": "noc_received", "noc_id": noc.pk}
    ]


# --- never shown to the merchant ------------------------------------------------------------------


@pytest.mark.django_db
def test_the_merchant_never_sees_a_micro_entry_in_the_api_or_its_events(sandbox, api_client, user):
    grant(user, MERCHANT)
    validation = _start()
    _submit_all(validation)
    _settle_all(validation)
    credits, debit = _entries(validation)

    listed = api_client.get("/api/payments/", {"merchant": MERCHANT})
    filtered = api_client.get("/api/payments/", {"purpose": "micro_entry"})
    answers = [api_client.get(f"/api/payments/{entry.pk}/") for entry in (*credits, debit)]
    cancel = api_client.post(f"/api/payments/{debit.pk}/cancel/", {}, format="json")
    refund = api_client.post(
        f"/api/payments/{debit.pk}/refunds/", {"amount": "0.01"}, format="json"
    )

    assert listed.status_code == 200 and listed.json()["results"] == []
    assert filtered.status_code == 400
    assert filtered.json()["error"]["param"] == "purpose"
    assert {a.status_code for a in answers} == {404}
    assert cancel.status_code == 404 and refund.status_code == 404
    assert not Event.objects.exists()
    assert api_client.get("/api/events/", {"merchant": MERCHANT}).json()["data"] == []


@pytest.mark.django_db
def test_no_log_line_carries_a_micro_entry_amount(sandbox, caplog):
    caplog.set_level(logging.DEBUG)
    validation = _start()
    _submit_all(validation)
    _settle_all(validation)
    credits, debit = _entries(validation)

    for entry in (*credits, debit):
        text = f"{entry.amount:.2f}"
        assert not [r for r in caplog.records if text in r.getMessage()], text


@pytest.mark.django_db
def test_a_first_large_debit_after_micro_entries_is_still_the_accounts_first(
    sandbox, module_settings
):
    off = {"enabled": False}
    module_settings.FRAUD_RULES = {
        "new_destination": off,
        "velocity": off,
        "first_large_debit": {"amount": "500.00"},
    }
    validation = _start()
    _submit_all(validation)
    amounts = _amounts(sandbox, validation)
    _settle_all(validation)
    micro_entries_verify(account_token=TOKEN, merchant_id=MERCHANT, amounts=amounts)

    debit = payment_create(
        merchant_id=MERCHANT, amount=Decimal("500.01"), source_token=TOKEN, sec_code="WEB"
    )

    assert (debit.review_status, debit.review_rule) == (ReviewStatus.HELD, "first_large_debit")


@pytest.mark.django_db
def test_a_round_on_the_house_shows_in_none_of_the_merchants_figures(sandbox, api_client, user):
    grant(user, MERCHANT)
    collected = payment_create(
        merchant_id=MERCHANT, amount=Decimal("5.00"), source_token="tok_micro_ppd", sec_code="PPD"
    )
    payment_submit(payment_id=collected.pk)
    payment_apply_event(event=processor_event(collected, "settled"))
    validation = _start()
    _submit_all(validation)
    _settle_all(validation)

    balance = api_client.get(f"/api/merchants/{MERCHANT}/balance/").json()
    limits = {
        direction: exposure_used(
            merchant_id=MERCHANT,
            direction=direction,
            currency="USD",
            limits=exposure_limits_for(merchant_id=MERCHANT, direction=direction, currency="USD")[
                0
            ],
            now=timezone.now(),
        )[1]
        for direction in ("debit", "credit")
    }

    (usd,) = balance["balances"]
    assert (usd["confirmed_count"], usd["confirmed_total"], usd["net"]) == (1, "5.00", "5.00")
    assert limits == {"debit": Decimal("5.00"), "credit": Decimal("0.00")}


# --- the merchant is told the outcome -----------------------------------------------------------


@pytest.mark.django_db
def test_the_merchant_is_told_once_that_an_account_is_validated_and_never_the_amounts(
    sandbox, api_client, user
):
    grant(user, MERCHANT)
    validation = _start()
    _submit_all(validation)
    _settle_all(validation)
    amounts = _amounts(sandbox, validation)
    micro_entries_verify(account_token=TOKEN, merchant_id=MERCHANT, amounts=amounts)
    with pytest.raises(ValidationRefused):
        micro_entries_verify(account_token=TOKEN, merchant_id=MERCHANT, amounts=amounts)

    events = list(Event.objects.filter(merchant_id=MERCHANT))
    assert [e.type for e in events] == ["account_validation.validated"]
    shown = events[0].data["object"]
    assert shown["object"] == "account_validation"
    assert (shown["id"], shown["account_token"]) == (str(validation.pk), TOKEN)
    assert (shown["state"], shown["method"], shown["attempts_left"]) == (
        "validated",
        "micro_entries",
        0,
    )
    assert not any(amount in str(shown) for amount in amounts)
    events_dispatch()
    listed = api_client.get("/api/events/", {"merchant": MERCHANT}).json()["data"]
    assert [e["type"] for e in listed] == ["account_validation.validated"]
    assert listed[0]["data"]["object"]["account_token"] == TOKEN
    answer = api_client.get(f"/api/accounts/{TOKEN}/validation/").json()
    assert answer["id"] == shown["id"] and answer["object"] == "account_validation"


@pytest.mark.django_db
def test_the_merchant_is_told_once_that_a_validation_failed_after_its_last_wrong_try(sandbox):
    validation = _start()
    _submit_all(validation)
    _settle_all(validation)
    right = sorted(Decimal(amount) for amount in _amounts(sandbox, validation))
    # The larger one cent off, inside the 0.01-0.99 a statement may show: wrong whatever the
    # draw (the two may be equal; one cent over a 0.99 would be refused as no amount at all).
    cent = Decimal("0.01") if right[1] < Decimal("0.99") else Decimal("-0.01")
    wrong = [f"{right[0]:.2f}", f"{right[1] + cent:.2f}"]
    for _ in range(3):
        with pytest.raises(ValidationRefused):
            micro_entries_verify(account_token=TOKEN, merchant_id=MERCHANT, amounts=wrong)

    events = list(Event.objects.filter(merchant_id=MERCHANT))
    assert [e.type for e in events] == ["account_validation.failed"]
    shown = events[0].data["object"]
    assert (shown["state"], shown["attempts"]) == ("failed", 3)
    assert shown["failure_reason"] == "micro-entry amounts wrong too often"
    validation.refresh_from_db()
    assert shown["id"] == str(validation.pk)
