"""``/api/accounts/<token>/validation/`` and ``/verify/``, and the create's 409: the merchant's
own validations only (another merchant's token is the same 404 as a made-up one), refusals by
name, and the micro-entries' amounts never echoed."""

import json
from decimal import Decimal

import pytest

from payments.models import AccountValidation, Payment
from payments.services import payment_submit
from tests.factories import UserFactory, grant
from tests.payments.validation_service_example import BankDataDouble

pytestmark = pytest.mark.django_db

MERCHANT = "m-val-api"
TOKEN = "tok_val_api_0001"
SERVICE = "tests.payments.validation_service_example.BankDataService"


@pytest.fixture(autouse=True)
def _grants(user):
    grant(user, MERCHANT)


@pytest.fixture
def bank_data(settings, module_settings):
    double = BankDataDouble().start()
    settings.BANK_DATA_API_URL = double.url
    module_settings.ACCOUNT_VALIDATION_SERVICE = SERVICE
    yield double
    double.stop()


@pytest.fixture
def other_client(db):
    from rest_framework.authtoken.models import Token
    from rest_framework.test import APIClient

    other = UserFactory()
    grant(other, "m-someone-else")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=other).key}")
    return client


def _start(client, token=TOKEN, **body):
    # json.dumps escapes a lone surrogate (\ud800), as a hostile client's JSON may carry it.
    return client.post(
        f"/api/accounts/{token}/validation/",
        json.dumps({"merchant_id": MERCHANT, "method": "service", **body}),
        content_type="application/json",
    )


def _verify(client, amounts, token=TOKEN):
    return client.post(f"/api/accounts/{token}/verify/", {"amounts": amounts}, format="json")


def _micro_amounts(sandbox, token=TOKEN) -> list[str]:
    """The credits as the account's statement shows them: submitted as the worker does, read
    back from the sandbox processor."""
    validation = AccountValidation.objects.get(account_token=token)
    credits = Payment.objects.filter(
        pk__in=validation.evidence["micro_entries"]["payments"], direction="credit"
    )
    for credit in credits:
        payment_submit(payment_id=credit.pk)
    return [
        f"{Decimal(sandbox.credit(str(credit.idempotency_key)).amount):.2f}" for credit in credits
    ]


def test_a_web_debit_from_an_unvalidated_account_answers_409_account_not_validated(api_client):
    body = {"merchant_id": MERCHANT, "amount": "9.00", "source_token": TOKEN, "sec_code": "WEB"}

    response = api_client.post("/api/payments/", body, format="json")

    assert response.status_code == 409
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("account_not_validated", "source_token")


def test_in_hold_mode_the_create_answers_201_with_a_held_for_validation_warning(
    api_client, module_settings
):
    module_settings.UNVALIDATED_WEB_DEBITS = "hold"
    body = {"merchant_id": MERCHANT, "amount": "9.00", "source_token": TOKEN, "sec_code": "WEB"}

    response = api_client.post("/api/payments/", body, format="json")

    assert response.status_code == 201
    assert [w["code"] for w in response.json()["warnings"]] == ["held_for_validation"]


def test_starting_and_reading_a_validation_by_the_service(api_client, bank_data):
    started = _start(api_client)
    read = api_client.get(f"/api/accounts/{TOKEN}/validation/")

    assert started.status_code == 201, started.json()
    assert read.status_code == 200
    body = read.json()
    assert body["object"] == "account_validation"
    assert (body["account_token"], body["merchant_id"]) == (TOKEN, MERCHANT)
    assert (body["state"], body["method"], body["attempts_left"]) == ("validated", "service", None)
    assert body["evidence"]["answer"]["status"] == "open"
    again = _start(api_client)
    assert (again.status_code, again.json()["error"]["code"]) == (409, "account_already_validated")


def test_another_merchants_token_is_the_same_404_as_a_made_up_one(
    api_client, other_client, bank_data
):
    _start(api_client)

    theirs = other_client.get(f"/api/accounts/{TOKEN}/validation/")
    made_up = other_client.get("/api/accounts/tok_never_seen_01/validation/")
    verify = _verify(other_client, ["0.12", "0.34"])

    assert theirs.status_code == made_up.status_code == verify.status_code == 404
    assert theirs.json()["error"]["code"] == made_up.json()["error"]["code"] == "resource_missing"
    assert theirs.json()["error"]["message"] == made_up.json()["error"]["message"]


