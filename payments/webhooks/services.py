"""A merchant's webhook endpoints: made, changed, rotated, enabled again, deleted; and
deliveries replayed by an operator. Each write, and its audit row, in one transaction."""

from datetime import datetime

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Max, Q
from django.utils import timezone

from payments import conf
from payments.api_versions import VERSIONS, version_refusal
from payments.webhooks.addresses import url_problem
from payments.webhooks.catalogue import EVENT_TYPES
from payments.webhooks.models import (
    DeliveryStatus,
    Event,
    WebhookAction,
    WebhookActionKind,
    WebhookDelivery,
    WebhookEndpoint,
)
from payments.webhooks.signing import secret_new


def endpoint_fields_checked(
    *, url: str | None = None, event_types: list | None = None, api_version: str | None = None
) -> None:
    """Raise ``ValidationError`` naming each field that cannot be stored."""
    errors: dict[str, list[str]] = {}
    if api_version is not None and api_version not in VERSIONS:
        errors["api_version"] = [version_refusal(str(api_version))]
    if url is not None:
        problem = url_problem(url)
        if problem is not None:
            errors["url"] = [problem]
    if event_types is not None:
        unknown = sorted({str(name)[:64] for name in event_types} - set(EVENT_TYPES))
        if unknown:
            errors["event_types"] = [f"unknown event types: {', '.join(unknown)}"]
        elif len(set(event_types)) != len(event_types):
            errors["event_types"] = ["an event type is named more than once"]
    if errors:
        raise ValidationError(errors)


def action_record(kind: str, endpoint: WebhookEndpoint, actor, note: str = "", **kw) -> None:
    """The audit row of what ``actor`` (a user, or a label: ``api:<user>``, ``failure rule``)
    did to ``endpoint``; it names the endpoint and its merchant, so it outlives a delete."""
    WebhookAction.objects.create(
        kind=kind,
        endpoint=endpoint,
        endpoint_ref=str(endpoint.pk),
        merchant_id=endpoint.merchant_id,
        actor=actor if getattr(actor, "pk", None) else None,
        actor_label=actor.get_username() if getattr(actor, "pk", None) else str(actor or "")[:150],
        note=note,
        **kw,
    )


def webhook_endpoint_create(
    *,
    merchant_id: str,
    url: str,
    event_types: list[str],
    description: str = "",
    thin: bool = False,
    ordered: bool = False,
    api_version: str | None = None,
) -> WebhookEndpoint:
    """A new enabled endpoint with a fresh ``whsec_`` secret (the caller shows it once), its
    events rendered in ``api_version`` (the host's pin when None)."""
    endpoint_fields_checked(url=url, event_types=event_types, api_version=api_version)
    return WebhookEndpoint.objects.create(
        merchant_id=merchant_id,
        url=url,
        event_types=list(event_types),
        description=description,
        thin=thin,
        ordered=ordered,
        api_version=api_version or conf.API_VERSION,
        secret=secret_new(),
    )


def webhook_endpoint_update(
    *,
    endpoint: WebhookEndpoint,
    url: str | None,
    event_types: list | None,
    description: str | None = None,
    thin: bool | None = None,
    ordered: bool | None = None,
    api_version: str | None = None,
) -> WebhookEndpoint:
    """Change the fields given; each left alone when None. A new ``api_version`` applies from
    the next attempt on, to events already waiting too (same ``webhook-id``, the new shape)."""
    endpoint_fields_checked(url=url, event_types=event_types, api_version=api_version)
    changes = {
        "url": url,
        "event_types": None if event_types is None else list(event_types),
        "description": description,
        "thin": thin,
        "ordered": ordered,
        "api_version": api_version,
    }
    fields = ["updated_at"]
    for name, value in changes.items():
        if value is not None:
            setattr(endpoint, name, value)
            fields.append(name)
    endpoint.save(update_fields=fields)
    return endpoint


def webhook_endpoint_rotate_secret(
    *, endpoint: WebhookEndpoint, actor, now: datetime | None = None
) -> WebhookEndpoint:
    """A new secret; the old one keeps signing beside it for ``WEBHOOK_SECRET_GRACE``."""
    now = now or timezone.now()
    with transaction.atomic():
        locked = WebhookEndpoint.objects.select_for_update().get(id=endpoint.id)
        locked.previous_secret = locked.secret
        locked.previous_secret_expires_at = now + conf.WEBHOOK_SECRET_GRACE
        locked.secret = secret_new()
        locked.save(
            update_fields=["secret", "previous_secret", "previous_secret_expires_at", "updated_at"]
        )
        action_record(WebhookActionKind.ROTATE_SECRET, locked, actor)
    return locked


