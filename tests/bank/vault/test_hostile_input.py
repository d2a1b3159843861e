"""``POST /api/vault/accounts/``, the one edge that takes raw bank numbers, against hostile
bodies: each is a 4xx naming the problem, nothing is stored, and no number is echoed."""

import json
import re

import pytest

from bank.vault.models import VaultAccount
from tests.bank.vault.conftest import ACCOUNT, RAW_NUMBERS
from tests.factories import grant

pytestmark = pytest.mark.django_db
URL = "/api/vault/accounts/"


@pytest.fixture(autouse=True)
def _grants(user, vault_keys):
    grant(user, "m-1")


def _raw(api_client, text: str):
    return api_client.generic("POST", URL, text.encode("utf-8", "surrogatepass"),
                              content_type="application/json")  # fmt: skip


def _refused(response, status: int = 400) -> dict:
    assert response.status_code == status, response.content
    text = response.content.decode()
    for number in RAW_NUMBERS:
        assert number not in text
    assert not VaultAccount.objects.exists()
    return response.json()["error"]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("holder_name", "Jane\x00Doe"),
        ("merchant_id", "m-1\x00"),
        ("account_number", "1234\x005678"),
    ],
    ids=["nul-name", "nul-merchant", "nul-number"],
)
def test_a_nul_is_refused_naming_the_field(api_client, field, value):
    error = _refused(api_client.post(URL, {**ACCOUNT, field: value}, format="json"))
    assert field in error["errors"], error


def test_a_lone_surrogate_is_refused_naming_the_body_or_field(api_client):
    body = json.dumps({**ACCOUNT, "holder_name": "PLACEHOLDER"}).replace("PLACEHOLDER", "\\ud800")
    error = _refused(_raw(api_client, body))
    assert error["param"] in ("holder_name", "body"), error


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_a_non_finite_number_is_refused(api_client, literal):
    body = json.dumps({**ACCOUNT, "account_number": "X"}).replace('"X"', literal)
    error = _refused(_raw(api_client, body))
    assert error["message"]


def test_an_unknown_field_is_refused_naming_it(api_client):
    error = _refused(api_client.post(URL, {**ACCOUNT, "ssn": "123-45-6789"}, format="json"))
    assert "ssn" in error["errors"], error


def test_a_deeply_nested_body_is_refused(api_client):
    body = json.dumps({**ACCOUNT, "holder_name": "X"}).replace('"X"', "[" * 5000 + "]" * 5000)
    error = _refused(_raw(api_client, body))
    assert error["message"]


def test_a_huge_body_is_refused_413(api_client):
    body = json.dumps({**ACCOUNT, "holder_name": "x" * 2_000_000})
    error = _refused(_raw(api_client, body), status=413)
    assert error["param"] == "body"


def test_a_body_that_is_not_an_object_is_refused(api_client):
    _refused(_raw(api_client, json.dumps([ACCOUNT])))


def test_another_merchants_account_is_refused_403(api_client):
    error = _refused(
        api_client.post(URL, {**ACCOUNT, "merchant_id": "m-other"}, format="json"), status=403
    )
    assert error["param"] == "merchant_id"


_BARE_17 = "77668056869313516"


@pytest.mark.parametrize(
    ("body", "param", "problem"),
    [
        (
            json.dumps({**ACCOUNT, "account_number": "X"}).replace('"X"', _BARE_17),
            "account_number",
            "an integer of 17 digits is out of range",
        ),
        (
            json.dumps({**ACCOUNT, "account_number": "X"}).replace('"X"', "-" + _BARE_17 + "000"),
            "account_number",
            "an integer of 20 digits is out of range",
        ),
        (
            json.dumps(ACCOUNT)[:-1] + f', "{_BARE_17}": "a", "{_BARE_17}": "b"}}',
            "****3516",
            "given more than once",
        ),
        (
            json.dumps({**ACCOUNT, "memo": {"7766805686931": "x"}}).replace('"x"', '"\\u0000"'),
            "memo",
            "at memo.****6931: contains a NUL character",
        ),
        (
            json.dumps({**ACCOUNT, "memo": {"\u0667" * 13: "x"}}, ensure_ascii=False).replace(
                '"x"', '"\\u0000"'
            ),
            "memo",
            "at memo.****\u0667\u0667\u0667\u0667: contains a NUL character",
        ),
    ],
    ids=["bare-17-digits", "bare-20-digits", "duplicate-17-digit-key", "13-digit-key", "arabic"],
)
def test_a_number_the_parser_refuses_is_named_by_place_and_never_echoed(
    api_client, body, param, problem
):
    response = _raw(api_client, body)
    error = _refused(response)
    assert error["param"] == param, error
    assert problem in error["message"], error
    text = response.content.decode()
    assert _BARE_17 not in text and "7766805686931" not in text and "\u0667" * 5 not in text
    assert not re.search(
        r"\d{5,}", json.dumps(error, ensure_ascii=False).replace(error["request_id"], "")
    )


@pytest.mark.parametrize("key", ["\\ud800", "a\\u0000"], ids=["surrogate", "nul"])
def test_a_duplicate_key_that_cannot_be_shown_is_named_by_its_place(api_client, key):
    body = json.dumps(ACCOUNT)[:-1] + f', "memo": {{"{key}": 1, "{key}": 2}}}}'
    error = _refused(_raw(api_client, body))
    assert error["param"] == "memo", error
    assert "at memo.<key>: given more than once" in error["message"], error
