"""Webhook endpoints pinned to an API version, as Stripe pins them: each endpoint receives an
event in its version's shape, over HTTP, signed over the bytes sent, under one ``webhook-id``
whatever the version; the version is set at creation (the body's, else the request's, else the
host's pin) and changed through the API, an unknown one refused 400 naming it; ``GET
/api/events/`` answers in the request's version, in the shape a delivery carries."""

import hashlib
from datetime import UTC, datetime
from decimal import Decimal

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from payments.api_versions import FIRST, V2026_12_01, VERSION_HEADER, VERSIONS
from payments.models import DoubleLoss, Payment, PaymentState
from payments.services import payment_apply_event
from payments.services.refunds import refund_create
from payments.webhooks.delivery import deliveries_run, event_body, events_dispatch
from payments.webhooks.models import Event, WebhookDelivery, WebhookEndpoint
from payments.webhooks.services import webhook_endpoint_create
from payments.webhooks.versions import OBJECT_CHANGES, event_shape, object_in_version
from sandbox.webhook_receiver import WebhookReceiver
from tests.factories import PaymentFactory, grant, processor_event
from tests.payments.webhook_support import endpoint_for, settle

pytestmark = pytest.mark.django_db

URL = "https://hooks.example.com/payments"
FIRST_KEYS = {"id", "type", "created_at", "merchant_id", "data"}
LATEST_KEYS = {"id", "object", "api_version", "type", "created_at", "merchant_id", "data"}
FIRST_ENDPOINT_OBJECT = {"id", "object", "url", "disabled_reason"}


@pytest.fixture
def receivers(loopback_webhooks):
    """One verifying receiver per version, so each endpoint's bodies are its own."""
    started = {version: WebhookReceiver().start() for version in VERSIONS}
    yield started
    for server in started.values():
        server.stop()


def endpoints_on_each_version(receivers, merchant_id: str = "m-hooks") -> dict:
    return {
        version: endpoint_for(server, merchant_id, api_version=version)
        for version, server in receivers.items()
    }


def endpoint_wanting(server: WebhookReceiver, event_types: list[str], **fields):
    endpoint = webhook_endpoint_create(
        merchant_id="m-hooks", url=server.url, event_types=event_types, **fields
    )
    server.secrets.append(endpoint.secret)
    return endpoint


def headers_of(server: WebhookReceiver, index: int = 0) -> dict:
    return {name.lower(): value for name, value in server.headers[index].items()}


def test_an_endpoint_on_each_version_receives_the_same_event_in_its_shape(receivers):
    endpoints_on_each_version(receivers)
    payment = settle()

    assert deliveries_run() == 4

    first, latest = receivers[FIRST], receivers[V2026_12_01]
    for server in receivers.values():
        assert server.refused == 0 and server.repeats == 0 and len(server.verified) == 2
    # The same events, under the same webhook-ids, each signed over the bytes it was sent.
    assert [b["id"] for b in first.verified] == [b["id"] for b in latest.verified]
    assert [headers_of(first, i)["webhook-id"] for i in range(2)] == [
        headers_of(latest, i)["webhook-id"] for i in range(2)
    ]
    for old, new in zip(first.verified, latest.verified, strict=True):
        assert set(old) == FIRST_KEYS
        assert set(new) == LATEST_KEYS
        assert (new["object"], new["api_version"]) == ("event", V2026_12_01)
        assert {k: v for k, v in new.items() if k in FIRST_KEYS} == old
        assert old["data"]["object"]["id"] == str(payment.id)
    assert headers_of(first)[VERSION_HEADER.lower()] == FIRST
    assert headers_of(latest)[VERSION_HEADER.lower()] == V2026_12_01


def test_an_endpoint_disabled_reaches_each_endpoint_in_its_versions_object(
    receivers, module_settings
):
    module_settings.WEBHOOK_DISABLE_AFTER_FAILURES = 1
    module_settings.WEBHOOK_DISABLE_AFTER_HOURS = 0
    failing = WebhookReceiver().start()
    try:
        failing.status = 500
        flaky = endpoint_for(failing, "m-hooks", api_version=V2026_12_01, description="flaky")
        endpoints_on_each_version(receivers)
        settle()
        deliveries_run()  # the flaky one fails once: disabled, and an event says so
        deliveries_run()  # that event, to the two endpoints still enabled
    finally:
        failing.stop()

    def disabled_event(server: WebhookReceiver) -> dict:
        (body,) = [b for b in server.verified if b["type"] == "webhook_endpoint.disabled"]
        return body

    old = disabled_event(receivers[FIRST])
    new = disabled_event(receivers[V2026_12_01])
    assert old["id"] == new["id"]
    assert set(old["data"]["object"]) == FIRST_ENDPOINT_OBJECT
    shown = new["data"]["object"]
    assert (shown["id"], shown["object"], shown["url"]) == (
        str(flaky.id),
        "webhook_endpoint",
        failing.url,
    )
    assert (shown["description"], shown["enabled"], shown["api_version"]) == (
        "flaky",
        False,
        V2026_12_01,
    )
    assert (
        shown["created_at"] and shown["disabled_reason"] == old["data"]["object"]["disabled_reason"]
    )
    assert "secret" not in shown


