"""One error envelope for every error of the payments API and the callback endpoint, a request
id on every answer, and throttling that is off until a setting turns it on."""

import json
import re
import sys
import uuid

import pytest
from django.core.cache import cache
from django.core.signals import got_request_exception
from rest_framework.test import APIClient

from payments.api.errors import ErrorType
from tests.factories import PaymentFactory, grant

pytestmark = pytest.mark.django_db

BODY = {"merchant_id": "acme", "amount": "25.00", "currency": "USD", "source_token": "tok_abcdef12"}
REQUEST_ID = re.compile(r"req_[0-9a-f]{32}")
ENVELOPE_KEYS = {"type", "code", "param", "message", "request_id", "errors"}


def error_of(response, status: int, error_type: ErrorType, code: str) -> dict:
    """The envelope, checked: its status, type, code, and the request id of the header."""
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/json"
    assert set(response.json()) == {"error"}
    error = response.json()["error"]
    assert set(error) == ENVELOPE_KEYS
    assert (error["type"], error["code"]) == (error_type, code)
    assert REQUEST_ID.fullmatch(response["Request-Id"])
    assert error["request_id"] == response["Request-Id"]
    assert error["message"]
    return error


def test_401_without_credentials():
    response = APIClient().get(f"/api/payments/{uuid.uuid4()}/")
    error = error_of(response, 401, ErrorType.AUTHENTICATION, "not_authenticated")
    assert error["param"] is None
    assert response["WWW-Authenticate"] == "Token"


def test_401_with_a_bad_token():
    response = APIClient(HTTP_AUTHORIZATION="Token nope").get("/api/payments/")
    error_of(response, 401, ErrorType.AUTHENTICATION, "authentication_failed")


def test_403_names_the_merchant(api_client):
    response = api_client.post("/api/payments/", BODY, format="json")
    error = error_of(response, 403, ErrorType.PERMISSION, "merchant_forbidden")
    assert error["param"] == "merchant_id"
    assert list(error["errors"]) == ["merchant_id"]


MISSING_ID = "0b5e4c1e-9d7a-4f51-8a8e-4c0f3b6a2d17"


@pytest.mark.parametrize("payment_id", [MISSING_ID, "not-a-uuid", "%00"])
def test_404_for_a_missing_payment_whatever_the_id(api_client, payment_id):
    response = api_client.get(f"/api/payments/{payment_id}/")
    error = error_of(response, 404, ErrorType.INVALID_REQUEST, "resource_missing")
    assert error["param"] == "payment_id"


def test_404_for_a_balance_of_a_merchant_not_granted(api_client):
    response = api_client.get("/api/merchants/acme/balance/")
    assert error_of(response, 404, ErrorType.INVALID_REQUEST, "resource_missing")["param"] == (
        "merchant_id"
    )


def test_405_for_a_method_the_path_does_not_answer(api_client):
    response = api_client.delete("/api/payments/")
    error_of(response, 405, ErrorType.INVALID_REQUEST, "method_not_allowed")


def test_413_names_the_body(api_client, module_settings):
    module_settings.PAYMENTS_API_MAX_BODY_BYTES = 1024
    response = api_client.post("/api/payments/", {**BODY, "description": "d" * 2000}, format="json")
    error = error_of(response, 413, ErrorType.INVALID_REQUEST, "body_too_large")
    assert error["param"] == "body" and "1024 bytes" in error["message"]


def test_415_for_a_body_that_is_not_json(api_client):
    response = api_client.post("/api/payments/", "a=b", content_type="text/plain")
    error_of(response, 415, ErrorType.INVALID_REQUEST, "unsupported_media_type")


def test_400_for_malformed_json_names_the_body_problem(api_client):
    response = api_client.post("/api/payments/", "{", content_type="application/json")
    error = error_of(response, 400, ErrorType.INVALID_REQUEST, "body_invalid")
    assert "non_field_errors" in error["errors"]


def test_400_names_the_first_bad_field_and_keeps_every_problem(api_client):
    response = api_client.post("/api/payments/", {"amount": 5}, format="json")
    error = error_of(response, 400, ErrorType.INVALID_REQUEST, "parameter_invalid")
    assert error["param"] in error["errors"]
    assert {"merchant_id", "amount", "source_token"} <= set(error["errors"])
    assert error["message"].startswith(f"{error['param']}: ")


def test_409_and_422_are_idempotency_errors(api_client, user):
    grant(user, "acme")
    assert (
        api_client.post("/api/payments/", BODY, format="json", HTTP_IDEMPOTENCY_KEY="k").status_code
        == 201
    )
    reused = api_client.post(
        "/api/payments/", {**BODY, "amount": "1.00"}, format="json", HTTP_IDEMPOTENCY_KEY="k"
    )
    error = error_of(reused, 422, ErrorType.IDEMPOTENCY, "idempotency_key_reused")
    assert error["param"] == "Idempotency-Key"


def test_callback_errors_use_the_same_envelope(client):
    unsigned = client.post("/callbacks/processor/", b"{}", content_type="application/json")
    error_of(unsigned, 401, ErrorType.AUTHENTICATION, "authentication_failed")
    wrong_type = client.post("/callbacks/processor/", b"{}", content_type="text/plain")
    error_of(wrong_type, 415, ErrorType.INVALID_REQUEST, "unsupported_media_type")
    wrong_method = client.get("/callbacks/processor/")
    error_of(wrong_method, 405, ErrorType.INVALID_REQUEST, "method_not_allowed")


