"""Delivering events: at least once, with the event's id as ``webhook-id`` on every attempt.

Three steps, none holding a transaction across the network:

1. ``events_dispatch``: under one advisory lock, give committed events their ``position`` (the
   order the events list pages by) and a delivery row per enabled endpoint that wants them.
2. ``deliveries_claim``: take due deliveries (``SKIP LOCKED``) and push their
   ``next_attempt_at`` past the attempt's longest run: that is their lease. A sender killed
   mid-request leaves the lease to expire, and the delivery is claimed again.
3. ``delivery_attempt``: sign and send outside any transaction, then record the attempt and its
   outcome in a short one (success; a retry after the schedule's next delay, with jitter; or
   failed once the schedule is spent). An endpoint failing ``WEBHOOK_DISABLE_AFTER_FAILURES``
   attempts over ``WEBHOOK_DISABLE_AFTER_HOURS`` is disabled, with an alert and an event.
"""

import json
import logging
import random
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

import requests
from django.db import connection, transaction
from django.db.models import Exists, F, Max, OuterRef, Q
from django.utils import timezone
from urllib3 import exceptions as urllib3_errors

from payments import conf
from payments.alerts import AlertSeverity, alert_raise
from payments.api_versions import VERSION_HEADER
from payments.kernel.locks import _lock_key
from payments.webhooks.addresses import (
    AddressRefused,
    guarded_session,
    request_deadline,
    url_resolved_check,
)
from payments.webhooks.catalogue import ENDPOINT_DISABLED
from payments.webhooks.events import event_record
from payments.webhooks.models import (
    DeliveryStatus,
    Event,
    WebhookActionKind,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
)
from payments.webhooks.serializers import WebhookEndpointOutputSerializer
from payments.webhooks.services import action_record
from payments.webhooks.signing import signature_headers
from payments.webhooks.versions import event_shape

logger = logging.getLogger(__name__)

RESPONSE_HEAD_BYTES = 512
DISPATCH_LOCK = "payments.webhooks.events_dispatch"
USER_AGENT = "payments-webhooks/1"


def events_dispatch(*, limit: int = 1000) -> int:
    """Number up to ``limit`` committed, not yet numbered events and fan them out; return how
    many. One run at a time (a transaction-level advisory lock): a run sees every event that
    committed before it took the lock, so positions follow the order events became visible."""
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_lock_key(DISPATCH_LOCK)])
        events = list(
            Event.objects.filter(position__isnull=True).order_by("created_at", "id")[:limit]
        )
        if not events:
            return 0
        last = Event.objects.aggregate(last=Max("position"))["last"] or 0
        for offset, event in enumerate(events, start=1):
            event.position = last + offset
        Event.objects.bulk_update(events, ["position"])
        merchants = {event.merchant_id for event in events}
        endpoints = list(WebhookEndpoint.objects.filter(merchant_id__in=merchants, enabled=True))
        WebhookDelivery.objects.bulk_create(
            [
                WebhookDelivery(endpoint=endpoint, event=event)
                for event in events
                for endpoint in endpoints
                if endpoint.merchant_id == event.merchant_id and endpoint.wants(event.type)
            ],
            ignore_conflicts=True,
        )
    return len(events)


def attempt_lease() -> timedelta:
    """How long a claimed delivery is left to its sender: the request's longest run (connect
    and read timeouts, the head read) with room to record it."""
    return timedelta(seconds=3 * float(conf.WEBHOOK_TIMEOUT_SECONDS) + 30)


def deliveries_claim(*, limit: int = 100, now: datetime | None = None) -> list[int]:
    """Take up to ``limit`` due deliveries of enabled endpoints, oldest first, and lease them.

    For an ``ordered`` endpoint a delivery is not due while an earlier event about the same
    payment (by ``position``) still has a pending delivery to it, leased or waiting for its
    retry: the later one goes once the earlier one is delivered, or has failed for good."""
    now = now or timezone.now()
    earlier_pending = WebhookDelivery.objects.filter(
        endpoint_id=OuterRef("endpoint_id"),
        status=DeliveryStatus.PENDING,
        event__object_id=OuterRef("event__object_id"),
        event__position__lt=OuterRef("event__position"),
    )
    with transaction.atomic():
        ids = list(
            WebhookDelivery.objects.select_for_update(skip_locked=True, of=("self",))
            .filter(status=DeliveryStatus.PENDING, next_attempt_at__lte=now, endpoint__enabled=True)
            .exclude(Q(endpoint__ordered=True) & Exists(earlier_pending))
            .order_by("next_attempt_at", "id")
            .values_list("id", flat=True)[:limit]
        )
        if ids:
            WebhookDelivery.objects.filter(id__in=ids).update(next_attempt_at=now + attempt_lease())
    return ids


