"""The webhooks admin: the secret shown once, replay with a required note and an audit row."""

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME

from payments.webhooks.delivery import events_dispatch
from payments.webhooks.models import (
    DeliveryStatus,
    WebhookAction,
    WebhookDelivery,
    WebhookEndpoint,
)
from payments.webhooks.services import webhook_endpoint_create
from tests.payments.webhook_support import settle

pytestmark = pytest.mark.django_db

URL = "https://hooks.example.com/payments"
# The (empty) audit inline's management form.
INLINE = {"actions-TOTAL_FORMS": "0", "actions-INITIAL_FORMS": "0"}


def failed_deliveries() -> list[WebhookDelivery]:
    webhook_endpoint_create(merchant_id="m-hooks", url=URL, event_types=[])
    settle()
    events_dispatch()
    WebhookDelivery.objects.update(status=DeliveryStatus.FAILED, attempts=12)
    return list(WebhookDelivery.objects.all())


def test_an_endpoint_added_in_the_admin_shows_its_secret_once(admin_client):
    added = admin_client.post(
        "/admin/payments/webhookendpoint/add/",
        {
            "merchant_id": "acme",
            "url": URL,
            "event_types": '["payout.failed"]',
            "api_version": "2026-12-01",
            **INLINE,
        },
        follow=True,
    )
    endpoint = WebhookEndpoint.objects.get()
    assert endpoint.api_version == "2026-12-01"
    assert endpoint.secret.startswith("whsec_")
    assert endpoint.secret in added.content.decode()
    change = admin_client.get(f"/admin/payments/webhookendpoint/{endpoint.pk}/change/")
    assert change.status_code == 200 and endpoint.secret not in change.content.decode()


def test_the_admin_refuses_a_private_url_and_an_unknown_event_type(admin_client):
    response = admin_client.post(
        "/admin/payments/webhookendpoint/add/",
        {"merchant_id": "acme", "url": "https://10.0.0.1/", "event_types": '["nope"]', **INLINE},
    )
    assert response.status_code == 200  # the form again, with its errors
    body = response.content.decode()
    assert "private, loopback or link-local" in body and "unknown event types: nope" in body
    assert not WebhookEndpoint.objects.exists()


def test_the_admin_offers_the_hosts_pin_and_refuses_an_unknown_version(
    admin_client, module_settings
):
    module_settings.API_VERSION = "2026-12-01"
    form = admin_client.get("/admin/payments/webhookendpoint/add/").content.decode()
    response = admin_client.post(
        "/admin/payments/webhookendpoint/add/",
        {"merchant_id": "acme", "url": URL, "event_types": "[]", "api_version": "2027-01-01"},
    )

    assert '<option value="2026-12-01" selected>' in form
    assert response.status_code == 200  # the form again, with its error
    assert "2027-01-01 is not one of the available choices" in response.content.decode()
    assert not WebhookEndpoint.objects.exists()


def test_replay_asks_for_a_note_then_sends_again_with_an_audit_row(admin_client):
    deliveries = failed_deliveries()
    selected = {"action": "replay", ACTION_CHECKBOX_NAME: [d.pk for d in deliveries]}

    confirm = admin_client.post("/admin/payments/webhookdelivery/", selected)
    without_note = admin_client.post(
        "/admin/payments/webhookdelivery/", {**selected, "apply": "1", "note": "  "}
    )
    assert confirm.status_code == 200 and b"Note (required)" in confirm.content
    assert without_note.status_code == 200
    assert not WebhookDelivery.objects.filter(status=DeliveryStatus.PENDING).exists()

    done = admin_client.post(
        "/admin/payments/webhookdelivery/",
        {**selected, "apply": "1", "note": "receiver fixed, ticket 42"},
    )
    assert done.status_code == 302
    assert set(WebhookDelivery.objects.values_list("status", "attempts")) == {
        (DeliveryStatus.PENDING, 0)
    }
    action = WebhookAction.objects.get(kind="replay")
    assert (action.deliveries, action.note) == (2, "receiver fixed, ticket 42")
    assert action.actor_label == "admin"