def test_every_answer_carries_a_request_id_of_its_own(api_client, user):
    grant(user, "acme")
    payment = PaymentFactory(merchant_id="acme")
    answers = [
        api_client.get(f"/api/payments/{payment.id}/"),
        api_client.get("/api/payments/"),
        api_client.get("/api/merchants/acme/balance/"),
        api_client.post("/api/payments/", BODY, format="json"),
    ]
    assert [a.status_code for a in answers] == [200, 200, 200, 201]
    ids = {a["Request-Id"] for a in answers}
    assert len(ids) == len(answers) and all(REQUEST_ID.fullmatch(i) for i in ids)


def test_a_request_id_sent_by_the_client_is_not_taken(api_client):
    forged = "req_" + "0" * 32
    response = api_client.get("/api/payments/", HTTP_REQUEST_ID=forged, HTTP_X_REQUEST_ID=forged)
    assert response["Request-Id"] != forged


def test_an_error_is_logged_with_its_request_id(api_client, caplog):
    response = api_client.get(f"/api/payments/{uuid.uuid4()}/")
    assert response["Request-Id"] in caplog.text


def test_a_replayed_create_gets_the_stored_body_and_a_new_request_id(api_client, user):
    grant(user, "acme")
    first = api_client.post("/api/payments/", BODY, format="json", HTTP_IDEMPOTENCY_KEY="r")
    again = api_client.post("/api/payments/", BODY, format="json", HTTP_IDEMPOTENCY_KEY="r")
    assert again["Idempotent-Replayed"] == "true"
    assert again.json() == first.json()
    assert again["Request-Id"] != first["Request-Id"]


# --- Throttling -------------------------------------------------------------------------------


@pytest.fixture
def fresh_cache():
    cache.clear()
    yield
    cache.clear()


def test_throttling_is_off_by_default(api_client, fresh_cache):
    assert all(api_client.get("/api/payments/").status_code == 200 for _ in range(30))


def test_a_rate_answers_429_in_the_envelope_with_retry_after(
    api_client, user, module_settings, fresh_cache
):
    module_settings.PAYMENTS_API_THROTTLE_RATES = {"read": "2/min"}
    grant(user, "acme")
    assert [api_client.get("/api/payments/").status_code for _ in range(2)] == [200, 200]

    refused = api_client.get("/api/payments/")

    error_of(refused, 429, ErrorType.RATE_LIMIT, "rate_limited")
    assert 0 < int(refused["Retry-After"]) <= 60
    # The write scope has no rate: creates still go through.
    assert api_client.post("/api/payments/", BODY, format="json").status_code == 201


@pytest.mark.parametrize(
    "value",
    [{"read": "often"}, {"list": "1/min"}, {"write": "0/min"}, "100/min", {"read": 5}],
)
def test_a_nonsense_rate_stops_start_up(module_settings, value):
    from payments.checks import payments_setting_values_check

    module_settings.PAYMENTS_API_THROTTLE_RATES = value
    [error] = payments_setting_values_check(None)
    assert "PAYMENTS_API_THROTTLE_RATES" in error.msg


def test_a_callback_body_that_breaks_the_contract_names_its_fields(client):
    from payments import signing
    from tests.callbacks.test_endpoint import SECRET

    raw = json.dumps({"payment_id": "x"}).encode()
    response = client.post(
        "/callbacks/processor/",
        raw,
        content_type="application/json",
        headers={signing.HEADER: signing.sign(raw, [SECRET])},
    )
    error = error_of(response, 400, ErrorType.INVALID_REQUEST, "body_invalid")
    assert error["param"] in error["errors"]


def test_406_for_an_accept_header_without_json(api_client):
    response = api_client.get("/api/payments/", HTTP_ACCEPT="text/html")
    error_of(response, 406, ErrorType.INVALID_REQUEST, "not_acceptable")


def test_a_bug_answers_500_in_the_envelope_without_its_text_and_the_key_can_be_retried(
    api_client, user, monkeypatch, caplog
):
    """An unexpected exception inside the work (here the create service failing as a bug
    would) is the envelope's 500, never Django's HTML page; its text stays in the log, under
    the request id the answer carries, and the Idempotency-Key is released, not stored."""
    from payments.api import payments as apis
    from payments.models import Payment

    grant(user, "acme")
    real_create = apis.payment_create

    def broken(**kwargs):
        real_create(**kwargs)  # written, then rolled back with the request
        raise RuntimeError("secret internals of the bug")

    monkeypatch.setattr(apis, "payment_create", broken)
    key = str(uuid.uuid4())
    tracked = []

    def tracker(sender, request, **kwargs):  # as an error tracker hooks Django's signal
        tracked.append((request.path, sys.exc_info()[1]))

    got_request_exception.connect(tracker)
    api_client.raise_request_exception = False  # the test client re-raises what it signals
    try:
        with caplog.at_level("ERROR", logger="payments.api.errors"):
            response = api_client.post(
                "/api/payments/", BODY, format="json", HTTP_IDEMPOTENCY_KEY=key
            )
    finally:
        got_request_exception.disconnect(tracker)

    error = error_of(response, 500, ErrorType.API, "internal_error")
    assert "secret" not in response.content.decode()
    [record] = [r for r in caplog.records if "answered 500" in r.getMessage()]
    assert record.request_id == response["Request-Id"]
    assert record.exc_info[1].args == ("secret internals of the bug",)
    assert error["request_id"] in record.getMessage()
    [(path, exception)] = tracked
    assert path == "/api/payments/" and str(exception) == "secret internals of the bug"
    assert not Payment.objects.exists()

    monkeypatch.setattr(apis, "payment_create", real_create)
    retried = api_client.post("/api/payments/", BODY, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert retried.status_code == 201
    assert Payment.objects.count() == 1
