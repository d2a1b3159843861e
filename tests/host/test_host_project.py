"""The module inside a foreign host project (tests/host/settings.py): custom user model with
e-mail login and UUID keys, the host's DRF defaults and error format, the module under /ach/,
its admin inside the host's admin, a host receiver of payment_transitioned. End to end on
PostgreSQL, the local SQS server and the sandbox processor."""

import json
import time
import uuid
from datetime import UTC, datetime

import pytest
from django.apps import apps
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import get_commands
from django.test import Client
from rest_framework.authtoken.models import Token

from callbacks.models import QueueMessage
from payments import signing
from payments.models import LedgerEntry, MerchantAccess, Payment, PaymentState
from tests.callbacks.worker_support import run_worker
from tests.host.shop.models import Order, PaymentNotice
from triage.ingestion import dead_letters_ingest
from triage.models import DeadLetter

pytestmark = pytest.mark.django_db(transaction=True)

MERCHANT = "shop-eu"


@pytest.fixture
def api_user():
    user = get_user_model().objects.create_user("ach-api@shop.example", "pw")
    MerchantAccess.objects.create(user=user, merchant_id=MERCHANT)
    return user


@pytest.fixture
def token_client(api_user) -> Client:
    token = Token.objects.create(user=api_user)
    return Client(headers={"Authorization": f"Token {token.key}"})


@pytest.fixture
def ops_admin():
    return get_user_model().objects.create_superuser("ops@shop.example", "pw")


def create_payment(client: Client, **overrides):
    body = {
        "merchant_id": MERCHANT,
        "amount": "42.50",
        "currency": "USD",
        "source_token": "tok_shop_customer_1",
        **overrides,
    }
    return client.post("/ach/api/payments/", json.dumps(body), content_type="application/json")


def post_callback(payment_id, *, event_id: str, amount: str, secret: str = "host-secret-old"):
    raw = json.dumps(
        {
            "payment_id": str(payment_id),
            "event_type": "settled",
            "processor_event_id": event_id,
            "amount": amount,
            "timestamp": datetime.now(UTC).isoformat(),
        }
    ).encode()
    return Client().post(
        "/ach/callbacks/processor/",
        raw,
        content_type="application/json",
        headers={signing.HEADER: signing.sign(raw, [secret])},
    )


def test_the_host_project_runs_without_the_modules_own_project_package():
    assert settings.SETTINGS_MODULE == "tests.host.settings"
    assert settings.AUTH_USER_MODEL == "host_accounts.User"
    user_pk = get_user_model()._meta.pk
    assert user_pk.get_internal_type() == "UUIDField"
    assert not any(name.startswith("config") for name in settings.INSTALLED_APPS)


def test_the_host_does_not_install_the_sandbox_processor():
    # The tests here still run a sandbox on loopback (a plain object), but the app is not
    # installed: its command does not exist in the host.
    assert not apps.is_installed("sandbox")
    assert "run_sandbox_processor" not in get_commands()


def test_host_drf_defaults_are_in_force_on_the_hosts_own_views(token_client, ops_admin):
    # IsAdminUser, the shop's key header and its error format: a Token means nothing here.
    response = token_client.get("/shop/v1/whoami/")
    assert response.status_code == 418  # only the host's exception handler answers 418
    # The host's URLPathVersioning: v1 is served, any other version refused (in its format).
    shop_key = Client(headers={"X-Shop-Key": "shop-admin-key"})
    assert shop_key.get("/shop/v1/whoami/").status_code == 200
    assert shop_key.get("/shop/v2/whoami/").status_code == 418


def test_module_views_keep_their_own_authentication_and_error_format(ops_admin):
    # The host's key header authenticates the host's views, not the module's.
    response = Client(headers={"X-Shop-Key": "shop-admin-key"}).get(
        f"/ach/api/payments/{uuid.uuid4()}/"
    )
    assert response.status_code == 401
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("authentication_error", "not_authenticated")
    assert error["request_id"] == response["Request-Id"]
    assert "shop_error" not in response.json()


def test_module_endpoints_answer_as_documented_whatever_the_hosts_drf_policies(token_client):
    """URLPathVersioning, a page format, throttles of one request a day, no metadata class:
    none of it reaches the module's views, which answer as the schema says."""
    ids = [create_payment(token_client, amount=f"1.0{i}").json()["id"] for i in range(3)]

    for payment_id in ids:
        detail = token_client.get(f"/ach/api/payments/{payment_id}/")
        assert detail.status_code == 200, detail.content
        assert detail.json()["id"] == payment_id and detail["Request-Id"].startswith("req_")
    listed = token_client.get("/ach/api/payments/", {"limit": 2})
    assert listed.status_code == 200
    page = listed.json()
    # not the host's shop_page
    assert set(page) == {"object", "next", "previous", "has_more", "results"}
    assert [p["id"] for p in page["results"]] == ids[::-1][:2]
    rest = token_client.get(page["next"])
    assert [p["id"] for p in rest.json()["results"]] == ids[:1]
    balance = token_client.get(f"/ach/api/merchants/{MERCHANT}/balance/")
    assert balance.status_code == 200
    # The module's version is its header, whatever the host's versioning class reads.
    assert balance["Payments-Version"] == "2026-11-01" and "object" not in balance.json()
    in_words = token_client.get(
        f"/ach/api/merchants/{MERCHANT}/balance/", headers={"Payments-Version": "2026-12-01"}
    )
    assert in_words["Payments-Version"] == "2026-12-01"
    assert in_words.json()["object"] == "balance"
    assert token_client.options("/ach/api/payments/").json()["name"]
    # The module's own 404, in its envelope, not the host's 418.
    missing = token_client.get(f"/ach/api/payments/{uuid.uuid4()}/")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "resource_missing"