def test_a_double_loss_reaches_each_endpoint_with_its_versions_fields(receivers):
    endpoints_on_each_version(receivers)
    debit = PaymentFactory(state=PaymentState.CONFIRMED, merchant_id="m-hooks")
    refund = refund_create(payment_id=debit.id, amount=Decimal("45.00"))
    Payment.objects.filter(pk=refund.pk).update(state=PaymentState.SUBMITTED)
    payment_apply_event(event=processor_event(debit, "returned", reason_code="R10"))
    deliveries_run()

    def opened(server: WebhookReceiver) -> dict:
        (body,) = [b for b in server.verified if b["type"] == "double_loss.opened"]
        return body["data"]["object"]

    old, new = opened(receivers[FIRST]), opened(receivers[V2026_12_01])
    loss = DoubleLoss.objects.get()
    found = loss.detected_at.isoformat().replace("+00:00", "Z")
    assert (new["detected_at"], new["created_at"]) == (found, found)
    assert old == {k: v for k, v in new.items() if k not in {"detected_at", "created_at"}}
    assert (old["id"], old["refund_id"], old["amount"]) == (str(loss.id), str(refund.id), "45.00")


def test_a_version_changed_between_attempts_sends_its_shape_under_the_same_webhook_id(
    receiver, api_client, user, module_settings
):
    module_settings.WEBHOOK_RETRY_SCHEDULE = [0] * 3
    grant(user, "m-hooks")
    endpoint = endpoint_wanting(receiver, ["payment.submitted"], api_version=FIRST)
    receiver.status = 500
    settle()
    deliveries_run()
    changed = api_client.patch(
        f"/api/webhook_endpoints/{endpoint.id}/", {"api_version": V2026_12_01}, format="json"
    )
    receiver.status = 200
    deliveries_run()

    assert changed.status_code == 200 and changed.json()["api_version"] == V2026_12_01
    event = Event.objects.get(type="payment.submitted")
    first_try, second_try = receiver.receipts
    assert first_try["webhook_id"] == second_try["webhook_id"] == event.id
    # Each attempt verified against the bytes it carried, rendered in the version of its time.
    assert first_try["sha256"] == hashlib.sha256(event_body(event, version=FIRST)).hexdigest()
    assert (
        second_try["sha256"] == hashlib.sha256(event_body(event, version=V2026_12_01)).hexdigest()
    )
    assert [headers_of(receiver, i)[VERSION_HEADER.lower()] for i in range(2)] == [
        FIRST,
        V2026_12_01,
    ]
    assert WebhookDelivery.objects.get().status == "succeeded"


def test_a_thin_endpoint_gets_the_id_and_kind_in_every_version(receivers):
    for version, server in receivers.items():
        endpoint_for(server, api_version=version, thin=True)
    settle()
    deliveries_run()

    for server in receivers.values():
        assert [set(b["data"]["object"]) for b in server.verified] == [{"id", "object"}] * 2


# Creation and change through the API.


def create(api_client, headers=None, **body):
    return api_client.post(
        "/api/webhook_endpoints/",
        {"merchant_id": "acme", "url": URL, **body},
        format="json",
        headers=headers or {},
    )


def test_a_new_endpoint_takes_the_requests_version(api_client, user):
    grant(user, "acme")
    created = create(api_client, {VERSION_HEADER: V2026_12_01})

    assert created.status_code == 201 and created.json()["api_version"] == V2026_12_01
    assert WebhookEndpoint.objects.get().api_version == V2026_12_01


def test_a_new_endpoint_without_a_version_takes_the_hosts_pin(api_client, user, module_settings):
    grant(user, "acme")
    module_settings.API_VERSION = V2026_12_01
    pinned = create(api_client)
    module_settings.API_VERSION = FIRST
    default = create(api_client)

    assert [pinned.json()["api_version"], default.json()["api_version"]] == [V2026_12_01, FIRST]


def test_a_service_made_endpoint_without_a_version_takes_the_hosts_pin(module_settings):
    module_settings.API_VERSION = V2026_12_01
    endpoint = webhook_endpoint_create(merchant_id="acme", url=URL, event_types=[])
    assert endpoint.api_version == V2026_12_01


