"""``POST /api/payments/<id>/cancel/``: 200 with the payment as GET shows it, 409 naming the
rule, 404 for what the caller may not see, 4xx naming what is wrong with hostile input."""

import pytest

from payments.models import Payment, PaymentEvent, PaymentState
from tests.factories import PaymentFactory, grant

pytestmark = pytest.mark.django_db


def _cancel(client, payment_id, body=None, **kwargs):
    if body is None:
        return client.post(f"/api/payments/{payment_id}/cancel/", **kwargs)
    return client.post(
        f"/api/payments/{payment_id}/cancel/", body, content_type="application/json", **kwargs
    )


def _without_request_ids(body: dict) -> dict:
    return {key: value for key, value in body.items() if key != "request_id"}


def test_a_cancel_answers_200_with_the_payment_as_get_shows_it(api_client, user):
    grant(user, "acme")
    payment = PaymentFactory(merchant_id="acme")

    response = _cancel(api_client, payment.id)
    shown = api_client.get(f"/api/payments/{payment.id}/")

    assert response.status_code == 200, response.json()
    assert response.json() == shown.json()
    assert response.json()["state"] == "canceled"
    assert [e["to_state"] for e in response.json()["events"]] == ["canceled"]


def test_a_second_cancel_answers_200_with_the_same_payment(api_client, user):
    grant(user, "acme")
    payment = PaymentFactory(merchant_id="acme")

    first = _cancel(api_client, payment.id)
    second = _cancel(api_client, payment.id, {})

    assert first.status_code == second.status_code == 200
    assert second.json() == first.json()
    assert PaymentEvent.objects.filter(payment=payment).count() == 1


@pytest.mark.parametrize(
    ("state", "code"),
    [
        ("submitted", "already_submitted"),
        ("confirmed", "already_submitted"),
        ("returned", "already_submitted"),
        ("failed", "payment_not_cancelable"),
    ],
)
def test_a_payment_past_pending_answers_409_naming_the_rule(api_client, user, state, code):
    grant(user, "acme")
    payment = PaymentFactory(merchant_id="acme", state=state)

    response = _cancel(api_client, payment.id)

    assert response.status_code == 409
    error = response.json()["error"]
    assert (error["code"], error["param"], error["type"]) == (
        code,
        "payment_id",
        "invalid_request_error",
    )
    assert state in error["message"]
    payment.refresh_from_db()
    assert payment.state == state


def test_another_merchants_payment_answers_404_like_a_missing_one(api_client, user):
    grant(user, "globex")
    theirs = PaymentFactory(merchant_id="acme")
    missing = PaymentFactory.build()

    foreign = _cancel(api_client, theirs.id)
    absent = _cancel(api_client, missing.id)

    assert foreign.status_code == absent.status_code == 404
    assert _without_request_ids(foreign.json()["error"]) == _without_request_ids(
        absent.json()["error"]
    )
    theirs.refresh_from_db()
    assert theirs.state == PaymentState.PENDING


def test_another_merchants_payment_answers_404_whatever_the_body(api_client, user):
    grant(user, "globex")
    theirs = PaymentFactory(merchant_id="acme")

    response = _cancel(api_client, theirs.id, {"junk": 1})

    assert response.status_code == 404


@pytest.mark.parametrize(
    "payment_id", ["not-a-uuid", "1" * 40, "%00", "8e4f9d1e-1111-4b5e-9c1b-2f5b6a7c8d9"]
)
def test_an_id_that_is_not_a_uuid_answers_404_naming_payment_id(api_client, user, payment_id):
    response = _cancel(api_client, payment_id)

    assert response.status_code == 404
    assert response.json()["error"]["param"] == "payment_id"


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ('{"reason": "x"}', "reason", "unknown field"),
        ('{"021000021": "x"}', None, "bank"),
        ("[1]", None, "JSON object"),
        ('"cancel"', None, "JSON object"),
        ("{not json", None, ""),
        ('{"a": 1, "a": 2}', "a", ""),
    ],
)
def test_a_hostile_body_is_refused_400_naming_the_problem(api_client, user, body, param, words):
    grant(user, "acme")
    payment = PaymentFactory(merchant_id="acme")

    response = _cancel(api_client, payment.id, body)

    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["param"] == param
    assert words in (error["message"] + " ".join(map(str, error["errors"].values())))
    assert "021000021" not in response.content.decode()
    payment.refresh_from_db()
    assert payment.state == PaymentState.PENDING


def test_a_body_that_is_not_json_is_refused_415(api_client, user):
    grant(user, "acme")
    payment = PaymentFactory(merchant_id="acme")

    response = api_client.post(
        f"/api/payments/{payment.id}/cancel/", "state=canceled", content_type="text/plain"
    )

    assert response.status_code == 415
    assert Payment.objects.get(pk=payment.pk).state == PaymentState.PENDING


def test_an_unauthenticated_cancel_answers_401_and_cancels_nothing(client):
    payment = PaymentFactory()

    response = client.post(f"/api/payments/{payment.id}/cancel/")

    assert response.status_code == 401
    assert Payment.objects.get(pk=payment.pk).state == PaymentState.PENDING


def test_get_on_the_cancel_path_answers_405(api_client, user):
    grant(user, "acme")
    payment = PaymentFactory(merchant_id="acme")

    response = api_client.get(f"/api/payments/{payment.id}/cancel/")

    assert response.status_code == 405
    assert Payment.objects.get(pk=payment.pk).state == PaymentState.PENDING
