"""Per endpoint: thin events (the object's id and kind only, signed as any other), and delivery
in order per payment (a later event about a payment waits for the earlier one's delivery)."""

import pytest

from payments.webhooks.delivery import deliveries_claim, deliveries_run, events_dispatch
from payments.webhooks.models import DeliveryStatus, WebhookDelivery, WebhookEndpoint
from sandbox.webhook_receiver import WebhookReceiver
from tests.factories import grant
from tests.payments.webhook_support import endpoint_for, settle

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_thin_endpoint_gets_the_object_s_id_and_kind_only_signed(receiver):
    endpoint_for(receiver, thin=True)
    payment = settle()
    deliveries_run()

    assert receiver.refused == 0 and len(receiver.verified) == 2
    for body in receiver.verified:
        assert body["data"] == {"object": {"id": str(payment.id), "object": "payment"}}
    assert [body["type"] for body in receiver.verified] == [
        "payment.submitted",
        "payment.confirmed",
    ]


def test_a_full_and_a_thin_endpoint_of_one_merchant_each_get_their_shape(receiver):
    thin = WebhookReceiver().start()
    try:
        endpoint_for(receiver)
        endpoint_for(thin, thin=True)
        settle()
        deliveries_run()
    finally:
        thin.stop()
    assert receiver.verified[0]["id"] == thin.verified[0]["id"]  # one event, one webhook-id
    assert "amount" in receiver.verified[0]["data"]["object"]
    assert "amount" not in thin.verified[0]["data"]["object"]


def _sent_types(receiver) -> list[str]:
    return [body["type"] for body in receiver.verified]


def test_an_ordered_endpoint_gets_a_payment_s_events_in_order_through_a_retry(
    receiver, module_settings
):
    module_settings.WEBHOOK_RETRY_SCHEDULE = [0, 0, 0]
    endpoint_for(receiver, ordered=True)
    settle()
    receiver.fail_first = 1  # the first event's first attempt fails

    assert deliveries_run() == 1  # the later event waits for the earlier one
    assert deliveries_run() == 1  # the retry: delivered
    assert deliveries_run() == 1  # now the later one
    assert _sent_types(receiver) == ["payment.submitted", "payment.confirmed"]


def test_an_unordered_endpoint_gets_the_later_event_while_the_earlier_waits_to_retry(
    receiver, module_settings
):
    module_settings.WEBHOOK_RETRY_SCHEDULE = [0, 0, 0]
    endpoint_for(receiver)
    settle()
    receiver.fail_first = 1

    deliveries_run()
    deliveries_run()
    assert _sent_types(receiver) == ["payment.confirmed", "payment.submitted"]


def test_ordering_holds_per_payment_not_across_payments(receiver, module_settings):
    module_settings.WEBHOOK_RETRY_SCHEDULE = [0, 0, 0]
    endpoint_for(receiver, ordered=True)
    first, second = settle(), settle()
    events_dispatch()

    claimed = WebhookDelivery.objects.filter(id__in=deliveries_claim())
    # The first event of each payment; the confirmations wait for them.
    assert sorted(d.event.object_id for d in claimed) == sorted([str(first.id), str(second.id)])
    assert {d.event.type for d in claimed} == {"payment.submitted"}


def test_a_later_event_goes_once_the_earlier_delivery_has_failed_for_good(
    receiver, module_settings
):
    module_settings.WEBHOOK_RETRY_SCHEDULE = [0]
    endpoint_for(receiver, ordered=True)
    settle()
    receiver.status = 500
    deliveries_run()
    deliveries_run()
    submitted, confirmed = WebhookDelivery.objects.order_by("event__position")
    assert (submitted.status, submitted.attempts) == (DeliveryStatus.FAILED, 2)
    assert confirmed.attempts == 0  # it waited while the earlier one had retries left

    receiver.status = 200
    deliveries_run()
    confirmed.refresh_from_db()
    assert confirmed.status == DeliveryStatus.SUCCEEDED


def test_the_api_sets_thin_and_ordered_and_refuses_anything_but_a_boolean(api_client, user):
    grant(user, "acme")
    body = {"merchant_id": "acme", "url": "https://hooks.example.com/x", "thin": True}
    created = api_client.post("/api/webhook_endpoints/", body, format="json")
    assert created.status_code == 201, created.content
    assert (created.json()["thin"], created.json()["ordered"]) == (True, False)

    path = f"/api/webhook_endpoints/{created.json()['id']}/"
    changed = api_client.patch(path, {"ordered": True}, format="json")
    assert (changed.json()["thin"], changed.json()["ordered"]) == (True, True)

    for value in ["yes", 1, None, "true"]:
        refused = api_client.patch(path, {"thin": value}, format="json")
        assert refused.status_code == 400, (value, refused.content)
        assert "thin" in refused.json()["error"]["errors"]
    refused = api_client.post("/api/webhook_endpoints/", {**body, "ordered": "1"}, format="json")
    assert refused.status_code == 400 and "ordered" in refused.json()["error"]["errors"]
    endpoint = WebhookEndpoint.objects.get()
    assert (endpoint.thin, endpoint.ordered) == (True, True)