def test_module_api_answers_json_errors_whatever_the_hosts_parser_and_renderer(token_client):
    response = create_payment(token_client, amount="1e3", extra="x")

    assert response.status_code == 400
    assert response["Content-Type"] == "application/json"
    assert set(response.json()["error"]["errors"]) == {"amount", "extra"}
    assert response.json()["error"]["type"] == "invalid_request_error"


def test_a_non_staff_custom_user_with_a_token_and_a_grant_creates_a_payment(token_client):
    response = create_payment(token_client)

    assert response.status_code == 201
    payment = Payment.objects.get(pk=response.json()["id"])
    assert payment.merchant_id == MERCHANT
    assert payment.events.get().caused_by == "api:ach-api@shop.example"


def test_other_merchants_answer_404_and_403_for_the_custom_user(token_client):
    assert create_payment(token_client, merchant_id="shop-us").status_code == 403
    assert token_client.get("/ach/api/merchants/shop-us/balance/").status_code == 404


def test_payment_submitted_settled_and_a_conflict_dead_lettered_in_the_host(
    sqs_queues, sandbox, token_client, ops_admin
):
    created = create_payment(token_client)
    assert created.status_code == 201
    payment_id = created.json()["id"]
    Order.objects.create(reference="SO-1001", payment_id=payment_id)

    # Submitted by the module's worker to the processor.
    run_worker(relay=True)
    payment = Payment.objects.get(pk=payment_id)
    assert payment.state == PaymentState.SUBMITTED

    # A signed callback under /ach/, signed with the old secret during a rotation.
    event_id = f"evt_{uuid.uuid4().hex}"
    assert post_callback(payment_id, event_id=event_id, amount="42.50").status_code == 202
    # The processor retries the same callback: accepted again, applied once.
    time.sleep(0.01)
    assert post_callback(payment_id, event_id=event_id, amount="42.50").status_code == 202
    run_worker()
    payment.refresh_from_db()
    assert payment.state == PaymentState.CONFIRMED
    assert LedgerEntry.objects.filter(payment=payment).count() == 1
    assert Order.objects.get(reference="SO-1001").paid is True

    # The same event id with another amount: a conflict for a human.
    assert post_callback(payment_id, event_id=event_id, amount="42.51").status_code == 202
    run_worker()
    conflict = QueueMessage.objects.get(status="dead_lettered")
    assert conflict.last_error_class.endswith("EventConflict")
    assert dead_letters_ingest() == 1
    dead_letter = DeadLetter.objects.get()
    assert str(dead_letter.payment_id) == payment_id

    # The host receiver's rows: one per transition, whatever was redelivered or refused.
    notices = PaymentNotice.objects.filter(payment_id=payment_id).order_by("id")
    assert [(n.from_state, n.to_state) for n in notices] == [
        ("pending", "submitted"),
        ("submitted", "confirmed"),
    ]

    # Visible in the host's admin, with its history, to the host's custom superuser.
    admin = Client()
    admin.force_login(ops_admin)
    listing = admin.get("/backoffice/triage/deadletter/")
    assert listing.status_code == 200
    assert "EventConflict" in listing.content.decode()
    page = admin.get(f"/backoffice/triage/deadletter/{dead_letter.pk}/change/")
    assert page.status_code == 200
    assert "different payload" in page.content.decode()
    history = admin.get(f"/backoffice/payments/payment/{payment_id}/change/")
    assert history.status_code == 200
    body = history.content.decode()
    assert event_id in body and "confirmed" in body


def test_the_hosts_celery_app_runs_the_modules_tasks_and_merges_its_schedule():
    from tests.host.celery import SHOP_SCHEDULE, app
    from triage.beat import beat_schedule

    app.loader.import_default_modules()

    module_schedule = beat_schedule()
    assert app.conf.beat_schedule == {**SHOP_SCHEDULE, **module_schedule}
    for entry in module_schedule.values():
        assert entry["task"] in app.tasks


def test_operations_endpoints_answer_under_the_hosts_prefix(sqs_queues):
    assert Client().get("/ach/healthz").status_code == 200
    assert Client().get("/ach/readyz").status_code == 200
    metrics = Client().get("/ach/metrics")
    assert metrics.status_code == 200 and b"payments_" in metrics.content


def test_the_hosts_logging_writes_through_the_modules_formatters_and_filter():
    """What the host's LOGGING names (tests/host/settings.py) is what the module documents: a
    JSON line per record on the root logger, and a Bad Request line with the account number in
    its path masked on django.request."""
    import io
    import logging

    from payments.kernel.logformat import JsonLineFormatter, SingleLineFormatter

    def handler(logger: str, formatter: type) -> logging.StreamHandler:
        (found,) = [h for h in logging.getLogger(logger).handlers if type(h.formatter) is formatter]
        return found

    json_handler = handler("", JsonLineFormatter)
    plain_handler = handler("django.request", SingleLineFormatter)
    streams = json_handler.setStream(io.StringIO()), plain_handler.setStream(io.StringIO())
    try:
        logging.getLogger("shop.orders").warning("order %s held", "o-1", extra={"payment_id": "p"})
        logging.getLogger("django.request").warning("Bad Request: %s", "/ach/api/758259572987/")
        written = json_handler.stream.getvalue(), plain_handler.stream.getvalue()
    finally:
        json_handler.setStream(streams[0])
        plain_handler.setStream(streams[1])

    record = json.loads(written[0])
    assert (record["message"], record["payment_id"]) == ("order o-1 held", "p")
    assert "Bad Request: /ach/api/****2987/" in written[1]
    assert "758259572987" not in written[1]
