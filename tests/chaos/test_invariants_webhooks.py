"""The webhook invariants on a clean run (events delivered to a verifying receiver) and one
corruption per branch: each must fail the check that names it, with that branch's finding."""

import pytest
from django.db import connection
from django.utils import timezone

from chaos.invariants.report import Report
from chaos.invariants.webhooks import check_webhook_ids, check_webhooks_delivered
from payments.webhooks.delivery import deliveries_run
from payments.webhooks.models import DeliveryStatus, Event, WebhookAttempt, WebhookDelivery
from tests.payments.webhook_support import (  # noqa: F401 - fixtures
    endpoint_for,
    loopback_webhooks,
    receiver,
    settle,
)

pytestmark = pytest.mark.django_db

DELIVERED = "webhooks_delivered_at_least_once"
STABLE = "webhook_ids_stable"


@pytest.fixture
def delivered(receiver, module_settings):  # noqa: F811 - the imported fixture
    """Two endpoints (one thin) of one merchant, two payments' events delivered to both; one
    request repeated, as a receiver sees after a sender died mid-request."""
    module_settings.WEBHOOK_RETRY_SCHEDULE = [0]
    endpoint_for(receiver)
    endpoint_for(receiver, url=receiver.url + "/thin", thin=True)
    settle(), settle()
    deliveries_run()
    repeat = WebhookDelivery.objects.order_by("id").first()
    WebhookDelivery.objects.filter(pk=repeat.pk).update(
        status=DeliveryStatus.PENDING, next_attempt_at=timezone.now()
    )
    deliveries_run()
    assert WebhookDelivery.objects.filter(status=DeliveryStatus.SUCCEEDED).count() == 8
    assert len(receiver.receipts) == 9  # 4 events to 2 endpoints, and the one repeat
    return receiver


def run(receipts) -> Report:
    report = Report()
    check_webhooks_delivered(report, receipts)
    check_webhook_ids(report, receipts)
    return report


def only(report: Report, check: str, finding: str) -> tuple[str, ...]:
    assert {v.check for v in report.violations} == {check}, report.render()
    [violation] = report.violations
    assert finding in violation.detail, violation.detail
    return violation.ids


def test_a_clean_run_passes_with_and_without_the_receipts(delivered):
    with_receipts = run(delivered.receipts)
    assert with_receipts.ok, with_receipts.render()
    assert with_receipts.checked[STABLE] == {"requests": 9, "webhook-ids": 4, "repeats": 1}
    assert with_receipts.checked[DELIVERED]["deliveries"] == 8
    assert run(None).ok


def test_an_event_never_given_to_an_endpoint_wanting_it_fails(delivered):
    lost = WebhookDelivery.objects.order_by("id").last()
    lost.delete()
    ids = only(run(None), DELIVERED, "never given to an endpoint")
    assert ids == (f"{lost.event_id} -> {lost.endpoint_id}",)


def test_a_delivery_that_spent_its_retries_fails(delivered):
    WebhookDelivery.objects.filter(pk=WebhookDelivery.objects.first().pk).update(
        status=DeliveryStatus.FAILED
    )
    only(run(delivered.receipts), DELIVERED, "spent their retries")


def test_a_delivery_marked_delivered_without_a_2xx_fails(delivered):
    delivery = WebhookDelivery.objects.order_by("id").last()
    WebhookAttempt.objects.filter(delivery=delivery).update(status_code=500)
    assert only(run(None), DELIVERED, "without a 2xx") == (delivery.event_id,)


def test_an_event_marked_delivered_the_receiver_never_verified_fails(delivered):
    gone = delivered.receipts[-1]["webhook_id"]
    receipts = [r for r in delivered.receipts if r["webhook_id"] != gone]
    assert only(run(receipts), DELIVERED, "never verified") == (gone,)


def test_a_pending_delivery_and_an_undispatched_event_are_notes_not_violations(delivered):
    WebhookDelivery.objects.filter(pk=WebhookDelivery.objects.first().pk).update(
        status=DeliveryStatus.PENDING
    )
    settle()
    report = run(delivered.receipts)
    assert report.ok
    assert "1 webhook delivery(ies) still pending" in report.notes
    assert "2 event(s) not yet dispatched" in report.notes


def test_a_webhook_id_that_is_not_its_body_s_event_fails(delivered):
    receipts = [dict(r) for r in delivered.receipts]
    receipts[0]["webhook_id"] = "evt_made_up"
    report = Report()
    check_webhook_ids(report, receipts)
    assert only(report, STABLE, "not the id of the event") == ("evt_made_up",)


def test_a_webhook_id_of_an_event_of_another_type_fails(delivered):
    receipts = [dict(r) for r in delivered.receipts]
    Event.objects.filter(id=receipts[0]["webhook_id"]).update(type="payment.failed")
    report = Report()
    check_webhook_ids(report, receipts)
    assert only(report, STABLE, "not the id of the event") == (receipts[0]["webhook_id"],)


def test_a_repeat_with_another_body_fails(delivered):
    receipts = [dict(r) for r in delivered.receipts]
    receipts.append({**receipts[0], "sha256": "0" * 64})
    report = Report()
    check_webhook_ids(report, receipts)
    assert only(report, STABLE, "repeated with another body") == (receipts[0]["webhook_id"],)


def test_two_deliveries_of_one_event_to_one_endpoint_fail(delivered):
    with connection.cursor() as cursor:  # the constraint that forbids it, gone in this test
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cursor.execute("ALTER TABLE payments_webhookdelivery DROP CONSTRAINT webhook_delivery_once")
    first = WebhookDelivery.objects.order_by("id").first()
    WebhookDelivery.objects.create(endpoint=first.endpoint, event=first.event)
    report = Report()
    check_webhook_ids(report, None)
    assert only(report, STABLE, "two deliveries to one endpoint") == (
        f"{first.event_id} -> {first.endpoint_id}",
    )
