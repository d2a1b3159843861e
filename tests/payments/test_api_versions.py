"""The API's dated versions: the ``Payments-Version`` a client names, else the host's pin, on
every answer; anything else refused by name; a pin outside the versions stops start-up."""

from datetime import timedelta
from decimal import Decimal as D

import pytest
from django.core.checks import run_checks
from django.utils import timezone
from rest_framework.test import APIClient

from payments.api.errors import ErrorType
from payments.api_versions import FIRST, V2026_12_01, VERSION_HEADER, VERSIONS
from payments.services import payment_apply_event
from tests.factories import PaymentFactory, grant, processor_event
from tests.payments.test_api_envelope import error_of

pytestmark = pytest.mark.django_db

BALANCE = "/api/merchants/acme/balance/"


def test_without_the_header_the_answer_is_in_the_first_version_and_says_so(api_client, user):
    grant(user, "acme")

    response = api_client.get(BALANCE)

    assert response.status_code == 200
    assert response[VERSION_HEADER] == FIRST == "2026-11-01"
    assert "object" not in response.json()


@pytest.mark.parametrize("version", VERSIONS)
def test_a_named_version_is_served_and_named_on_the_answer(api_client, user, version):
    grant(user, "acme")

    response = api_client.get(BALANCE, headers={VERSION_HEADER: version})

    assert response.status_code == 200
    assert response[VERSION_HEADER] == version
    assert VERSION_HEADER in response["Vary"]
    assert ("object" in response.json()) == (version >= V2026_12_01)


def test_the_hosts_pin_is_served_to_a_request_that_names_none(api_client, user, module_settings):
    grant(user, "acme")
    module_settings.API_VERSION = V2026_12_01

    pinned = api_client.get(BALANCE)
    asked = api_client.get(BALANCE, headers={VERSION_HEADER: FIRST})

    assert pinned[VERSION_HEADER] == V2026_12_01 and pinned.json()["object"] == "balance"
    assert asked[VERSION_HEADER] == FIRST and "object" not in asked.json()


def test_an_error_answer_names_the_version_too(api_client):
    response = api_client.get(BALANCE, headers={VERSION_HEADER: V2026_12_01})

    error_of(response, 404, ErrorType.INVALID_REQUEST, "resource_missing")
    assert response[VERSION_HEADER] == V2026_12_01


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("2026-10-01", "'2026-10-01'"),  # a date, not a version
        ("2026-11-1", "'2026-11-1'"),
        ("2026/11/01", "a value of 10 characters"),
        ("latest", "'latest'"),
        ("v1", "'v1'"),
        ("2026-11-01T00:00:00Z", "'2026-11-01T00:00:00Z'"),
        (" 2026-11-01", "a value of 11 characters"),
        ("2026-11-01,2026-12-01", "a value of 21 characters"),
        ("", "a value of 0 characters"),
        ("2026-11-01\x00", "a value of 11 characters"),
        ("9" * 5000, "a value of 5000 characters"),
        # A bank number is never echoed.
        ("021000021-12345678", "a value of 18 characters"),
        ("٢٠٢٦-١١-٠١", "a value of 10 characters"),
    ],
)
def test_any_other_version_is_refused_naming_it(api_client, user, value, named):
    grant(user, "acme")

    response = api_client.get(BALANCE, headers={VERSION_HEADER: value})

    error = error_of(response, 400, ErrorType.INVALID_REQUEST, "api_version_invalid")
    assert error["param"] == VERSION_HEADER
    assert error["message"].startswith(f"{VERSION_HEADER}: {named} is not a version")
    assert all(version in error["message"] for version in VERSIONS)
    assert response[VERSION_HEADER] == FIRST  # the pin: the envelope is every version's


def test_a_bad_version_is_refused_before_anything_is_written(api_client, user):
    grant(user, "acme")
    body = {"merchant_id": "acme", "amount": "5.00", "source_token": "tok_abcdef12"}

    response = api_client.post(
        "/api/payments/",
        body,
        format="json",
        headers={VERSION_HEADER: "2099-01-01", "Idempotency-Key": "v-1"},
    )
    retried = api_client.post(
        "/api/payments/",
        body,
        format="json",
        headers={VERSION_HEADER: V2026_12_01, "Idempotency-Key": "v-1"},
    )

    error_of(response, 400, ErrorType.INVALID_REQUEST, "api_version_invalid")
    assert retried.status_code == 201 and "Idempotent-Replayed" not in retried


def test_an_unauthenticated_request_gets_its_version_too():
    response = APIClient().get(BALANCE, headers={VERSION_HEADER: V2026_12_01})

    error_of(response, 401, ErrorType.AUTHENTICATION, "not_authenticated")
    assert response[VERSION_HEADER] == V2026_12_01