def test_a_start_for_a_token_another_merchant_validates_is_404(api_client, user, bank_data):
    _start(api_client)
    grant(user, "m-second")

    response = _start(api_client, merchant_id="m-second")

    assert response.status_code == 404
    assert AccountValidation.objects.get(account_token=TOKEN).merchant_id == MERCHANT


def test_a_start_for_a_merchant_the_user_may_not_act_for_is_403(api_client, bank_data):
    response = _start(api_client, merchant_id="m-not-mine")

    assert response.status_code == 403
    assert not AccountValidation.objects.exists()


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"method": "telepathy"}, "method"),
        ({"method": None}, "method"),
        ({"method": 7}, "method"),
        ({"merchant_id": "m\x00x"}, "merchant_id"),
        ({"merchant_id": "\ud800"}, "merchant_id"),
        ({"merchant_id": "x" * 10_000}, "merchant_id"),
        ({"merchant_id": ["m"]}, "merchant_id"),
        ({"extra": 1}, "extra"),
    ],
)
def test_a_refused_start_body_is_400_naming_the_field(api_client, bank_data, body, param):
    response = _start(api_client, **body)

    assert response.status_code == 400
    assert param in response.json()["error"]["errors"]


@pytest.mark.parametrize(
    ("token", "status"),
    [
        ("short", 404),
        ("tok%00nul0000", 404),
        ("tok%ED%A0%80surrogate", 404),
        ("t" * 5000, 404),
        ("123456789012", 400),
    ],
)
def test_a_malformed_token_in_the_path_is_answered_without_a_500(api_client, token, status):
    for response in (
        api_client.get(f"/api/accounts/{token}/validation/"),
        _start(api_client, token=token),
        _verify(api_client, ["0.12"], token=token),
    ):
        assert response.status_code == status
        assert "123456789012" not in response.content.decode()


def test_a_body_that_is_not_json_is_400(api_client):
    response = api_client.post(
        f"/api/accounts/{TOKEN}/validation/", "{nope", content_type="application/json"
    )
    assert response.status_code == 400


def test_micro_entries_through_the_api_one_wrong_try_then_the_right_amounts(api_client, sandbox):
    started = _start(api_client, method="micro_entries")
    assert started.status_code == 201, started.json()
    assert (started.json()["state"], started.json()["attempts_left"]) == ("pending", 3)
    amounts = _micro_amounts(sandbox)
    wrong = ["0.99" if amounts[0] != "0.99" else "0.98", amounts[1]]

    refused = _verify(api_client, wrong)
    right = _verify(api_client, list(reversed(amounts)))

    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "micro_entries_mismatch"
    # As a JSON string or a number: a timestamp's digits (".807877Z") are not an amount.
    for amount in {*amounts, *wrong}:
        for response in (refused, right, started):
            text = response.content.decode()
            assert f'"{amount}"' not in text and f":{amount}," not in text
            assert f" {amount}" not in text
    assert right.status_code == 200
    assert right.json()["state"] == "validated"


@pytest.mark.parametrize(
    "amounts",
    [["-0.12"], ["0.123"], ["0.12 "], [" 0.12"], [0.12], "0.12", None, ["0.1\x00"], ["x" * 5000]],
)
def test_malformed_amounts_are_400_invalid_amounts_and_never_echoed(api_client, sandbox, amounts):
    _start(api_client, method="micro_entries")

    response = _verify(api_client, amounts)

    assert response.status_code == 400, response.content[:300]
    body = response.content.decode()
    if response.json()["error"]["code"] == "invalid_amounts":
        assert response.json()["error"]["param"] == "amounts"
    assert "0.12" not in body and "0.123" not in body
    assert AccountValidation.objects.get(account_token=TOKEN).attempts == 0


def test_the_amounts_key_with_a_bank_number_looking_value_is_refused_without_echo(
    api_client, sandbox
):
    _start(api_client, method="micro_entries")

    response = api_client.post(
        f"/api/accounts/{TOKEN}/verify/",
        json.dumps({"amounts": ["123456789012"]}),
        content_type="application/json",
    )

    assert response.status_code == 400
    assert "123456789012" not in response.content.decode()


def test_verify_of_a_service_validation_is_409_not_verifiable(api_client, bank_data):
    bank_data.statuses[TOKEN] = "closed"
    _start(api_client)

    response = _verify(api_client, ["0.12", "0.34"])

    assert (response.status_code, response.json()["error"]["code"]) == (
        409,
        "validation_not_verifiable",
    )