def deliveries_release(ids: list[int], *, now: datetime | None = None) -> int:
    """Make claimed deliveries due again at once (their sender could not take them); returns
    how many were still pending. Sending one twice is within the contract: the receiver drops
    the repeat by its ``webhook-id``."""
    return WebhookDelivery.objects.filter(id__in=ids, status=DeliveryStatus.PENDING).update(
        next_attempt_at=now or timezone.now()
    )


@dataclass(frozen=True)
class AttemptResult:
    status_code: int | None
    error: str
    latency_ms: int
    response_head: str

    @property
    def succeeded(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


def event_body(event: Event, *, version: str, thin: bool = False) -> bytes:
    """What an attempt to an endpoint pinned to ``version`` gets for ``event``: the event in
    that version's shape (``payments.webhooks.versions``), the same bytes on every attempt
    while the endpoint keeps its version. Thin, the object is its ``id`` and ``object`` only,
    for a receiver that reads it back from the API rather than trust a copy."""
    payload = event_shape(event, version, thin=thin)
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def endpoint_secrets(endpoint: WebhookEndpoint, now: datetime) -> list[str]:
    """The secrets that sign now: the current one, and the previous one during its grace."""
    in_use = [endpoint.secret]
    expires = endpoint.previous_secret_expires_at
    if endpoint.previous_secret and expires is not None and expires > now:
        in_use.append(endpoint.previous_secret)
    return in_use


def request_send(*, endpoint: WebhookEndpoint, event: Event, now: datetime) -> AttemptResult:
    """Sign and POST, no redirect followed, reading at most the answer's first bytes. Every
    failure is an ``AttemptResult``; no error text carries a secret or a signature."""
    # Rendered for this attempt in the endpoint's version now; the signature covers these bytes.
    body = event_body(event, version=endpoint.api_version, thin=endpoint.thin)
    headers = signature_headers(
        secrets_in_use=endpoint_secrets(endpoint, now), msg_id=event.id, timestamp=now, body=body
    )
    headers.update(
        {
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            # As every API answer names the version it is in.
            VERSION_HEADER: endpoint.api_version,
        }
    )
    timeout = float(conf.WEBHOOK_TIMEOUT_SECONDS)
    started = time.monotonic()

    def result(status_code: int | None, error: str = "", head: str = "") -> AttemptResult:
        latency = int((time.monotonic() - started) * 1000)
        return AttemptResult(status_code, error[:255], latency, head)

    try:
        url_resolved_check(endpoint.url)
    except AddressRefused as exc:
        return result(None, f"refused: {exc}")
    try:
        with (
            request_deadline(2 * timeout) as cut,
            guarded_session() as session,
            session.post(
                endpoint.url,
                data=body,
                headers=headers,
                timeout=(min(timeout, 5.0), timeout),
                allow_redirects=False,
                stream=True,
            ) as response,
        ):
            if cut():  # headers cut short end as if complete: they are not an answer
                return result(None, f"too slow: no answer within {2 * timeout:g} s in all")
            # Its status is its answer; a head cut short by the deadline is kept as it came.
            head = _head_read(response)
            return result(response.status_code, "", head.decode("utf-8", "replace"))
    except AddressRefused as exc:
        return result(None, f"refused: {exc}")
    except requests.Timeout:
        return result(None, "timeout")
    except requests.RequestException as exc:
        if cut():
            return result(None, f"too slow: no answer within {2 * timeout:g} s in all")
        return result(None, f"connection error: {type(exc).__name__}")


def _head_read(response: requests.Response) -> bytes:
    try:
        return response.raw.read(RESPONSE_HEAD_BYTES, decode_content=False) or b""
    except (OSError, requests.RequestException, urllib3_errors.HTTPError):
        return b""


def retry_delay(attempts: int) -> timedelta | None:
    """The wait after the ``attempts``-th failed attempt, with up to a fifth of jitter either
    way; None once the schedule is spent."""
    schedule = conf.WEBHOOK_RETRY_SCHEDULE
    if attempts > len(schedule):
        return None
    base = float(schedule[attempts - 1])
    return timedelta(seconds=base * random.uniform(0.8, 1.2))


def delivery_attempt(*, delivery_id: int, now: datetime | None = None) -> AttemptResult | None:
    """Send one claimed delivery and record the attempt; None if it is no longer pending."""
    delivery = (
        WebhookDelivery.objects.select_related("endpoint", "event")
        .filter(id=delivery_id, status=DeliveryStatus.PENDING)
        .first()
    )
    if delivery is None:
        return None
    started_at = now or timezone.now()
    result = request_send(endpoint=delivery.endpoint, event=delivery.event, now=started_at)
    attempt_record(delivery=delivery, result=result, started_at=started_at)
    logger.info(
        "webhook %s to endpoint %s: %s",
        delivery.event_id,
        delivery.endpoint_id,
        result.status_code or result.error,
        extra={"webhook_id": delivery.event_id, "latency_ms": result.latency_ms},
    )
    return result


def attempt_record(
    *, delivery: WebhookDelivery, result: AttemptResult, started_at: datetime
) -> None:
    now = timezone.now()
    with transaction.atomic():
        locked = WebhookDelivery.objects.select_for_update().get(id=delivery.id)
        WebhookAttempt.objects.create(
            delivery=locked,
            number=locked.attempts + 1,
            started_at=started_at,
            latency_ms=result.latency_ms,
            status_code=result.status_code,
            error=result.error,
            response_head=result.response_head,
        )
        locked.attempts += 1
        locked.last_status_code = result.status_code
        fields = ["attempts", "last_status_code"]
        if locked.status != DeliveryStatus.PENDING:
            pass  # a repeat of a finished delivery (replayed twice, a late duplicate task)
        elif result.succeeded:
            locked.status = DeliveryStatus.SUCCEEDED
            locked.delivered_at = now
            fields += ["status", "delivered_at"]
        else:
            delay = retry_delay(locked.attempts)
            if delay is None:
                locked.status = DeliveryStatus.FAILED
                fields.append("status")
            else:
                locked.next_attempt_at = now + delay
                fields.append("next_attempt_at")
        locked.save(update_fields=fields)
        endpoints = WebhookEndpoint.objects.filter(id=locked.endpoint_id)
        if result.succeeded:
            endpoints.filter(consecutive_failures__gt=0).update(
                consecutive_failures=0, failing_since=None
            )
        else:
            endpoints.filter(failing_since__isnull=True).update(failing_since=now)
            endpoints.update(consecutive_failures=F("consecutive_failures") + 1)
            _disable_if_failing(locked.endpoint_id, now)


def _disable_if_failing(endpoint_id, now: datetime) -> None:
    endpoint = WebhookEndpoint.objects.select_for_update().get(id=endpoint_id)
    failing_for = now - (endpoint.failing_since or now)
    if (
        not endpoint.enabled
        or endpoint.consecutive_failures < conf.WEBHOOK_DISABLE_AFTER_FAILURES
        or failing_for < timedelta(hours=float(conf.WEBHOOK_DISABLE_AFTER_HOURS))
    ):
        return
    reason = (
        f"{endpoint.consecutive_failures} failed attempts in a row since "
        f"{endpoint.failing_since:%Y-%m-%d %H:%M:%S} UTC"
    )
    endpoint_disable(endpoint=endpoint, reason=reason, now=now)


def endpoint_shape(endpoint: WebhookEndpoint) -> dict:
    """The endpoint as the API shows it (never its secret), for the event of its disabling."""
    return dict(WebhookEndpointOutputSerializer(endpoint).data)


def endpoint_disable(*, endpoint: WebhookEndpoint, reason: str, now: datetime) -> None:
    """Disable a locked endpoint: its deliveries wait (re-enabling sends them, and every event
    since), an event tells the merchant's other endpoints and the events list, and an alert
    tells the operators after commit."""
    endpoint.enabled = False
    endpoint.disabled_at = now
    endpoint.disabled_reason = reason[:255]
    endpoint.save(update_fields=["enabled", "disabled_at", "disabled_reason", "updated_at"])
    event_record(
        type=ENDPOINT_DISABLED,
        merchant_id=endpoint.merchant_id,
        obj=endpoint_shape(endpoint),
    )
    action_record(WebhookActionKind.DISABLE, endpoint, "failure rule", endpoint.disabled_reason)
    endpoint_id, merchant_id = str(endpoint.id), endpoint.merchant_id
    transaction.on_commit(
        lambda: alert_raise(
            severity=AlertSeverity.MEDIUM,
            key="webhook_endpoint_disabled",
            summary=f"webhook endpoint {endpoint_id} of merchant {merchant_id} disabled: {reason}",
            details={"endpoint_id": endpoint_id, "merchant_id": merchant_id},
        ),
        robust=True,
    )


def deliveries_run(*, limit: int = 100, now: datetime | None = None) -> int:
    """Dispatch, then claim and send due deliveries in this process, one after another (the
    command's and the tests' way; Celery sends each claimed delivery as its own task)."""
    events_dispatch()
    sent = 0
    for delivery_id in deliveries_claim(limit=limit, now=now):
        if delivery_attempt(delivery_id=delivery_id) is not None:
            sent += 1
    return sent
