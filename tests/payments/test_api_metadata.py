"""``metadata`` on a payment, bounded as Stripe's: up to 50 keys of at most 40 characters, each
value a string of at most 500. Anything else is a 400 naming the key, and nothing is stored."""

import json

import pytest

from payments.models import Payment
from tests.factories import grant

pytestmark = pytest.mark.django_db

BODY = {"merchant_id": "acme", "amount": "25.00", "currency": "USD", "source_token": "tok_abcdef12"}


@pytest.fixture
def granted(api_client, user):
    grant(user, "acme")
    return api_client


def create(client, metadata):
    return client.post("/api/payments/", {**BODY, "metadata": metadata}, format="json")


def create_raw(client, raw_metadata: str):
    body = json.dumps(BODY)[:-1] + f', "metadata": {raw_metadata}}}'
    return client.post("/api/payments/", body, content_type="application/json")


def refused(response) -> dict:
    assert response.status_code == 400, response.content
    assert Payment.objects.count() == 0
    return response.json()["error"]


def test_metadata_is_stored_and_returned_by_create_detail_and_list(granted):
    metadata = {"order_id": "SO-1001", "note": "é ü 中文", "empty": ""}
    created = create(granted, metadata)

    assert created.status_code == 201
    assert created.json()["metadata"] == metadata
    payment_id = created.json()["id"]
    assert Payment.objects.get(pk=payment_id).metadata == metadata
    assert granted.get(f"/api/payments/{payment_id}/").json()["metadata"] == metadata
    assert granted.get("/api/payments/").json()["results"][0]["metadata"] == metadata


def test_without_metadata_a_payment_has_an_empty_object(granted):
    created = granted.post("/api/payments/", BODY, format="json")
    assert created.json()["metadata"] == {}


def test_fifty_keys_of_forty_characters_and_values_of_500_are_taken(granted):
    metadata = {f"{i:02d}".ljust(40, "k"): "v" * 500 for i in range(50)}
    assert create(granted, metadata).status_code == 201


def test_fifty_one_keys_are_refused(granted):
    error = refused(create(granted, {f"k{i}": "v" for i in range(51)}))
    assert error["param"] == "metadata"
    assert "at most 50 keys" in error["errors"]["metadata"][0]


@pytest.mark.parametrize(
    "value", [7, 1.5, True, None, ["a"], {"nested": "object"}], ids=lambda v: type(v).__name__
)
def test_a_value_that_is_not_a_string_is_refused_naming_its_key(granted, value):
    error = refused(create(granted, {"ok": "fine", "bad": value}))
    assert error["param"] == "metadata[bad]"
    assert list(error["errors"]) == ["metadata[bad]"]


def test_a_huge_value_is_refused_without_echoing_it(granted):
    response = create(granted, {"big": "x" * 60_000})
    error = refused(response)
    assert error["param"] == "metadata[big]"
    assert "at most 500 characters" in error["message"]
    assert len(response.content) < 2048


def test_a_key_over_forty_characters_is_refused(granted):
    error = refused(create(granted, {"k" * 41: "v"}))
    assert error["param"] == "metadata" and "1-40 characters" in error["message"]


def test_an_empty_key_is_refused(granted):
    assert refused(create(granted, {"": "v"}))["param"] == "metadata"


@pytest.mark.parametrize("raw", ['{"a\\u0000b": "v"}', '{"k": "a\\u0000b"}'])
def test_nul_in_a_key_or_value_is_refused(granted, raw):
    error = refused(create_raw(granted, raw))
    assert "NUL" in json.dumps(error)


@pytest.mark.parametrize("raw", ['{"\\ud800": "v"}', '{"k": "\\udfff"}'])
def test_a_lone_surrogate_in_a_key_or_value_is_refused(granted, raw):
    error = refused(create_raw(granted, raw))
    assert "surrogate" in json.dumps(error)


def test_a_control_character_in_a_key_is_refused_and_not_echoed_as_a_name(granted):
    error = refused(create(granted, {"line\nbreak": "v"}))
    assert error["param"] == "metadata" and "control character" in error["message"]


def test_metadata_that_is_not_an_object_is_refused(granted):
    for value in (["a", "b"], "text", 5, None):
        assert refused(create(granted, value))["param"] == "metadata"


def test_a_bank_number_in_metadata_is_refused_and_never_echoed(granted):
    response = create(granted, {"account": "021000021"})
    error = refused(response)
    assert error["param"] == "metadata[account]"
    assert "021000021" not in response.content.decode()
    key_response = create(granted, {"021000021": "v"})
    assert refused(key_response)["param"] == "metadata"
    assert "021000021" not in key_response.content.decode()


def test_a_refused_metadata_does_not_bind_the_idempotency_key(granted):
    bad = {**BODY, "metadata": {"n": 1}}
    good = {**BODY, "metadata": {"n": "1"}}
    first = granted.post("/api/payments/", bad, format="json", HTTP_IDEMPOTENCY_KEY="m-1")
    assert first.status_code == 400
    second = granted.post("/api/payments/", good, format="json", HTTP_IDEMPOTENCY_KEY="m-1")
    assert second.status_code == 201 and second.json()["metadata"] == {"n": "1"}
