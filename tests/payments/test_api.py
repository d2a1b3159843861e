import threading
import time
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from payments import idempotency
from payments.models import ApiIdempotencyKey, Payment
from tests.factories import ApiIdempotencyKeyFactory, PaymentFactory, UserFactory, grant

pytestmark = pytest.mark.django_db

BODY = {"merchant_id": "m-1", "amount": "25.00", "currency": "USD", "source_token": "tok_abcdef12"}


@pytest.fixture(autouse=True)
def _grants(user):
    grant(user, "m-1", "m-7", "nobody")


def test_create_returns_201_with_the_payment(api_client):
    response = api_client.post("/api/payments/", BODY, format="json")

    assert response.status_code == 201
    data = response.json()
    assert data["state"] == "pending"
    assert data["amount"] == "25.00"
    assert set(data) >= {
        "id",
        "state",
        "idempotency_key",
        "merchant_id",
        "amount",
        "currency",
        "created_at",
    }
    assert Payment.objects.get(pk=data["id"]).idempotency_key.hex == data[
        "idempotency_key"
    ].replace("-", "")


def test_without_credentials_answers_401(db):
    response = APIClient().post("/api/payments/", BODY, format="json")
    assert response.status_code == 401
    assert Payment.objects.count() == 0


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("source_token", "021000021", "raw bank account"),
        ("source_token", "acct 12345678901", "raw bank account"),
        ("amount", 25.0, "decimal string"),
        ("amount", "0.00", "greater than or equal"),
        ("amount", "1.234", "two decimals"),
        ("currency", "EUR", "not a valid choice"),
        ("merchant_id", "", "blank"),
    ],
)
def test_bad_input_answers_400_naming_the_field(api_client, field, value, message):
    response = api_client.post("/api/payments/", {**BODY, field: value}, format="json")

    assert response.status_code == 400
    errors = response.json()["error"]["errors"]
    assert list(errors) == [field]
    assert message in " ".join(errors[field])
    assert Payment.objects.count() == 0


def test_missing_fields_are_each_named(api_client):
    response = api_client.post("/api/payments/", {}, format="json")
    assert response.status_code == 400
    assert set(response.json()["error"]["errors"]) == {"merchant_id", "amount", "source_token"}


def test_same_key_and_body_replays_the_stored_answer(api_client):
    first = api_client.post("/api/payments/", BODY, format="json", HTTP_IDEMPOTENCY_KEY="k1")
    second = api_client.post("/api/payments/", BODY, format="json", HTTP_IDEMPOTENCY_KEY="k1")

    assert first.status_code == second.status_code == 201
    assert second.json() == first.json()
    assert second["Idempotent-Replayed"] == "true"
    assert Payment.objects.count() == 1


def test_same_key_with_another_body_answers_422(api_client):
    api_client.post("/api/payments/", BODY, format="json", HTTP_IDEMPOTENCY_KEY="k2")
    response = api_client.post(
        "/api/payments/", {**BODY, "amount": "26.00"}, format="json", HTTP_IDEMPOTENCY_KEY="k2"
    )

    assert response.status_code == 422
    assert "different request body" in str(response.json())
    assert Payment.objects.count() == 1


def test_keys_are_per_user(api_client):
    api_client.post("/api/payments/", BODY, format="json", HTTP_IDEMPOTENCY_KEY="k3")
    other = APIClient()
    other_user = UserFactory()
    grant(other_user, BODY["merchant_id"])
    other.force_authenticate(other_user)
    response = other.post("/api/payments/", BODY, format="json", HTTP_IDEMPOTENCY_KEY="k3")

    assert response.status_code == 201
    assert Payment.objects.count() == 2


def test_key_still_in_flight_answers_409(api_client, user):
    fingerprint = idempotency.request_fingerprint(BODY)
    ApiIdempotencyKeyFactory(user=user, key="k4", request_hash=fingerprint)
    response = api_client.post("/api/payments/", BODY, format="json", HTTP_IDEMPOTENCY_KEY="k4")

    assert response.status_code == 409
    assert Payment.objects.count() == 0


