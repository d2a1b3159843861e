"""``POST /api/payments/<id>/refunds/`` and the refunds on ``GET /api/payments/<id>/``: 201 with
the refund, 409 naming the rule, 404 for what the caller may not see, 400 naming what is wrong
with hostile input, and the Idempotency-Key's replay."""

import json
from decimal import Decimal

import pytest

from payments.models import Payment, PaymentState
from tests.factories import PaymentFactory, grant

pytestmark = pytest.mark.django_db


def _refund(client, payment_id, body, **headers):
    return client.post(
        f"/api/payments/{payment_id}/refunds/",
        json.dumps(body) if not isinstance(body, (str, bytes)) else body,
        content_type="application/json",
        **headers,
    )


@pytest.fixture
def debit(user):
    grant(user, "acme")
    return PaymentFactory(merchant_id="acme", state=PaymentState.CONFIRMED, amount=Decimal("80"))


def test_a_refund_answers_201_and_shows_on_its_payment(api_client, debit):
    response = _refund(
        api_client,
        debit.id,
        {"amount": "30.00", "reason": "returned goods", "metadata": {"o": "1"}},
    )

    assert response.status_code == 201, response.json()
    body = response.json()
    assert set(body) == {
        "id",
        "object",
        "payment_id",
        "merchant_id",
        "updated_at",
        "amount",
        "currency",
        "state",
        "idempotency_key",
        "reason",
        "metadata",
        "double_loss",
        "created_at",
        "sec_code",
        "entry_description",
    }
    assert body["entry_description"] == "REFUND"
    assert (body["payment_id"], body["amount"], body["state"]) == (
        str(debit.id),
        "30.00",
        "pending",
    )
    shown = api_client.get(f"/api/payments/{debit.id}/").json()
    assert shown["refundable_amount"] == "50.00"
    assert [r["id"] for r in shown["refunds"]] == [body["id"]]
    own = api_client.get(f"/api/payments/{body['id']}/").json()
    assert (own["purpose"], own["direction"], own["refund_of"]) == (
        "refund",
        "credit",
        str(debit.id),
    )
    assert own["refundable_amount"] == "0.00"


def test_the_same_idempotency_key_replays_the_refund_and_makes_no_second(api_client, debit):
    first = _refund(api_client, debit.id, {"amount": "10.00"}, HTTP_IDEMPOTENCY_KEY="rf-1")
    again = _refund(api_client, debit.id, {"amount": "10.00"}, HTTP_IDEMPOTENCY_KEY="rf-1")
    other = _refund(api_client, debit.id, {"amount": "11.00"}, HTTP_IDEMPOTENCY_KEY="rf-1")

    assert first.status_code == again.status_code == 201
    assert again.json() == first.json() and again["Idempotent-Replayed"] == "true"
    assert other.status_code == 422
    assert other.json()["error"]["code"] == "idempotency_key_reused"
    assert Payment.objects.filter(refund_of=debit).count() == 1


@pytest.mark.parametrize(
    ("state", "amount", "code", "param"),
    [
        (PaymentState.PENDING, "1.00", "payment_not_confirmed", "payment_id"),
        (PaymentState.SUBMITTED, "1.00", "payment_not_confirmed", "payment_id"),
        (PaymentState.RETURNED, "1.00", "payment_returned", "payment_id"),
        (PaymentState.CONFIRMED, "80.01", "refund_exceeds_refundable", "amount"),
    ],
)
def test_a_refused_refund_answers_409_naming_the_rule(api_client, user, state, amount, code, param):
    grant(user, "acme")
    debit = PaymentFactory(merchant_id="acme", state=state, amount=Decimal("80.00"))

    response = _refund(api_client, debit.id, {"amount": amount})

    assert response.status_code == 409
    error = response.json()["error"]
    assert (error["code"], error["param"]) == (code, param)
    assert not Payment.objects.filter(refund_of=debit).exists()