@pytest.mark.parametrize("pin", ["2026-10-01", "latest", "", None, 20261101])
def test_a_pin_outside_the_versions_stops_start_up_naming_it(module_settings, pin):
    module_settings.API_VERSION = pin

    errors = [e for e in run_checks() if e.id == "payments.E003"]

    assert len(errors) == 1, errors
    assert "API_VERSION" in errors[0].msg


def test_the_balance_in_words_and_in_the_first_versions_figures(api_client, user):
    """Two debits settled past the reserve, one of them refunded then returned (the refund in
    flight, its amount owed back to the merchant), and one settled today, in the reserve."""
    from tests.payments.test_balance_property import MERCHANT, _run

    grant(user, MERCHANT)
    _run(
        [("debit", D("40.00")), ("settle", 0), ("debit", D("100.00")), ("settle", 1)]
        + [("refund_sent_then_return", 1, D("30.00"))],
        [],
        [],
    )
    today = PaymentFactory(merchant_id=MERCHANT, state="submitted", amount=D("25.00"))
    payment_apply_event(event=processor_event(today, "settled", timestamp=timezone.now()))
    url = f"/api/merchants/{MERCHANT}/balance/"

    words = api_client.get(url, headers={VERSION_HEADER: V2026_12_01}).json()
    first = api_client.get(url, headers={VERSION_HEADER: FIRST}).json()

    assert words == {
        "object": "balance",
        "merchant_id": MERCHANT,
        "balances": [
            {
                "currency": "USD",
                "pending": "-30.00",  # the refund, sent, not settled
                "posted": "65.00",  # 40 + 100 - 100 returned + 25
                "available": "10.00",  # 40, less the refund
                "reserved": "25.00",  # settled today
                "owed": "30.00",  # the refund, whose debit came back
            }
        ],
    }
    (usd,) = first["balances"]
    assert set(first) == {"merchant_id", "balances"}
    assert len(usd) == 15 and usd["net"] == usd["balance"] == "65.00"
    assert (usd["pending"], usd["available"], usd["money_out"]) == ("65.00", "10.00", "30.00")


@pytest.mark.parametrize(
    ("version", "error_type"),
    [(FIRST, ErrorType.IDEMPOTENCY), (V2026_12_01, ErrorType.INVALID_REQUEST)],
)
def test_a_key_reused_with_another_body_is_a_refusal_from_the_second_version(
    api_client, user, version, error_type
):
    """``idempotency_error`` is the retry with the same key (409, the key's request running);
    a key reused with another body is the client's mistake, not to retry as it is."""
    grant(user, "acme")
    body = {"merchant_id": "acme", "amount": "5.00", "source_token": "tok_abcdef12"}
    headers = {VERSION_HEADER: version, "Idempotency-Key": "reused"}
    assert (
        api_client.post("/api/payments/", body, format="json", headers=headers).status_code == 201
    )

    reused = api_client.post(
        "/api/payments/", {**body, "amount": "6.00"}, format="json", headers=headers
    )

    error_of(reused, 422, error_type, "idempotency_key_reused")


@pytest.mark.parametrize(
    ("version", "code"),
    [(FIRST, "noc_past_deadline"), (V2026_12_01, "notification_of_change_past_deadline")],
)
def test_a_noc_past_its_deadline_has_one_code_from_the_second_version(
    api_client, user, version, code
):
    """The create always said ``notification_of_change_past_deadline``; the reinitiate said
    ``noc_past_deadline``, which the first version keeps."""
    from tests.payments.test_reinitiation import _returned

    grant(user, "m-re")
    original = _returned("R01", token="tok_versions_noc1")
    payment_apply_event(
        event=processor_event(
            original,
            "notification_of_change",
            change_code="C01",
            corrected_data={"account_number_last4": "6789"},
            timestamp=timezone.now() - timedelta(days=30),
        )
    )
    headers = {VERSION_HEADER: version}
    body = {"merchant_id": "m-re", "amount": "5.00", "source_token": "tok_versions_noc1"}

    reinitiated = api_client.post(
        f"/api/payments/{original.id}/reinitiate/", {}, format="json", headers=headers
    )
    created = api_client.post("/api/payments/", body, format="json", headers=headers)

    error_of(reinitiated, 409, ErrorType.INVALID_REQUEST, code)
    error_of(created, 409, ErrorType.INVALID_REQUEST, "notification_of_change_past_deadline")


def test_a_body_refused_before_the_version_is_read_names_the_version_asked(api_client, user):
    response = api_client.post(
        "/api/payments/",
        '{"metadata": "' + "x" * 70_000 + '"}',
        content_type="application/json",
        headers={VERSION_HEADER: V2026_12_01},
    )

    error_of(response, 413, ErrorType.INVALID_REQUEST, "body_too_large")
    assert response[VERSION_HEADER] == V2026_12_01