def test_key_abandoned_by_a_crashed_request_is_taken_over_after_the_lease(api_client, user):
    record = ApiIdempotencyKeyFactory(
        user=user, key="k5", request_hash=idempotency.request_fingerprint(BODY)
    )
    ApiIdempotencyKey.objects.filter(pk=record.pk).update(
        created_at=timezone.now() - timedelta(seconds=61)
    )
    response = api_client.post("/api/payments/", BODY, format="json", HTTP_IDEMPOTENCY_KEY="k5")

    assert response.status_code == 201
    assert Payment.objects.count() == 1


def test_validation_errors_are_not_stored_under_the_key(api_client):
    bad = {**BODY, "source_token": "021000021"}
    first = api_client.post("/api/payments/", bad, format="json", HTTP_IDEMPOTENCY_KEY="k6")
    second = api_client.post("/api/payments/", bad, format="json", HTTP_IDEMPOTENCY_KEY="k6")
    assert first.status_code == second.status_code == 400
    assert "Idempotent-Replayed" not in second
    assert not ApiIdempotencyKey.objects.filter(key="k6").exists()


def test_an_unexpected_error_releases_the_key_so_the_client_can_retry(api_client, monkeypatch):
    def boom(**kwargs):
        raise RuntimeError("database went away")

    monkeypatch.setattr("payments.api.payments.payment_create", boom)
    api_client.raise_request_exception = False
    failed = api_client.post("/api/payments/", BODY, format="json", HTTP_IDEMPOTENCY_KEY="k7")
    monkeypatch.undo()
    retried = api_client.post("/api/payments/", BODY, format="json", HTTP_IDEMPOTENCY_KEY="k7")

    assert failed.status_code == 500
    assert retried.status_code == 201
    assert Payment.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_requests_with_one_key_create_one_payment(monkeypatch):
    from payments.api import payments as apis

    user = UserFactory()
    grant(user, BODY["merchant_id"])
    real_create = apis.payment_create
    in_flight, second_answered = threading.Event(), threading.Event()

    def slow_create(**kwargs):
        # The first request stays in flight, its key claimed, until the second is answered.
        if not in_flight.is_set():
            in_flight.set()
            second_answered.wait(10)
        return real_create(**kwargs)

    monkeypatch.setattr(apis, "payment_create", slow_create)
    statuses: list[int] = []

    def post():
        client = APIClient()
        client.force_authenticate(user)
        statuses.append(
            client.post(
                "/api/payments/", BODY, format="json", HTTP_IDEMPOTENCY_KEY="race"
            ).status_code
        )
        connection.close()

    first, second = threading.Thread(target=post), threading.Thread(target=post)
    first.start()
    assert in_flight.wait(10)
    second.start()
    second.join(10)
    second_answered.set()
    first.join(10)

    assert sorted(statuses) == [201, 409]
    assert Payment.objects.count() == 1


def test_detail_shows_state_events_attempts_and_errors(api_client):
    created = api_client.post("/api/payments/", BODY, format="json").json()

    response = api_client.get(f"/api/payments/{created['id']}/")

    assert response.status_code == 200
    data = response.json()
    assert data["state"] == "pending"
    assert [e["kind"] for e in data["events"]] == ["created"]
    assert data["attempts"] == []
    assert data["errors"] == []


def test_detail_of_unknown_payment_is_404(api_client):
    payment = PaymentFactory.build()
    assert api_client.get(f"/api/payments/{payment.id}/").status_code == 404