def test_the_bodys_version_wins_over_the_requests(api_client, user):
    grant(user, "acme")
    created = create(api_client, {VERSION_HEADER: V2026_12_01}, api_version=FIRST)

    assert created.status_code == 201 and created.json()["api_version"] == FIRST


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("2026-13-01", "'2026-13-01' is not a version of this API"),
        ("", "a value of 0 characters is not a version"),
        ("latest", "'latest' is not a version"),
        ("2026-11-01 ", "a value of 11 characters is not a version"),
        ("x" * 5000, "a value of 5000 characters is not a version"),
        ("021000021", "a value of 9 characters is not a version"),
    ],
)
def test_an_unknown_version_is_refused_400_naming_it(api_client, user, value, shown):
    grant(user, "acme")
    refused = create(api_client, api_version=value)

    assert refused.status_code == 400
    error = refused.json()["error"]
    assert (error["code"], error["param"]) == ("api_version_invalid", "api_version")
    assert shown in error["message"] and shown in error["errors"]["api_version"][0]
    assert ", ".join(VERSIONS) in error["message"]
    assert not WebhookEndpoint.objects.exists()


def test_a_version_that_is_not_text_is_refused_naming_api_version(api_client, user):
    grant(user, "acme")
    for value in (20261201, None, ["2026-12-01"], {"v": 1}, "2026-11-01\x00"):
        refused = create(api_client, api_version=value)
        assert refused.status_code == 400, value
        assert refused.json()["error"]["param"] == "api_version"
        assert "\x00" not in refused.content.decode() and "\\u0000" not in refused.content.decode()
    assert not WebhookEndpoint.objects.exists()


def test_an_unknown_version_in_a_change_is_refused_and_changes_nothing(api_client, user):
    grant(user, "acme")
    endpoint = webhook_endpoint_create(
        merchant_id="acme", url=URL, event_types=[], api_version=FIRST
    )
    refused = api_client.patch(
        f"/api/webhook_endpoints/{endpoint.id}/",
        {"api_version": "2027-01-01", "description": "new"},
        format="json",
    )

    assert refused.status_code == 400
    error = refused.json()["error"]
    assert (error["code"], error["param"]) == ("api_version_invalid", "api_version")
    assert "'2027-01-01' is not a version of this API" in error["message"]
    endpoint.refresh_from_db()
    assert (endpoint.api_version, endpoint.description) == (FIRST, "")


def test_a_change_of_version_is_read_back_in_every_answer(api_client, user):
    grant(user, "acme")
    endpoint = webhook_endpoint_create(
        merchant_id="acme", url=URL, event_types=[], api_version=FIRST
    )
    changed = api_client.patch(
        f"/api/webhook_endpoints/{endpoint.id}/", {"api_version": V2026_12_01}, format="json"
    )
    read = api_client.get(f"/api/webhook_endpoints/{endpoint.id}/")
    listed = api_client.get("/api/webhook_endpoints/?merchant=acme")

    assert changed.status_code == 200
    assert changed.json()["api_version"] == read.json()["api_version"] == V2026_12_01
    assert listed.json()["data"][0]["api_version"] == V2026_12_01


def test_the_service_refuses_an_unknown_version():
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError) as refused:
        webhook_endpoint_create(merchant_id="acme", url=URL, event_types=[], api_version="v2")
    assert "'v2' is not a version of this API" in refused.value.message_dict["api_version"][0]


# The events list in the request's version.


def listed_events(api_client, version: str) -> list[dict]:
    answer = api_client.get("/api/events/?merchant=m-hooks", headers={VERSION_HEADER: version})
    assert answer.status_code == 200 and answer[VERSION_HEADER] == version
    page = answer.json()
    return page["results"] if version >= V2026_12_01 else page["data"]


def test_the_events_list_answers_in_the_requests_version(api_client, user, loopback_webhooks):
    grant(user, "m-hooks")
    loopback_webhooks.WEBHOOK_DISABLE_AFTER_FAILURES = 1
    loopback_webhooks.WEBHOOK_DISABLE_AFTER_HOURS = 0
    failing = WebhookReceiver().start()
    try:
        failing.status = 500
        endpoint_wanting(failing, ["payment.submitted"])
        settle()
        deliveries_run()
    finally:
        failing.stop()
    events_dispatch()

    old = listed_events(api_client, FIRST)
    new = listed_events(api_client, V2026_12_01)

    assert (
        [e["type"] for e in old]
        == [e["type"] for e in new]
        == [
            "payment.submitted",
            "payment.confirmed",
            "webhook_endpoint.disabled",
        ]
    )
    assert all(set(e) == FIRST_KEYS | {"object"} for e in old)
    assert all(set(e) == LATEST_KEYS and e["api_version"] == V2026_12_01 for e in new)
    assert set(old[2]["data"]["object"]) == FIRST_ENDPOINT_OBJECT
    assert {"created_at", "enabled", "api_version", "event_types"} <= set(new[2]["data"]["object"])
    assert old[0]["data"] == new[0]["data"]  # a payment is one shape in both


