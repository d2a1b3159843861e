"""POST /api/payments/ accepts exactly its contract: no unknown field, plain decimal amounts,
no bank number in any text field (never stored, logged or echoed), no deep JSON."""

import json
import logging
from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError

from payments.models import ApiIdempotencyKey, Payment, PaymentEvent
from payments.services import looks_like_bank_number, payment_create
from tests.factories import grant

pytestmark = pytest.mark.django_db

BODY = {"merchant_id": "m-1", "amount": "25.00", "currency": "USD", "source_token": "tok_abcdef12"}


@pytest.fixture(autouse=True)
def _grants(user):
    grant(user, "m-1")


def post(api_client, body, **headers):
    return api_client.post(
        "/api/payments/", json.dumps(body), content_type="application/json", **headers
    )


def test_an_unknown_field_answers_400_naming_it(api_client):
    response = post(api_client, {**BODY, "shipping": {"order": 7}, "captureMethod": "auto"})

    assert response.status_code == 400
    errors = response.json()["error"]["errors"]
    assert set(errors) == {"shipping", "captureMethod"}
    assert "unknown field" in errors["shipping"][0]
    assert Payment.objects.count() == 0


def test_an_unknown_field_is_reported_beside_the_other_errors(api_client):
    response = post(api_client, {**BODY, "amount": "1e3", "extra": 1})

    assert response.status_code == 400
    assert set(response.json()["error"]["errors"]) == {"amount", "extra"}


@pytest.mark.parametrize(
    "amount",
    [
        "1e3",
        "1E3",
        "1_000.00",
        "١٢.٠٠",  # Arabic-Indic digits
        "１２.００",  # full-width digits
        "+5.00",
        "-5.00",
        " 5.00",
        "5.00 ",
        "5",
        "5.0",
        "5.000",
        "05.00",
        ".50",
        "NaN",
        "Infinity",
        "1000000000000.00",  # 13 integer digits: beyond NUMERIC(14, 2)
        "0.00",
    ],
)
def test_amount_outside_the_plain_decimal_grammar_answers_400(api_client, amount):
    response = post(api_client, {**BODY, "amount": amount})

    assert response.status_code == 400
    assert list(response.json()["error"]["errors"]) == ["amount"]
    assert Payment.objects.count() == 0


@pytest.mark.parametrize("amount", ["0.01", "25.00", "999999999999.99"])
def test_plain_decimal_amounts_are_accepted_exactly(api_client, amount):
    response = post(api_client, {**BODY, "amount": amount})

    assert response.status_code == 201
    assert response.json()["amount"] == amount
    assert str(Payment.objects.get().amount) == amount


@pytest.mark.parametrize(
    ("field", "value", "digits"),
    [
        ("description", "refund to acct 021000021", "021000021"),
        ("description", "routing 0210 0002 1 account 4412", "0210 0002 1"),
        ("description", "acct 1234-5678-9012", "1234-5678-9012"),
        ("description", "acct ٠٢١٠٠٠٠٢١", "٠٢١٠٠٠٠٢١"),
        ("merchant_id", "m-12345678", "12345678"),
        ("source_token", "tok_021000021x", "021000021"),
        ("currency", "021000021", "021000021"),
    ],
)
def test_bank_number_in_any_text_field_is_refused_and_never_stored_or_logged(
    api_client, caplog, field, value, digits
):
    caplog.set_level(logging.DEBUG)

    response = post(api_client, {**BODY, field: value}, HTTP_IDEMPOTENCY_KEY="bank-1")

    assert response.status_code == 400
    errors = response.json()["error"]["errors"]
    assert list(errors) == [field]
    assert "bank account or routing number" in errors[field][0]
    assert digits not in response.content.decode()
    assert Payment.objects.count() == 0 and PaymentEvent.objects.count() == 0
    stored = json.dumps(list(ApiIdempotencyKey.objects.values()), default=str)
    assert digits not in stored
    assert digits not in caplog.text


def test_bank_number_as_a_field_name_is_refused_without_echoing_it(api_client):
    response = post(api_client, {**BODY, "021000021": "x"})

    assert response.status_code == 400
    assert "021000021" not in response.content.decode()
    assert "bank account" in response.json()["error"]["errors"]["non_field_errors"][0]


