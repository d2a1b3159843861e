"""Reinitiation within NACHA's limits: which returns allow it, how often, how late, the NOC
that blocks it, the API's refusals, the chain, and a race on PostgreSQL."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from payments.exceptions import ReinitiationRefused
from payments.models import (
    MerchantReturnDay,
    NotificationOfChange,
    OutboxMessage,
    Payment,
    PaymentReturn,
    PaymentState,
)
from payments.services import payment_apply_event, payment_reinitiate
from tests.factories import PaymentFactory, grant, processor_event
from tests.waiting import race

pytestmark = pytest.mark.django_db


def _returned(code: str = "R01", *, merchant: str = "m-re", token: str = "tok_reinit_0001", **kw):
    """A payment that settled and came back with ``code``."""
    payment = PaymentFactory(
        state=PaymentState.SUBMITTED,
        merchant_id=merchant,
        source_token=token,
        amount=Decimal("42.00"),
        **kw,
    )
    return _settle_and_return(payment, code)


def _settle_and_return(payment: Payment, code: str | None) -> Payment:
    if payment.state == PaymentState.PENDING:
        Payment.objects.filter(pk=payment.pk).update(state=PaymentState.SUBMITTED)
        payment.refresh_from_db()
    now = timezone.now()
    payment_apply_event(event=processor_event(payment, "settled", timestamp=now))
    if code is not None:
        payment_apply_event(
            event=processor_event(payment, "returned", reason_code=code, timestamp=now)
        )
    payment.refresh_from_db()
    return payment


# --- the rules -----------------------------------------------------------------------------------


@pytest.mark.parametrize("code", ["R01", "R09"])
def test_after_r01_or_r09_a_new_payment_is_made_for_the_same_merchant_amount_and_token(code):
    original = _returned(code, description="invoice 7")
    again = payment_reinitiate(payment_id=original.id, caused_by="api:test")

    assert again.id != original.id and again.state == PaymentState.PENDING
    assert (again.merchant_id, again.amount, again.currency, again.source_token) == (
        original.merchant_id,
        original.amount,
        original.currency,
        original.source_token,
    )
    assert (again.reinitiation_of_id, again.reinitiation_number) == (original.id, 1)
    assert again.description == "invoice 7"
    # Submitted like any new payment: its own idempotency key and submit command.
    assert again.idempotency_key != original.idempotency_key
    assert OutboxMessage.objects.filter(group_id=str(again.id), kind="submit_payment").exists()


def test_at_most_two_reinitiations_per_original_entry():
    original = _returned("R01")
    first = _settle_and_return(payment_reinitiate(payment_id=original.id), "R01")
    second = _settle_and_return(payment_reinitiate(payment_id=first.id), "R01")
    assert (first.reinitiation_number, second.reinitiation_number) == (1, 2)
    assert second.reinitiation_of_id == original.id

    with pytest.raises(ReinitiationRefused) as refused:
        payment_reinitiate(payment_id=second.id)
    assert refused.value.rule == "reinitiation_limit"
    assert Payment.objects.filter(reinitiation_of=original).count() == 2


def test_an_entry_already_reinitiated_is_not_reinitiated_again():
    original = _returned("R01")
    first = payment_reinitiate(payment_id=original.id)
    with pytest.raises(ReinitiationRefused) as refused:
        payment_reinitiate(payment_id=original.id)
    assert refused.value.rule == "not_latest_entry"
    assert str(first.id) in str(refused.value)


def test_a_payment_without_a_return_is_not_reinitiated():
    settled = _settle_and_return(PaymentFactory(state=PaymentState.SUBMITTED), None)
    with pytest.raises(ReinitiationRefused) as refused:
        payment_reinitiate(payment_id=settled.id)
    assert refused.value.rule == "not_returned"


@pytest.mark.parametrize("code", ["R05", "R07", "R08", "R10", "R29", "R51"])
def test_after_an_unauthorized_or_stopped_return_only_a_new_authorization_allows_it(code):
    original = _returned(code)
    with pytest.raises(ReinitiationRefused) as refused:
        payment_reinitiate(payment_id=original.id)
    assert refused.value.rule == "new_authorization_required"
    assert code in str(refused.value)

    again = payment_reinitiate(payment_id=original.id, authorization_reference="auth-2026-11-30")
    assert again.authorization_reference == "auth-2026-11-30"


@pytest.mark.parametrize("code", ["R02", "R03", "R04", "R16", "R99"])
def test_other_returns_are_not_reinitiated(code):
    original = _returned(code)
    with pytest.raises(ReinitiationRefused) as refused:
        payment_reinitiate(payment_id=original.id, authorization_reference="auth-1")
    assert refused.value.rule == "return_code_not_reinitiable"


def test_not_later_than_180_days_after_the_original_entrys_settlement():
    original = _returned("R01")
    settled_at = PaymentReturn.objects.get(payment=original).settled_at
    with pytest.raises(ReinitiationRefused) as refused:
        payment_reinitiate(payment_id=original.id, now=settled_at + timedelta(days=181))
    assert refused.value.rule == "reinitiation_window"
    assert payment_reinitiate(payment_id=original.id, now=settled_at + timedelta(days=179))


def test_not_while_the_token_has_a_noc_open_past_its_deadline():
    original = _returned("R01", token="tok_reinit_noc1")
    payment_apply_event(
        event=processor_event(
            original,
            "notification_of_change",
            change_code="C01",
            corrected_data={"account_number_last4": "6789"},
            timestamp=timezone.now() - timedelta(days=30),
        )
    )
    noc = NotificationOfChange.objects.get(payment=original)
    with pytest.raises(ReinitiationRefused) as refused:
        payment_reinitiate(payment_id=original.id)
    assert refused.value.rule == "notification_of_change_past_deadline"
    assert f"{noc.id} (C01)" in str(refused.value) and "6789" not in str(refused.value)
    assert not Payment.objects.filter(reinitiation_of=original).exists()


def test_return_rates_count_each_entry_once():
    original = _returned("R01", merchant="m-rates")
    _settle_and_return(payment_reinitiate(payment_id=original.id), None)
    day = MerchantReturnDay.objects.get(merchant_id="m-rates")
    # Two entries went to the network, one came back: 1 in 2, not 1 in 1 nor 2 in 3.
    assert (day.debits, day.returns) == (2, 1)


# --- the API -------------------------------------------------------------------------------------


def _post(api_client, payment_id, body=None, key=None):
    headers = {"Idempotency-Key": key} if key else {}
    return api_client.post(
        f"/api/payments/{payment_id}/reinitiate/", body or {}, format="json", headers=headers
    )


def test_the_endpoint_answers_201_with_the_new_payment_and_the_chain(api_client, user):
    grant(user, "m-re")
    original = _returned("R01")
    response = _post(api_client, original.id, key="re-1")

    assert response.status_code == 201
    body = response.json()
    assert body["amount"] == "42.00" and body["state"] == "pending"
    chain = body["reinitiation"]
    assert chain["original_id"] == str(original.id)
    assert chain["reinitiation_number"] == 1
    assert [(e["id"], e["reinitiation_number"]) for e in chain["chain"]] == [
        (str(original.id), None),
        (body["id"], 1),
    ]
    assert chain["chain"][0]["return_code"] == "R01"

    # The same key and body replay the first answer; nothing new is made.
    replay = _post(api_client, original.id, key="re-1")
    assert replay.status_code == 201 and replay.json()["id"] == body["id"]
    assert replay["Idempotent-Replayed"] == "true"
    assert Payment.objects.filter(reinitiation_of=original).count() == 1

    # The detail answer of either entry shows the chain.
    for payment_id in (original.id, body["id"]):
        detail = api_client.get(f"/api/payments/{payment_id}/").json()
        assert [e["id"] for e in detail["reinitiation"]["chain"]] == [str(original.id), body["id"]]


def test_a_payment_outside_any_chain_shows_no_chain(api_client, user):
    grant(user, "m-re")
    payment = PaymentFactory(merchant_id="m-re")
    assert api_client.get(f"/api/payments/{payment.id}/").json()["reinitiation"] is None


def test_the_same_key_on_another_payment_is_refused_422(api_client, user):
    grant(user, "m-re")
    first, second = _returned("R01"), _returned("R01", token="tok_reinit_0002")
    assert _post(api_client, first.id, key="re-shared").status_code == 201
    response = _post(api_client, second.id, key="re-shared")
    assert response.status_code == 422
    assert not Payment.objects.filter(reinitiation_of=second).exists()


def test_a_refusal_is_409_naming_the_rule_and_is_not_stored_under_the_key(api_client, user):
    grant(user, "m-re")
    original = _returned("R10")
    response = _post(api_client, original.id, key="re-409")
    assert response.status_code == 409
    error = response.json()["error"]
    assert error["code"] == "new_authorization_required"
    assert "R10" in error["message"] and error["param"] == "payment_id"

    # With the authorization stated it is another request: it executes.
    ok = _post(api_client, original.id, {"authorization_reference": "auth-77"}, key="re-409b")
    assert ok.status_code == 201
    assert ok.json()["reinitiation"]["authorization_reference"] == "auth-77"


def test_another_merchants_payment_answers_404_like_the_detail(api_client, user):
    grant(user, "m-mine")
    theirs = _returned("R01", merchant="m-theirs")
    response = _post(api_client, theirs.id)
    detail = api_client.get(f"/api/payments/{theirs.id}/")
    assert response.status_code == detail.status_code == 404
    assert response.json()["error"]["code"] == detail.json()["error"]["code"]
    assert not Payment.objects.filter(reinitiation_of=theirs).exists()


@pytest.mark.parametrize("payment_id", ["not-a-uuid", "00000000-0000-0000-0000-000000000000"])
def test_an_unknown_payment_answers_404(api_client, payment_id):
    response = _post(api_client, payment_id)
    assert response.status_code == 404
    assert response.json()["error"]["param"] == "payment_id"


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({"amount": "1.00"}, "amount", "unknown field"),
        ({"authorization_reference": 12}, "authorization_reference", "JSON string"),
        ({"authorization_reference": "a b"}, "authorization_reference", "1-64"),
        ({"authorization_reference": "x" * 65}, "authorization_reference", "64"),
        ({"authorization_reference": "021000021"}, "authorization_reference", "bank account"),
        ({"authorization_reference": "a\x00b"}, "authorization_reference", "NUL"),
    ],
)
def test_hostile_bodies_are_refused_400_naming_the_field(api_client, user, body, field, words):
    grant(user, "m-re")
    original = _returned("R01")
    response = _post(api_client, original.id, body)
    assert response.status_code == 400
    errors = response.json()["error"]["errors"]
    assert words in " ".join(errors[field]), errors
    assert "021000021" not in response.content.decode()
    assert not Payment.objects.filter(reinitiation_of=original).exists()


def test_a_body_that_is_not_an_object_is_refused_400(api_client, user):
    grant(user, "m-re")
    original = _returned("R01")
    response = api_client.post(
        f"/api/payments/{original.id}/reinitiate/", "[1]", content_type="application/json"
    )
    assert response.status_code == 400


# --- the race ------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("attempt", range(3))
def test_two_concurrent_reinitiations_of_the_same_payment_make_one(attempt):
    original = _returned("R01")
    results = race(
        lambda: payment_reinitiate(payment_id=original.id),
        lambda: payment_reinitiate(payment_id=original.id),
    )
    made = [r for r in results if isinstance(r, Payment)]
    refused = [r for r in results if isinstance(r, ReinitiationRefused)]
    assert len(made) == 1 and len(refused) == 1, results
    assert refused[0].rule == "not_latest_entry"
    assert Payment.objects.filter(reinitiation_of=original).count() == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("attempt", range(3))
def test_concurrent_reinitiations_at_the_limit_never_make_a_third(attempt):
    original = _returned("R01")
    first = _settle_and_return(payment_reinitiate(payment_id=original.id), "R01")
    # Two threads on the last entry and one on the original: at most the second is made.
    results = race(
        lambda: payment_reinitiate(payment_id=first.id),
        lambda: payment_reinitiate(payment_id=first.id),
        lambda: payment_reinitiate(payment_id=original.id),
    )
    made = [r for r in results if isinstance(r, Payment)]
    assert len(made) == 1, results
    assert all(isinstance(r, Payment | ReinitiationRefused) for r in results), results
    assert sorted(
        Payment.objects.filter(reinitiation_of=original).values_list(
            "reinitiation_number", flat=True
        )
    ) == [1, 2]


# --- a return's dishonor ---------------------------------------------------------------------


def test_a_return_whose_dishonor_stood_is_not_reinitiated_the_money_is_back():
    original = _returned("R01")
    payment_apply_event(event=processor_event(original, "return_dishonored", reason_code="R61"))

    with pytest.raises(ReinitiationRefused) as refused:
        payment_reinitiate(payment_id=original.id)

    assert refused.value.rule == "return_dishonored"
    assert Payment.objects.filter(reinitiation_of=original).count() == 0


def test_a_contested_dishonor_leaves_the_return_standing_and_reinitiable():
    original = _returned("R01")
    payment_apply_event(event=processor_event(original, "return_dishonored", reason_code="R61"))
    payment_apply_event(event=processor_event(original, "dishonor_contested", reason_code="R76"))

    again = payment_reinitiate(payment_id=original.id)

    assert again.reinitiation_of_id == original.id


@pytest.mark.parametrize(
    ("status", "last_outcome", "refused_rule"),
    [
        ("requested", None, "dishonor_pending"),
        ("sent", "accepted", "dishonor_pending"),
        ("failed", "retryable", "dishonor_pending"),  # no answer: the processor may have it
        ("failed", "rejected", None),  # refused: the processor never took it
    ],
)
def test_a_dishonor_awaiting_its_answer_blocks_a_reinitiation_one_never_taken_does_not(
    status, last_outcome, refused_rule
):
    from payments.models import ProcessorAttempt, ReturnDishonor

    original = _returned("R01")
    dishonor = ReturnDishonor.objects.create(
        payment=original,
        ach_return=original.ach_return,
        merchant_id=original.merchant_id,
        reason_code="R61",
        note="late return",
        request_status=status,
        requested_at=timezone.now(),
    )
    if last_outcome is not None:
        ProcessorAttempt.objects.create(
            payment=original,
            attempt_number=1,
            operation="dishonor",
            idempotency_key=dishonor.idempotency_key,
            outcome=last_outcome,
            latency_ms=1.0,
            started_at=timezone.now(),
        )

    if refused_rule is None:
        assert payment_reinitiate(payment_id=original.id).reinitiation_of_id == original.id
        return
    with pytest.raises(ReinitiationRefused) as refused:
        payment_reinitiate(payment_id=original.id)
    assert refused.value.rule == refused_rule