def test_a_listed_event_is_the_body_a_delivery_carries_from_2026_12_01(receiver, api_client, user):
    grant(user, "m-hooks")
    endpoint_for(receiver, api_version=V2026_12_01)
    settle()
    deliveries_run()

    assert listed_events(api_client, V2026_12_01) == receiver.verified
    assert len(receiver.verified) == 2


# Rendering, without I/O.


def stored_event(obj: dict, **data) -> Event:
    return Event(
        id="evt_1",
        type="double_loss.opened",
        merchant_id="m",
        object_id=obj["id"],
        data={"object": obj, **data},
        created_at=datetime(2026, 12, 4, 12, 0, tzinfo=UTC),
    )


LOSS = {
    "id": "7",
    "object": "double_loss",
    "payment_id": "p",
    "refund_id": "r",
    "amount": "45.00",
    "currency": "USD",
    "status": "open",
    "detected_at": "2026-12-04T12:00:00Z",
    "created_at": "2026-12-04T12:00:00Z",
}


@pytest.mark.parametrize(
    ("kind", "gone"),
    [
        ("double_loss", {"detected_at", "created_at"}),
        ("notification_of_change", {"created_at"}),
        ("return_dishonor", {"created_at"}),
        ("payment", set()),
        ("refund", set()),
        ("payout", set()),
        ("account_validation", set()),
    ],
)
def test_the_first_version_undoes_what_2026_12_01_added_to_each_kind(kind, gone):
    latest = {**LOSS, "object": kind}

    assert object_in_version(latest, V2026_12_01) == latest
    assert set(object_in_version(latest, FIRST)) == set(latest) - gone


def test_the_first_version_shows_an_endpoint_in_its_four_fields():
    endpoint = {
        "id": "e",
        "object": "webhook_endpoint",
        "merchant_id": "m",
        "url": "https://hooks.example.com/",
        "description": "",
        "event_types": [],
        "thin": False,
        "ordered": False,
        "api_version": V2026_12_01,
        "enabled": False,
        "disabled_at": "2026-12-04T12:00:00Z",
        "disabled_reason": "3 failed attempts",
        "created_at": "2026-12-04T11:00:00Z",
    }
    assert object_in_version(endpoint, FIRST) == {
        "id": "e",
        "object": "webhook_endpoint",
        "url": "https://hooks.example.com/",
        "disabled_reason": "3 failed attempts",
    }


def test_an_events_other_data_is_kept_and_its_stored_object_untouched():
    event = stored_event(dict(LOSS), review_reason="velocity")
    old = event_shape(event, FIRST)

    assert old["data"]["review_reason"] == "velocity"
    assert event.data["object"] == LOSS  # rendering never changes what is stored
    assert old == {
        "id": "evt_1",
        "type": "double_loss.opened",
        "created_at": "2026-12-04T12:00:00Z",
        "merchant_id": "m",
        "data": {
            "object": {k: v for k, v in LOSS.items() if k not in {"detected_at", "created_at"}},
            "review_reason": "velocity",
        },
    }
    assert event_shape(event, FIRST, listed=True) == {**old, "object": "event"}


def test_rendering_in_a_version_the_api_does_not_have_fails_loudly():
    with pytest.raises(ValueError, match="'2027-01-01' is not a version"):
        event_shape(stored_event(dict(LOSS)), "2027-01-01")


def test_every_version_change_is_of_a_version_the_api_has():
    assert set(OBJECT_CHANGES) <= set(VERSIONS) - {FIRST}


# The migration.

BEFORE = [("payments", "0040_merge_account_validation_fraud_rules")]
AFTER = [("payments", "0041_webhook_endpoint_api_version")]


def _migrate(targets):
    executor = MigrationExecutor(connection)
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


@pytest.mark.django_db(transaction=True)
def test_the_migration_pins_the_endpoints_made_before_to_the_hosts_version(module_settings):
    module_settings.API_VERSION = V2026_12_01
    try:
        apps = _migrate(BEFORE)
        made = apps.get_model("payments", "WebhookEndpoint").objects.create(
            merchant_id="acme", url=URL, event_types=[], secret="whsec_x"
        )
        _migrate(AFTER)
    finally:
        _migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())

    assert WebhookEndpoint.objects.get(id=made.id).api_version == V2026_12_01
