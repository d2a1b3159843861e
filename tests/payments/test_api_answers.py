"""What the payments API answers is bounded and says nothing of the processor's internals; a
refusal binds no Idempotency-Key. Over real HTTP where the transport matters."""

import http.client
import json
import re

import pytest
import requests
from django.utils.html import escape
from rest_framework.authtoken.models import Token

from payments.models import ApiIdempotencyKey, Payment
from payments.services import payment_submit
from tests.factories import PaymentFactory, UserFactory, grant
from tests.gunicorn_support import free_port, gunicorn_running, gunicorn_test_env

BODY = {"merchant_id": "m-1", "amount": "25.00", "currency": "USD", "source_token": "tok_abcdef12"}
TEN_MB = 10 * 1024 * 1024
TOO_LARGE = {
    "type": "invalid_request_error",
    "code": "body_too_large",
    "param": "body",
    "message": "larger than 65536 bytes, the limit of this API",
    "errors": {"body": ["larger than 65536 bytes, the limit of this API"]},
}


def without_request_id(answer: dict) -> dict:
    error = dict(answer["error"])
    assert error.pop("request_id").startswith("req_")
    return error


# --- Error answers are bounded ----------------------------------------------------------------


@pytest.mark.django_db
def test_twenty_thousand_unknown_fields_get_a_small_answer_that_counts_them(
    api_client, user, module_settings
):
    grant(user, "m-1")
    # A host may allow larger bodies; the answer stays small whatever the limit.
    module_settings.PAYMENTS_API_MAX_BODY_BYTES = 1024 * 1024
    body = {**BODY, **{f"f{i}": 0 for i in range(20_000)}}

    response = api_client.post("/api/payments/", body, format="json", HTTP_IDEMPOTENCY_KEY="big")

    assert response.status_code == 400
    assert len(response.content) < 4096
    errors = response.json()["error"]["errors"]
    assert len([name for name in errors if name.startswith("f")]) == 10
    assert errors["more_errors"] == ["and 19,990 more fields with errors, not shown"]
    assert not ApiIdempotencyKey.objects.exists()  # and nothing is kept for a day


@pytest.mark.django_db
def test_twenty_thousand_unstorable_strings_get_a_small_answer(api_client, user, module_settings):
    grant(user, "m-1")
    module_settings.PAYMENTS_API_MAX_BODY_BYTES = 1024 * 1024
    raw = json.dumps({**BODY, **{f"f{i}": "a\u0000" for i in range(20_000)}})

    response = api_client.post("/api/payments/", raw, content_type="application/json")

    assert response.status_code == 400
    assert len(response.content) < 4096
    assert "and 19,990 more fields" in response.json()["error"]["errors"]["more_errors"][0]


@pytest.mark.django_db
def test_many_bank_numbers_in_field_names_are_counted_not_listed(api_client, user, module_settings):
    module_settings.PAYMENTS_API_MAX_BODY_BYTES = 1024 * 1024
    body = {**BODY, **{f"{10**9 + i}": 0 for i in range(5_000)}}

    response = api_client.post("/api/payments/", body, format="json")

    assert response.status_code == 400
    assert len(response.content) < 4096
    assert "and 4,990 more messages, not shown" in response.json()["error"]["errors"]["more_errors"]


# --- Oversized bodies: a JSON 413 naming the limit ----------------------------------------------


@pytest.fixture
def token(transactional_db):
    user = UserFactory()
    grant(user, "m-1")
    return Token.objects.create(user=user).key


@pytest.mark.parametrize(
    "method, path",
    [
        ("POST", "/api/payments/"),
        ("GET", "/api/payments/00000000-0000-0000-0000-000000000000/"),
        ("GET", "/api/merchants/m-1/balance/"),
    ],
)
def test_a_10_mb_body_gets_a_json_413_naming_the_limit_on_every_endpoint(
    live_server, token, method, path
):
    response = requests.request(
        method,
        live_server.url + path,
        data=b"{" + b" " * TEN_MB + b"}",
        headers={"Authorization": f"Token {token}", "Content-Type": "application/json"},
        timeout=30,
    )

    assert response.status_code == 413
    assert response.headers["Content-Type"] == "application/json"
    assert without_request_id(response.json()) == TOO_LARGE


def test_a_10_mb_body_without_credentials_is_413_before_authentication(live_server, token):
    response = requests.post(
        live_server.url + "/api/payments/",
        data=b" " * TEN_MB,
        headers={"Content-Type": "application/json"},
        timeout=30,
    )
    assert response.status_code == 413
    assert "65536 bytes" in response.json()["error"]["errors"]["body"][0]


def test_the_limit_is_a_setting(live_server, token, module_settings):
    module_settings.PAYMENTS_API_MAX_BODY_BYTES = 2048
    response = requests.post(
        live_server.url + "/api/payments/",
        json={**BODY, "description": "d" * 3000},
        headers={"Authorization": f"Token {token}"},
        timeout=30,
    )
    assert response.status_code == 413
    assert response.json()["error"]["errors"]["body"] == [
        "larger than 2048 bytes, the limit of this API"
    ]


@pytest.fixture
def gunicorn_port(sqs_queues, module_settings, tmp_path):
    port = free_port()
    env = gunicorn_test_env(module_settings, port)
    with gunicorn_running(env, tmp_path / "gunicorn.log"):
        yield port