@pytest.mark.parametrize(
    "text",
    ["invoice 1234567", "2026/11/30", "order 12 345 67", "call 555 0100", "v1.2.3.4.5.6.7.8"],
)
def test_text_with_short_digit_runs_is_accepted(api_client, text):
    response = post(api_client, {**BODY, "description": text})

    assert response.status_code == 201
    assert Payment.objects.get().description == text


def test_a_number_where_text_is_expected_answers_400(api_client):
    response = post(api_client, {**BODY, "description": 12345678901})

    assert response.status_code == 400
    assert "JSON string" in response.json()["error"]["errors"]["description"][0]
    assert Payment.objects.count() == 0


def test_balance_url_with_a_bank_number_answers_400_and_is_not_logged(api_client, caplog):
    caplog.set_level(logging.DEBUG)

    response = api_client.get("/api/merchants/021000021/balance/")

    assert response.status_code == 400
    assert "021000021" not in caplog.text


# 30,000 levels fill most of the 64 KiB a body may have; deeper ones are answered 413.
@pytest.mark.parametrize("depth", [40, 1000, 30_000])
def test_deep_json_answers_400(api_client, depth):
    raw = '{"merchant_id": ' + "[" * depth + "]" * depth + "}"

    response = api_client.post("/api/payments/", raw, content_type="application/json")

    assert response.status_code == 400
    assert "nested deeper" in json.dumps(response.json())
    assert Payment.objects.count() == 0


@pytest.mark.parametrize("raw", ['[{"merchant_id": "m-1"}]', '"x"', "7", "null"])
def test_a_body_that_is_not_an_object_answers_400(api_client, raw):
    response = api_client.post("/api/payments/", raw, content_type="application/json")

    assert response.status_code == 400
    assert "non_field_errors" in response.json()["error"]["errors"]


@pytest.mark.parametrize(
    "raw",
    [
        '{"merchant_id": "m-1", "merchant_id": "m-2"}',
        '{"merchant_id": "m\\u0000"}',
        '{"amount": NaN}',
    ],
)
def test_json_the_database_cannot_store_answers_400(api_client, raw):
    response = api_client.post("/api/payments/", raw, content_type="application/json")

    assert response.status_code == 400
    assert Payment.objects.count() == 0


def test_the_service_refuses_bank_numbers_in_every_text_field_too():
    with pytest.raises(ValidationError) as excinfo:
        payment_create(
            merchant_id="m-1",
            amount=Decimal("1.00"),
            source_token="tok_abcdef12",
            description="acct 021-000-021",
        )
    assert list(excinfo.value.message_dict) == ["description"]
    assert Payment.objects.count() == 0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("12345678", True),
        ("1234567", False),
        ("1234 5678", True),
        ("1234  5678", False),  # two spaces separate two short runs
        ("12-34-56-78", True),
        ("1234.5678", False),
        ("１２３４５６７８", True),
        ("021 000 021 at First Bank", True),
        ("acct: 0210-0002-1.", True),
        ("2026-11-30", True),
        # The digit groups of a UUID are glued to letters or to other groups: not a bank number.
        ("order 168f939a-a823-4499-8819-127491a4bf31", False),
        ("4321a21e-2647-45b6-9104-0993a7e5ad1f", False),
        ("ref 12 34 56 78-ab", False),
        ("12-34-56 7", False),
    ],
)
def test_bank_number_rule(text, expected):
    assert looks_like_bank_number(text) is expected


def test_each_body_is_read_on_its_own_by_the_serializer_a_thread_keeps():
    import threading

    from payments.api.base import body_checked
    from payments.api.payments import PaymentCreateInputSerializer

    refused = body_checked(PaymentCreateInputSerializer, {**BODY, "amount": "1e3", "x": 1})
    taken = body_checked(PaymentCreateInputSerializer, {**BODY, "description": "first"})
    bare = body_checked(PaymentCreateInputSerializer, BODY)
    elsewhere = []
    thread = threading.Thread(
        target=lambda: elsewhere.append(
            body_checked(PaymentCreateInputSerializer, {**BODY, "amount": "7.00"})
        )
    )
    thread.start()
    thread.join()

    assert refused[0] is None and set(refused[1]) == {"amount", "x"}
    assert taken == ({**BODY, "amount": Decimal("25.00"), "description": "first"}, None)
    # Nothing of the body before: no description carried over, no errors.
    assert bare == ({**BODY, "amount": Decimal("25.00")}, None)
    assert elsewhere == [({**BODY, "amount": Decimal("7.00")}, None)]