def test_balance_sums_the_merchants_ledger(api_client):
    from payments.services import payment_apply_event
    from tests.factories import processor_event

    for amount in ("10.00", "2.50"):
        payment = PaymentFactory(state="submitted", merchant_id="m-7", amount=Decimal(amount))
        payment_apply_event(event=processor_event(payment, "settled"))

    response = api_client.get("/api/merchants/m-7/balance/")

    assert response.status_code == 200
    assert response.json()["balances"] == [
        {
            "currency": "USD",
            "credits": "12.50",
            "reversals": "0.00",
            "recredits": "0.00",
            "net": "12.50",
            "confirmed_count": 2,
            "returned_count": 0,
            "balance": "12.50",
            "entries": 2,
            "confirmed_total": "12.50",
            "returned_total": "0.00",
            "pending": "12.50",
            "posted": "12.50",
            # Settled on 2 November by their events' timestamps: past the return reserve.
            "available": "12.50",
            "money_out": "0.00",
        }
    ]


def test_balance_of_merchant_without_entries_is_empty(api_client):
    assert api_client.get("/api/merchants/nobody/balance/").json() == {
        "merchant_id": "nobody",
        "balances": [],
    }


@pytest.mark.django_db(transaction=True)
def test_a_request_still_running_past_the_lease_is_never_taken_over(module_settings):
    """The first request's work outlives the lease (a slow database, a long lock wait): a second
    request with the key finds the key row locked by that work and answers 409, so the work
    runs once; once the first has answered, the key replays its answer."""
    module_settings.API_IDEMPOTENCY_LEASE = timedelta(seconds=1)
    user = UserFactory()
    started, release = threading.Event(), threading.Event()
    runs: list[str] = []

    def slow_work():
        runs.append("first")
        started.set()
        assert release.wait(30)
        return idempotency.Answer(201, {"run": len(runs)})

    def second_work():
        runs.append("second")
        return idempotency.Answer(201, {"run": len(runs)})

    def first():
        try:
            return idempotency.idempotency_key_run(
                user=user, key="slow", request_data=BODY, work=slow_work
            )
        finally:
            connection.close()

    results: list = []
    thread = threading.Thread(target=lambda: results.append(first()))
    thread.start()
    assert started.wait(30)
    # Past the lease, as a request running longer than it would be (the row is locked by the
    # first request's work, so its age cannot be written, only waited out).
    time.sleep(1.5)

    while_running = idempotency.idempotency_key_run(
        user=user, key="slow", request_data=BODY, work=second_work
    )
    release.set()
    thread.join(30)
    after = idempotency.idempotency_key_run(
        user=user, key="slow", request_data=BODY, work=second_work
    )

    assert while_running.outcome == idempotency.IdempotentOutcome.IN_FLIGHT
    assert results[0].outcome == idempotency.IdempotentOutcome.ANSWERED
    assert (after.outcome, after.answer.body) == (
        idempotency.IdempotentOutcome.REPLAYED,
        {"run": 1},
    )
    assert runs == ["first"]


def test_the_lease_is_a_setting_a_crashed_claim_waits_out(api_client, user, module_settings):
    module_settings.API_IDEMPOTENCY_LEASE = timedelta(minutes=10)
    record = ApiIdempotencyKeyFactory(
        user=user, key="k-lease", request_hash=idempotency.request_fingerprint(BODY)
    )
    ApiIdempotencyKey.objects.filter(pk=record.pk).update(
        created_at=timezone.now() - timedelta(minutes=5)
    )

    within = api_client.post("/api/payments/", BODY, format="json", HTTP_IDEMPOTENCY_KEY="k-lease")
    module_settings.API_IDEMPOTENCY_LEASE = timedelta(minutes=4)
    after = api_client.post("/api/payments/", BODY, format="json", HTTP_IDEMPOTENCY_KEY="k-lease")

    assert (within.status_code, after.status_code) == (409, 201)
    assert Payment.objects.count() == 1


def _other_connection():
    """A connection of its own to the test database, outside the test's transaction."""
    import psycopg
    from django.db import connection as django_connection

    params = django_connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    return psycopg.connect(**params)


