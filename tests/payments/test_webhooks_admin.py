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
        {"merchant_id": "acme", "url": URL, "event_types": '["payout.failed"]', **INLINE},
        follow=True,
    )
    endpoint = WebhookEndpoint.objects.get()
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