@pytest.mark.subprocess
def test_an_oversized_chunked_body_without_content_length_is_413_under_gunicorn(gunicorn_port):
    """No Content-Length to trust or to lie with: the bytes read are what count. (Twice the
    limit: the server answers once it has read one byte past it, and a client still sending
    megabytes then would see its connection reset before it reads the answer.)"""
    connection = http.client.HTTPConnection("127.0.0.1", gunicorn_port, timeout=30)
    chunks = (b" " * 1024 for _ in range(128))
    try:
        connection.request(
            "POST",
            "/api/payments/",
            body=chunks,
            headers={"Content-Type": "application/json"},
            encode_chunked=True,
        )
        response = connection.getresponse()
        status, answer = response.status, json.loads(response.read())
    finally:
        connection.close()

    assert status == 413
    assert without_request_id(answer) == TOO_LARGE


def test_the_body_limit_is_range_checked_at_start_up(module_settings):
    from payments.checks import payments_setting_values_check

    def refusals():
        return [
            e
            for e in payments_setting_values_check()
            if "PAYMENTS_API_MAX_BODY_BYTES" in e.msg and e.id == "payments.E003"
        ]

    for value in (0, -1, "64k", 10**9, True):
        module_settings.PAYMENTS_API_MAX_BODY_BYTES = value
        [error] = refusals()
        assert error.msg.startswith(
            f'PAYMENTS["PAYMENTS_API_MAX_BODY_BYTES"] = {value!r} is refused'
        )
    module_settings.PAYMENTS_API_MAX_BODY_BYTES = 65536
    assert not refusals()


# --- A refused create binds no Idempotency-Key --------------------------------------------------


@pytest.mark.django_db
def test_a_create_refused_for_want_of_a_grant_executes_when_retried_after_the_grant(
    api_client, user
):
    first = api_client.post("/api/payments/", BODY, format="json", HTTP_IDEMPOTENCY_KEY="g1")
    assert first.status_code == 403
    assert not ApiIdempotencyKey.objects.exists()

    grant(user, "m-1")
    retried = api_client.post("/api/payments/", BODY, format="json", HTTP_IDEMPOTENCY_KEY="g1")

    assert retried.status_code == 201
    assert "Idempotent-Replayed" not in retried
    assert Payment.objects.count() == 1


@pytest.mark.django_db
def test_a_400_binds_nothing_so_the_corrected_body_executes_under_the_same_key(api_client, user):
    grant(user, "m-1")
    bad = api_client.post(
        "/api/payments/", {**BODY, "amount": "1e3"}, format="json", HTTP_IDEMPOTENCY_KEY="v1"
    )
    assert bad.status_code == 400

    fixed = api_client.post("/api/payments/", BODY, format="json", HTTP_IDEMPOTENCY_KEY="v1")

    assert fixed.status_code == 201  # not 422: the 400 stored nothing
    # An executed request keeps the IETF semantics: replay, and 422 for another body.
    replay = api_client.post("/api/payments/", BODY, format="json", HTTP_IDEMPOTENCY_KEY="v1")
    assert (replay.status_code, replay["Idempotent-Replayed"]) == (201, "true")
    assert replay.json() == fixed.json()
    other = api_client.post(
        "/api/payments/", {**BODY, "amount": "9.00"}, format="json", HTTP_IDEMPOTENCY_KEY="v1"
    )
    assert other.status_code == 422
    assert Payment.objects.count() == 1


# --- The processor's internals do not reach tenants --------------------------------------------

INTERNALS = re.compile(r"https?://|127\.0\.0\.1|localhost|/v1/")


@pytest.mark.django_db(transaction=True)
def test_the_detail_after_a_processor_503_names_a_code_not_the_processors_address(
    sandbox, api_client, user, admin_client
):
    payment = PaymentFactory(source_token="tok_fail5xx_1_abc")
    grant(user, payment.merchant_id)
    with pytest.raises(Exception, match="503"):
        payment_submit(payment_id=payment.id)
    port = sandbox.base_url.rsplit(":", 1)[1].strip("/")

    response = api_client.get(f"/api/payments/{payment.id}/")

    assert response.status_code == 200
    text = response.content.decode()
    assert not INTERNALS.search(text), text
    assert f":{port}" not in text
    [error] = response.json()["errors"]
    assert error["source"] == "processor"
    assert error["code"] == "processor_unavailable"
    assert error["message"] == "the processor did not answer; retried automatically"
    assert error["attempt"] == 1 and error["at"]
    [attempt] = response.json()["attempts"]
    assert (attempt["error_code"], attempt["http_status"]) == ("processor_unavailable", 503)
    # The full error stays in the admin, for the people who run the processor integration.
    stored = payment.attempts.get().error
    assert stored and stored != error["message"]
    admin_page = admin_client.get(f"/admin/payments/payment/{payment.id}/change/")
    assert escape(stored) in admin_page.content.decode()


@pytest.mark.django_db
def test_a_shape_from_the_kept_serializer_is_its_own_serializers_data_and_keeps_no_context():
    from payments.api.base import shaped
    from payments.object_shapes import PaymentOutputSerializer, RefundOutputSerializer

    debit = PaymentFactory(metadata={"order": "1"})
    other = PaymentFactory(amount="7.00", description="another")

    assert shaped(PaymentOutputSerializer, debit) == dict(PaymentOutputSerializer(debit).data)
    assert shaped(PaymentOutputSerializer, other) == dict(PaymentOutputSerializer(other).data)
    assert shaped(PaymentOutputSerializer, other)["amount"] == "7.00"
    # The context goes with one call only: a created refund shows no double loss read.
    assert shaped(RefundOutputSerializer, debit, {"created": True}) == dict(
        RefundOutputSerializer(debit, context={"created": True}).data
    )
    assert shaped(RefundOutputSerializer, debit) == dict(RefundOutputSerializer(debit).data)