def test_delivery_history_is_read_only(admin_client):
    [delivery, _] = failed_deliveries()
    page = admin_client.get(f"/admin/payments/webhookdelivery/{delivery.pk}/change/")
    assert page.status_code == 200 and b'name="status"' not in page.content
    assert (
        admin_client.post(f"/admin/payments/webhookdelivery/{delivery.pk}/delete/").status_code
        == 403
    )


def _failed_at(delivery: WebhookDelivery, when) -> None:
    WebhookDelivery.objects.filter(pk=delivery.pk).update(created_at=when)


def test_replay_of_the_failed_since_a_time_takes_only_those_with_a_note(admin_client):
    from datetime import UTC, datetime

    old, recent = failed_deliveries()
    _failed_at(old, datetime(2026, 11, 1, 9, 0, tzinfo=UTC))
    _failed_at(recent, datetime(2026, 11, 3, 9, 0, tzinfo=UTC))
    endpoint = WebhookEndpoint.objects.get()
    selected = {"action": "replay_failed_since", ACTION_CHECKBOX_NAME: [endpoint.pk]}
    url = "/admin/payments/webhookendpoint/"

    confirm = admin_client.post(url, selected)
    without_note = admin_client.post(
        url, {**selected, "apply": "1", "since": "2026-11-02 00:00", "note": " "}
    )
    bad_time = admin_client.post(url, {**selected, "apply": "1", "since": "soon", "note": "x"})
    assert confirm.status_code == 200 and b"Note (required)" in confirm.content
    assert without_note.status_code == 200 and bad_time.status_code == 200
    assert b"Enter a valid date/time" in bad_time.content
    assert not WebhookDelivery.objects.filter(status=DeliveryStatus.PENDING).exists()

    done = admin_client.post(
        url, {**selected, "apply": "1", "since": "2026-11-02 00:00", "note": "receiver back"}
    )

    assert done.status_code == 302
    statuses = dict(WebhookDelivery.objects.values_list("pk", "status"))
    assert statuses == {old.pk: DeliveryStatus.FAILED, recent.pk: DeliveryStatus.PENDING}
    action = WebhookAction.objects.get(kind="replay")
    assert action.deliveries == 1 and action.endpoint_ref == str(endpoint.pk)
    assert action.note == "failed since 2026-11-02T00:00:00+00:00: receiver back"


def test_an_operator_enables_a_disabled_endpoint_and_what_it_missed_is_due(admin_client):
    from django.db import transaction
    from django.utils import timezone

    from payments.webhooks.delivery import endpoint_disable

    endpoint = webhook_endpoint_create(merchant_id="m-hooks", url=URL, event_types=[])
    with transaction.atomic():
        endpoint_disable(endpoint=endpoint, reason="failing", now=timezone.now())
    settle()
    events_dispatch()

    done = admin_client.post(
        "/admin/payments/webhookendpoint/",
        {"action": "enable_endpoints", ACTION_CHECKBOX_NAME: [endpoint.pk]},
    )

    assert done.status_code == 302
    endpoint.refresh_from_db()
    assert endpoint.enabled
    assert WebhookDelivery.objects.filter(endpoint=endpoint, status="pending").count() == 3
    assert WebhookAction.objects.get(kind="enable").actor_label == "admin"


def test_deleting_an_endpoint_in_the_admin_leaves_an_audit_row(admin_client):
    endpoint = webhook_endpoint_create(merchant_id="acme", url=URL, event_types=[])

    done = admin_client.post(
        f"/admin/payments/webhookendpoint/{endpoint.pk}/delete/", {"post": "yes"}
    )

    assert done.status_code == 302 and not WebhookEndpoint.objects.exists()
    action = WebhookAction.objects.get(kind="delete")
    assert (action.endpoint_ref, action.merchant_id, action.actor_label) == (
        str(endpoint.pk),
        "acme",
        "admin",
    )