def test_another_merchants_payment_is_404_as_a_missing_one(api_client, user):
    grant(user, "acme")
    theirs = PaymentFactory(merchant_id="globex", state=PaymentState.CONFIRMED)

    mine_missing = _refund(api_client, "3c9d495d-5286-44d4-aaab-2d811f39302c", {"amount": "1.00"})
    not_mine = _refund(api_client, theirs.id, {"amount": "1.00"})
    not_an_id = _refund(api_client, "not-a-uuid", {"amount": "1.00"})

    assert mine_missing.status_code == not_mine.status_code == not_an_id.status_code == 404
    assert {r.json()["error"]["code"] for r in (mine_missing, not_mine)} == {"resource_missing"}
    assert not Payment.objects.filter(refund_of=theirs).exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"amount": "NaN"}, "amount"),
        ({"amount": "-5.00"}, "amount"),
        ({"amount": "0.00"}, "amount"),
        ({"amount": 5}, "amount"),
        ({"amount": "1e3"}, "amount"),
        ({"amount": "9" * 40}, "amount"),
        ({"amount": "\u0665.00"}, "amount"),
        ({}, "amount"),
        ({"amount": "1.00", "reason": "acct 77668056869313516"}, "reason"),
        ({"amount": "1.00", "reason": "bad\u0000"}, "reason"),
        ({"amount": "1.00", "reason": "x" * 256}, "reason"),
        ({"amount": "1.00", "metadata": {"k": 1}}, "metadata[k]"),
        ({"amount": "1.00", "refund_everything": True}, "refund_everything"),
    ],
    ids=[
        "nan",
        "negative",
        "zero",
        "number",
        "exponent",
        "huge",
        "arabic-digits",
        "missing",
        "bank-number-in-reason",
        "nul",
        "long-reason",
        "metadata-not-string",
        "unknown-field",
    ],
)
def test_hostile_bodies_answer_400_naming_the_field(api_client, debit, body, field):
    response = _refund(api_client, debit.id, body)

    assert response.status_code == 400, response.content
    assert field in response.json()["error"]["errors"], response.json()
    assert "77668056869313516" not in response.content.decode()
    assert not Payment.objects.filter(refund_of=debit).exists()


@pytest.mark.parametrize(
    "raw",
    [b"[]", b'"1.00"', b"{", b'{"amount": "1.00", "amount": "2.00"}', b"\xff\xfe"],
    ids=["array", "string", "truncated", "duplicate-key", "not-utf8"],
)
def test_a_body_that_is_not_one_json_object_answers_400(api_client, debit, raw):
    response = _refund(api_client, debit.id, raw)
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert not Payment.objects.filter(refund_of=debit).exists()


def test_a_deeply_nested_body_is_refused_without_a_500(api_client, debit):
    deep = '{"amount": "1.00", "metadata": ' + "[" * 5000 + "]" * 5000 + "}"
    response = _refund(api_client, debit.id, deep)
    assert response.status_code == 400


def test_a_refunds_and_a_debits_answers_are_their_rows_rendered_anew_and_their_events(
    api_client, debit
):
    from payments.api.base import shaped
    from payments.object_shapes import PaymentOutputSerializer, RefundOutputSerializer
    from payments.webhooks.models import Event

    refund = _refund(api_client, debit.id, {"amount": "30.00"}).json()
    created = api_client.post(
        "/api/payments/",
        {"merchant_id": "acme", "amount": "12.34", "source_token": "tok_abcdef12"},
        format="json",
    ).json()

    debit_row = Payment.objects.get(pk=created["id"])
    refund_row = Payment.objects.get(pk=refund["id"])
    assert created == json.loads(json.dumps(shaped(PaymentOutputSerializer, debit_row)))
    assert refund == json.loads(
        json.dumps(shaped(RefundOutputSerializer, refund_row, {"created": True}))
    )
    events = {e.object_id: e.data["object"] for e in Event.objects.all()}
    assert (events[created["id"]], events[refund["id"]]) == (created, refund)
