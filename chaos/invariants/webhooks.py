"""The webhooks' invariants: every event reached every endpoint that wants it, at least once,
and every request of one event carried that event's id as ``webhook-id``, with the same body.

``receipts`` are what a receiver recorded of each request whose signature it verified
(``sandbox.webhook_receiver.WebhookReceiver.receipts``): the request's path (one per endpoint),
its ``webhook-id``, the body's ``id`` and ``type``, the body's SHA-256, and the status it was
answered. Without them the checks read the database alone."""

from collections import defaultdict

from chaos.invariants.report import Report


def check_webhooks_delivered(report: Report, receipts: list | None) -> None:
    """``webhooks_delivered_at_least_once``: every numbered event has a delivery to each enabled
    endpoint of its merchant that wants it and existed when it was written; none of them spent
    its retries; each one marked delivered has a 2xx attempt and, with ``receipts``, reached
    the receiver. Deliveries still pending and events not yet numbered are notes."""
    from django.db.models import Exists, OuterRef

    from payments.webhooks.models import (
        DeliveryStatus,
        Event,
        WebhookAttempt,
        WebhookDelivery,
        WebhookEndpoint,
    )

    check = "webhooks_delivered_at_least_once"
    endpoints = list(WebhookEndpoint.objects.filter(enabled=True))
    deliveries = list(
        WebhookDelivery.objects.filter(endpoint__enabled=True).values_list(
            "event_id", "endpoint_id", "status"
        )
    )
    delivered_to = defaultdict(set)
    for event_id, endpoint_id, _ in deliveries:
        delivered_to[event_id].add(endpoint_id)
    events = list(
        Event.objects.filter(position__isnull=False).values_list(
            "id", "type", "merchant_id", "created_at"
        )
    )
    missing = [
        f"{event_id} -> {endpoint.id}"
        for event_id, event_type, merchant_id, created_at in events
        for endpoint in endpoints
        if endpoint.merchant_id == merchant_id
        and endpoint.wants(event_type)
        and endpoint.created_at <= created_at
        and endpoint.id not in delivered_to[event_id]
    ]
    if missing:
        report.add(
            check, f"{len(missing)} event(s) never given to an endpoint wanting them", missing
        )
    failed = sorted(f"{e} -> {p}" for e, p, s in deliveries if s == DeliveryStatus.FAILED)
    if failed:
        report.add(check, f"{len(failed)} delivery(ies) spent their retries undelivered", failed)
    answered = WebhookAttempt.objects.filter(
        delivery=OuterRef("pk"), status_code__gte=200, status_code__lt=300
    )
    succeeded = WebhookDelivery.objects.filter(status=DeliveryStatus.SUCCEEDED)
    unproven = sorted(succeeded.exclude(Exists(answered)).values_list("event_id", flat=True))
    if unproven:
        report.add(check, f"{len(unproven)} delivery(ies) marked delivered without a 2xx", unproven)
    if receipts is not None:
        received = {r["webhook_id"] for r in receipts if 200 <= r["status"] < 300}
        unseen = sorted(set(succeeded.values_list("event_id", flat=True)) - received)
        if unseen:
            report.add(
                check, f"{len(unseen)} event(s) delivered the receiver never verified", unseen
            )
    pending = sum(1 for _, _, status in deliveries if status == DeliveryStatus.PENDING)
    if pending:
        report.notes.append(f"{pending} webhook delivery(ies) still pending")
    unnumbered = Event.objects.filter(position__isnull=True).count()
    if unnumbered:
        report.notes.append(f"{unnumbered} event(s) not yet dispatched")
    report.checked[check] = {
        "events": len(events),
        "deliveries": len(deliveries),
        "receipts": "not given" if receipts is None else len(receipts),
    }


def check_webhook_ids(report: Report, receipts: list | None) -> None:
    """``webhook_ids_stable``: each request's ``webhook-id`` is the id of the event its body
    carries, an event of that type in the database; every request of one id to one endpoint
    carried the same body (a repeat is the same event, re-signed, never a new id or content).
    Without ``receipts``, only that an event has at most one delivery per endpoint."""
    from django.db.models import Count

    from payments.webhooks.models import Event, WebhookDelivery

    check = "webhook_ids_stable"
    twice = sorted(
        f"{row['event_id']} -> {row['endpoint_id']}"
        for row in WebhookDelivery.objects.values("event_id", "endpoint_id")
        .annotate(n=Count("id"))
        .filter(n__gt=1)
    )
    if twice:
        report.add(check, f"{len(twice)} event(s) with two deliveries to one endpoint", twice)
    if receipts is None:
        report.checked[check] = {"receipts": "not given"}
        return
    ids = {receipt["webhook_id"] for receipt in receipts}
    types = dict(Event.objects.filter(id__in=ids).values_list("id", "type"))
    foreign = sorted(
        {
            r["webhook_id"]
            for r in receipts
            if r["id"] != r["webhook_id"] or types.get(r["webhook_id"]) != r["type"]
        }
    )
    if foreign:
        report.add(
            check,
            f"{len(foreign)} webhook-id(s) not the id of the event of that type their body carries",
            foreign,
        )
    bodies = defaultdict(set)
    for receipt in receipts:
        bodies[(receipt["path"], receipt["webhook_id"])].add(receipt["sha256"])
    changed = sorted(webhook_id for (_, webhook_id), digests in bodies.items() if len(digests) > 1)
    if changed:
        report.add(check, f"{len(changed)} webhook-id(s) repeated with another body", changed)
    report.checked[check] = {
        "requests": len(receipts),
        "webhook-ids": len(ids),
        "repeats": len(receipts) - len(bodies),
    }
