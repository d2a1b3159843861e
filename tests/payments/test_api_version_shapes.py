"""The same requests in both versions, each answer's shape checked: what 2026-12-01 changed
(the balance, the webhooks' lists) and what it left as it was (a payment created, read and
listed; a refused create's envelope)."""

import pytest

from payments.api_versions import FIRST, V2026_12_01, VERSION_HEADER, VERSIONS
from payments.webhooks.delivery import events_dispatch
from tests.factories import grant
from tests.payments.webhook_support import settle

pytestmark = pytest.mark.django_db

MERCHANT = "m-hooks"
BODY = {"merchant_id": MERCHANT, "amount": "25.00", "source_token": "tok_abcdef12"}
PAGE_KEYS = {"object", "next", "previous", "has_more", "results"}
FIRST_BALANCE_KEYS = {
    "currency",
    "credits",
    "reversals",
    "recredits",
    "net",
    "confirmed_count",
    "returned_count",
    "returned_total",
    "balance",
    "entries",
    "confirmed_total",
    "pending",
    "posted",
    "available",
    "money_out",
}


@pytest.fixture(params=VERSIONS)
def version(request):
    return request.param


@pytest.fixture
def client_of(api_client, user, version):
    """The API client, every request naming ``version``; every answer is checked to name it."""
    grant(user, MERCHANT)
    headers = {VERSION_HEADER: version}

    def call(method: str, path: str, body=None, **extra):
        response = getattr(api_client, method)(
            path, body, format="json", headers={**headers, **extra}
        )
        assert response[VERSION_HEADER] == version
        return response

    return call


def test_a_payment_created_read_and_listed_is_one_shape_in_both(client_of, version):
    created = client_of("post", "/api/payments/", BODY, **{"Idempotency-Key": f"s-{version}"})
    read = client_of("get", f"/api/payments/{created.json()['id']}/")
    listed = client_of("get", "/api/payments/")

    assert created.status_code == 201 and created.json()["object"] == "payment"
    assert read.status_code == 200 and read.json()["object"] == "payment"
    assert set(listed.json()) == PAGE_KEYS
    (payment,) = listed.json()["results"]
    assert payment == created.json()


def test_a_refused_create_is_the_same_envelope_in_both(client_of):
    refused = client_of("post", "/api/payments/", {**BODY, "amount": 25})

    assert refused.status_code == 400
    error = refused.json()["error"]
    assert (error["type"], error["code"], error["param"]) == (
        "invalid_request_error",
        "parameter_invalid",
        "amount",
    )


def test_the_balance_is_the_versions_shape(client_of, version):
    settle(merchant_id=MERCHANT)

    balance = client_of("get", f"/api/merchants/{MERCHANT}/balance/").json()

    (usd,) = balance["balances"]
    if version == FIRST:
        assert set(balance) == {"merchant_id", "balances"}
        assert set(usd) == FIRST_BALANCE_KEYS
    else:
        assert set(balance) == {"object", "merchant_id", "balances"}
        assert balance["object"] == "balance"
        assert set(usd) == {"currency", "pending", "posted", "available", "reserved", "owed"}


def test_the_events_list_is_the_versions_convention_with_its_strict_cursor(client_of, version):
    first, second = settle(merchant_id=MERCHANT), settle(merchant_id=MERCHANT)
    events_dispatch()

    page = client_of("get", f"/api/events/?merchant={MERCHANT}&limit=3").json()
    if version == FIRST:
        assert set(page) == {"object", "data", "has_more", "next_cursor"}
        events, after = page["data"], page["next_cursor"]
        rest = client_of("get", f"/api/events/?merchant={MERCHANT}&after={after}").json()
        events += rest["data"]
        assert rest["next_cursor"] == events[-1]["id"]
    else:
        assert set(page) == PAGE_KEYS and page["previous"] is None
        assert page["next"].startswith("http://testserver/api/events/?")
        rest = client_of("get", page["next"]).json()
        events = page["results"] + rest["results"]
        assert rest["next"] is None and not rest["has_more"]
    assert page["object"] == "list" and page["has_more"]
    paid = [event["data"]["object"]["id"] for event in events]
    assert paid == [str(first.id)] * 2 + [str(second.id)] * 2
    forged = client_of("get", f"/api/events/?merchant={MERCHANT}&after=evt_forged")
    assert forged.status_code == 400 and forged.json()["error"]["param"] == "after"


def test_the_webhook_endpoints_list_is_the_versions_convention(client_of, version):
    url = "https://hooks.example.com/payments"
    created = client_of("post", "/api/webhook_endpoints/", {"merchant_id": MERCHANT, "url": url})

    listed = client_of("get", "/api/webhook_endpoints/").json()

    if version >= V2026_12_01:
        assert listed == {
            "object": "list",
            "next": None,
            "previous": None,
            "has_more": False,
            "results": listed["results"],
        }
        endpoints = listed["results"]
    else:
        assert set(listed) == {"object", "data", "has_more"}
        endpoints = listed["data"]
    assert [endpoint["id"] for endpoint in endpoints] == [created.json()["id"]]
