"""``POST /api/vault/accounts/`` takes an Idempotency-Key as ``POST /api/payments/`` does: a
client's retry replays the first token instead of minting a second one for the account, and
what the key keeps holds no number."""

import json
import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from bank.vault.apis import vault_request_fingerprint
from bank.vault.models import VaultAccount
from payments import idempotency
from payments.models import ApiIdempotencyKey
from tests.bank.vault.conftest import ACCOUNT, RAW_NUMBERS
from tests.factories import ApiIdempotencyKeyFactory, UserFactory, grant

pytestmark = pytest.mark.django_db
URL = "/api/vault/accounts/"


@pytest.fixture(autouse=True)
def _grants(user, vault_keys):
    grant(user, "m-1")


def _post(client, body, key):
    return client.post(URL, body, format="json", HTTP_IDEMPOTENCY_KEY=key)


def _assert_no_number(text: str) -> None:
    for number in RAW_NUMBERS:
        assert number not in text


def _stored(record: ApiIdempotencyKey) -> str:
    """Every column of the key's row, as text."""
    return " ".join(
        [record.key, record.request_hash, str(record.response_status)]
        + [json.dumps(record.response_body)]
    )


def test_a_retry_with_the_key_replays_the_first_token_and_stores_one_account(api_client):
    first = _post(api_client, ACCOUNT, "v1")
    second = _post(api_client, ACCOUNT, "v1")

    assert first.status_code == second.status_code == 201, first.content
    assert second.json() == first.json()
    assert second["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first
    assert VaultAccount.objects.count() == 1
    assert VaultAccount.objects.get().token == first.json()["token"]


def test_without_a_key_each_store_mints_its_own_token(api_client):
    tokens = {api_client.post(URL, ACCOUNT, format="json").json()["token"] for _ in range(2)}
    assert len(tokens) == 2


def test_what_the_key_stores_is_the_token_and_last_4_never_a_number(api_client):
    token = _post(api_client, ACCOUNT, "v2").json()["token"]

    record = ApiIdempotencyKey.objects.get(key="v2")
    assert record.response_status == 201
    assert record.response_body["token"] == token
    assert record.response_body["account_last4"] == "9012"
    _assert_no_number(_stored(record))
    # The fingerprint is keyed: the bare hash of the body (guessable, digit by digit, by
    # whoever holds the table) is not what is stored.
    assert record.request_hash != idempotency.request_fingerprint(ACCOUNT)
    assert record.request_hash != idempotency.request_fingerprint({"vault_account": ACCOUNT})


def test_the_fingerprint_tells_bodies_apart_and_depends_on_the_secret_key(settings):
    other = ACCOUNT | {"account_number": "123456789013"}
    assert vault_request_fingerprint(ACCOUNT) == vault_request_fingerprint(dict(ACCOUNT))
    assert vault_request_fingerprint(ACCOUNT) != vault_request_fingerprint(other)
    before = vault_request_fingerprint(ACCOUNT)
    settings.SECRET_KEY = "another secret key for this one test"
    assert vault_request_fingerprint(ACCOUNT) != before


def test_the_key_with_another_account_answers_422_and_echoes_no_number(api_client):
    _post(api_client, ACCOUNT, "v3")
    response = _post(api_client, ACCOUNT | {"account_number": "99990000111"}, "v3")

    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "idempotency_key_reused" and error["param"] == "Idempotency-Key"
    assert "99990000111" not in response.content.decode()
    _assert_no_number(response.content.decode())
    assert VaultAccount.objects.count() == 1


def test_a_key_used_for_a_payment_answers_422_on_the_vault(api_client):
    payment = {"merchant_id": "m-1", "amount": "5.00", "source_token": "tok_abcdef12"}
    created = api_client.post("/api/payments/", payment, format="json", HTTP_IDEMPOTENCY_KEY="v4")
    assert created.status_code == 201
    assert _post(api_client, ACCOUNT, "v4").status_code == 422
    assert VaultAccount.objects.count() == 0


def test_a_key_still_in_flight_answers_409_with_retry_after(api_client, user):
    fingerprint = idempotency.request_fingerprint(
        {"vault_account": vault_request_fingerprint(ACCOUNT)}
    )
    ApiIdempotencyKeyFactory(user=user, key="v5", request_hash=fingerprint)
    response = _post(api_client, ACCOUNT, "v5")

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "idempotency_key_in_use"
    assert response["Retry-After"] == "1"
    assert VaultAccount.objects.count() == 0


def test_a_key_a_crashed_store_left_is_taken_over_after_the_lease(api_client, user):
    record = ApiIdempotencyKeyFactory(
        user=user,
        key="v6",
        request_hash=idempotency.request_fingerprint(
            {"vault_account": vault_request_fingerprint(ACCOUNT)}
        ),
    )
    ApiIdempotencyKey.objects.filter(pk=record.pk).update(
        created_at=timezone.now() - timedelta(seconds=61)
    )
    assert _post(api_client, ACCOUNT, "v6").status_code == 201
    assert VaultAccount.objects.count() == 1


@pytest.mark.parametrize(
    ("change", "status"),
    [
        ({"routing_number": "011000016"}, 400),
        ({"account_number": "12"}, 400),
        ({"merchant_id": "m-other"}, 403),
    ],
    ids=["check-digit", "short-account", "merchant-not-granted"],
)
def test_a_refusal_is_not_stored_so_the_corrected_request_executes_under_the_key(
    api_client, change, status
):
    refused = _post(api_client, ACCOUNT | change, "v7")
    assert refused.status_code == status
    assert not ApiIdempotencyKey.objects.filter(key="v7").exists()

    corrected = _post(api_client, ACCOUNT, "v7")
    assert corrected.status_code == 201
    assert "Idempotent-Replayed" not in corrected
    assert VaultAccount.objects.count() == 1


def test_a_vault_without_keys_stores_nothing_under_the_key(api_client, module_settings):
    module_settings.VAULT_KEYS = {}
    module_settings.VAULT_ACTIVE_KEY = ""
    assert _post(api_client, ACCOUNT, "v8").status_code == 503
    assert not ApiIdempotencyKey.objects.filter(key="v8").exists()


def test_an_unexpected_error_releases_the_key_so_the_client_can_retry(api_client, monkeypatch):
    def boom(**kwargs):
        raise RuntimeError("database went away")

    monkeypatch.setattr("bank.vault.apis.vault_account_store", boom)
    api_client.raise_request_exception = False
    failed = _post(api_client, ACCOUNT, "v9")
    monkeypatch.undo()
    retried = _post(api_client, ACCOUNT, "v9")

    assert failed.status_code == 500
    _assert_no_number(failed.content.decode())
    assert retried.status_code == 201
    assert VaultAccount.objects.count() == 1


@pytest.mark.parametrize("key", ["", "k" * 256], ids=["empty", "too-long"])
def test_a_key_of_the_wrong_size_answers_400_naming_the_header(api_client, key):
    response = _post(api_client, ACCOUNT, key)
    assert response.status_code == 400
    assert list(response.json()["error"]["errors"]) == ["Idempotency-Key"]
    assert VaultAccount.objects.count() == 0


def _poster(user, statuses: list[int]):
    def post():
        client = APIClient()
        client.force_authenticate(user)
        try:
            statuses.append(_post(client, ACCOUNT, "race").status_code)
        finally:
            connection.close()

    return post


@pytest.mark.django_db(transaction=True)
def test_a_retry_while_the_first_store_runs_answers_409_and_one_account_is_stored(
    monkeypatch,
):
    from bank.vault import apis

    user = UserFactory()
    grant(user, "m-1")
    real_store = apis.vault_account_store
    in_flight, second_answered = threading.Event(), threading.Event()

    def slow_store(**kwargs):
        # The first request stays in flight, its key claimed, until the second is answered.
        if not in_flight.is_set():
            in_flight.set()
            second_answered.wait(10)
        return real_store(**kwargs)

    monkeypatch.setattr(apis, "vault_account_store", slow_store)
    statuses: list[int] = []
    first = threading.Thread(target=_poster(user, statuses))
    second = threading.Thread(target=_poster(user, statuses))
    first.start()
    assert in_flight.wait(10)
    second.start()
    second.join(10)
    second_answered.set()
    first.join(10)

    assert sorted(statuses) == [201, 409]
    assert VaultAccount.objects.count() == 1
    record = ApiIdempotencyKey.objects.get(key="race")
    assert record.response_body["token"] == VaultAccount.objects.get().token
    _assert_no_number(_stored(record))


@pytest.mark.django_db(transaction=True)
def test_two_threads_racing_with_one_key_store_one_account():
    user = UserFactory()
    grant(user, "m-1")
    barrier = threading.Barrier(2)
    statuses: list[int] = []
    post = _poster(user, statuses)

    def race():
        barrier.wait(10)
        post()

    threads = [threading.Thread(target=race) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)

    # Whichever claims the key stores; the other is told it is in flight, or replays.
    assert len(statuses) == 2 and 201 in statuses
    assert set(statuses) <= {201, 409}
    assert VaultAccount.objects.count() == 1
    assert ApiIdempotencyKey.objects.filter(key="race").count() == 1