@pytest.mark.django_db(transaction=True)
def test_a_key_whose_claim_lock_another_transaction_holds_answers_409_at_once():
    """The claim's advisory lock is what a running request holds (its row is not committed
    yet): a second request with the key answers 409 without waiting for it."""
    user = UserFactory()
    grant(user, BODY["merchant_id"])
    client = APIClient()
    client.force_authenticate(user)
    with _other_connection() as other, other.transaction():
        other.execute(
            "SELECT pg_advisory_xact_lock(%s, hashtext(%s))",
            [idempotency.CLAIM_LOCK_NAMESPACE, f"{user.pk}:held"],
        )
        started = time.monotonic()
        response = client.post("/api/payments/", BODY, format="json", HTTP_IDEMPOTENCY_KEY="held")
        waited = time.monotonic() - started

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "idempotency_key_in_use"
    assert waited < 5
    assert not Payment.objects.exists()
    assert not ApiIdempotencyKey.objects.filter(key="held").exists()


@pytest.mark.django_db(transaction=True)
def test_a_committed_claim_whose_row_another_transaction_locks_answers_409():
    """A claim committed on its own (the way before the claim moved into the work's transaction,
    and the way of other databases) whose request is still running, past the lease: its row
    is locked, so it is not taken over."""
    user = UserFactory()
    grant(user, BODY["merchant_id"])
    record = ApiIdempotencyKeyFactory(
        user=user, key="old-way", request_hash=idempotency.request_fingerprint(BODY)
    )
    ApiIdempotencyKey.objects.filter(pk=record.pk).update(
        created_at=timezone.now() - timedelta(hours=1)
    )
    client = APIClient()
    client.force_authenticate(user)
    table = ApiIdempotencyKey._meta.db_table
    with _other_connection() as other, other.transaction():
        other.execute(f"SELECT 1 FROM {table} WHERE id = %s FOR UPDATE", [record.pk])
        response = client.post(
            "/api/payments/", BODY, format="json", HTTP_IDEMPOTENCY_KEY="old-way"
        )

    assert response.status_code == 409
    assert not Payment.objects.exists()
    assert ApiIdempotencyKey.objects.get(pk=record.pk).completed_at is None


@pytest.mark.django_db(transaction=True)
def test_a_request_with_the_key_after_the_first_committed_replays_it():
    """The first request's claim, work and answer commit together; the next one with the key
    takes the lock, finds the row and replays the answer."""
    user = UserFactory()
    grant(user, BODY["merchant_id"])
    client = APIClient()
    client.force_authenticate(user)

    first = client.post("/api/payments/", BODY, format="json", HTTP_IDEMPOTENCY_KEY="after")
    second = client.post("/api/payments/", BODY, format="json", HTTP_IDEMPOTENCY_KEY="after")

    assert first.status_code == second.status_code == 201
    assert second["Idempotent-Replayed"] == "true"
    assert first.json() == second.json()
    assert Payment.objects.count() == 1


def test_the_stored_answer_is_written_on_the_claims_row_and_read_back_as_given(user):
    record = ApiIdempotencyKeyFactory(user=user, key="k-stored")
    body = {"id": "p-1", "amount": "1.50", "nested": {"n": 1.5, "list": [1, "x", None]}}

    idempotency.idempotency_key_complete(record=record, status=201, body=body)

    stored = ApiIdempotencyKey.objects.get(pk=record.pk)
    assert (stored.response_status, stored.response_body) == (201, body)
    assert stored.completed_at == record.completed_at is not None


def test_storing_an_answer_on_a_claim_that_is_gone_fails():
    from django.db import DatabaseError

    record = ApiIdempotencyKeyFactory(key="k-gone")
    ApiIdempotencyKey.objects.filter(pk=record.pk).delete()

    with pytest.raises(DatabaseError, match="did not affect any rows"):
        idempotency.idempotency_key_complete(record=record, status=201, body={})