def webhook_endpoint_enable(
    *, endpoint: WebhookEndpoint, actor, note: str = "", now: datetime | None = None
) -> int:
    """Enable a disabled endpoint and replay from the moment it was disabled: its waiting
    deliveries are due at once, and every event dispatched since that it wants gets a delivery
    (those committed before the disabling but dispatched after it included). Returns
    how many deliveries are due; 0 (and nothing written) for an enabled endpoint."""
    now = now or timezone.now()
    with transaction.atomic():
        locked = WebhookEndpoint.objects.select_for_update().get(id=endpoint.id)
        if locked.enabled:
            return 0
        since = locked.disabled_at or now
        locked.enabled = True
        locked.disabled_at = None
        locked.disabled_reason = ""
        locked.consecutive_failures = 0
        locked.failing_since = None
        locked.save(
            update_fields=[
                "enabled",
                "disabled_at",
                "disabled_reason",
                "consecutive_failures",
                "failing_since",
                "updated_at",
            ]
        )
        missed = Event.objects.filter(merchant_id=locked.merchant_id, position__isnull=False)
        # Missed: what was dispatched while it was disabled. An event committed before the
        # disabling may be dispatched after it, so "since" is by dispatch order (position),
        # after the last event it was given; by time only for an endpoint never given one.
        last = WebhookDelivery.objects.filter(endpoint=locked).aggregate(
            last=Max("event__position")
        )["last"]
        missed = (
            missed.filter(created_at__gte=since)
            if last is None
            else missed.filter(position__gt=last)
        )
        if locked.event_types:
            missed = missed.filter(type__in=locked.event_types)
        WebhookDelivery.objects.bulk_create(
            [WebhookDelivery(endpoint=locked, event=event) for event in missed.only("id")],
            ignore_conflicts=True,
        )
        due = WebhookDelivery.objects.filter(endpoint=locked).filter(
            Q(status=DeliveryStatus.PENDING)
            | Q(status=DeliveryStatus.FAILED, created_at__gte=since)
        )
        count = due.update(status=DeliveryStatus.PENDING, next_attempt_at=now, attempts=0)
        action_record(WebhookActionKind.ENABLE, locked, actor, note, deliveries=count)
    endpoint.refresh_from_db()
    return count


def webhook_endpoint_delete(*, endpoint: WebhookEndpoint, actor, note: str = "") -> None:
    """Delete an endpoint with its deliveries and their attempts; its audit rows stay, with
    one more saying who deleted it and what its URL was."""
    with transaction.atomic():
        locked = WebhookEndpoint.objects.select_for_update().get(id=endpoint.id)
        action_record(WebhookActionKind.DELETE, locked, actor, note or f"its URL was {locked.url}")
        locked.delete()


def webhook_failed_replay_since(
    *, endpoint: WebhookEndpoint, since: datetime, actor, note: str, now: datetime | None = None
) -> int:
    """Send again every delivery to ``endpoint`` made since ``since`` that spent its retries,
    each with its own ``webhook-id``, on a fresh schedule: one UPDATE however many, and one
    audit row with the note. Returns how many."""
    if not note.strip():
        raise ValidationError({"note": ["a note is required"]})
    now = now or timezone.now()
    with transaction.atomic():
        locked = WebhookEndpoint.objects.select_for_update().get(id=endpoint.id)
        count = WebhookDelivery.objects.filter(
            endpoint=locked, status=DeliveryStatus.FAILED, created_at__gte=since
        ).update(status=DeliveryStatus.PENDING, next_attempt_at=now, attempts=0)
        note = f"failed since {since.isoformat()}: {note.strip()}"
        action_record(WebhookActionKind.REPLAY, locked, actor, note, deliveries=count)
    return count


def webhook_deliveries_replay(*, deliveries, actor, note: str, now: datetime | None = None) -> int:
    """Send the given deliveries again, each with its own ``webhook-id`` (its event's), with a
    fresh retry schedule; one audit row per endpoint with the note. Returns how many."""
    if not note.strip():
        raise ValidationError({"note": ["a note is required"]})
    now = now or timezone.now()
    with transaction.atomic():
        rows = list(
            WebhookDelivery.objects.select_for_update()
            .filter(id__in=[d.id for d in deliveries])
            .only("id", "endpoint_id")
        )
        WebhookDelivery.objects.filter(id__in=[row.id for row in rows]).update(
            status=DeliveryStatus.PENDING, next_attempt_at=now, attempts=0, delivered_at=None
        )
        by_endpoint: dict = {}
        for row in rows:
            by_endpoint[row.endpoint_id] = by_endpoint.get(row.endpoint_id, 0) + 1
        endpoints = WebhookEndpoint.objects.in_bulk(list(by_endpoint))
        for endpoint_id, count in by_endpoint.items():
            action_record(
                WebhookActionKind.REPLAY, endpoints[endpoint_id], actor, note, deliveries=count
            )
    return len(rows)
