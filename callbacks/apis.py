"""``POST /callbacks/processor/``: check a processor callback and put it on the FIFO queue.

The signature is the authentication, so the view skips sessions, users and CSRF, and it writes
nothing to the database: a 202 means the event is on the queue (SQS holds the promise), a 503
means nothing was promised and the processor must retry. Checks run cheapest first and in the
contract's order: size (413), media type (415), signature over the raw bytes (401), body (400).
"""

import json
import logging
import threading
from collections import OrderedDict

from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from callbacks import sqs
from callbacks.metrics import CALLBACKS_RECEIVED, DEDUP_HITS
from callbacks.schema import (
    InvalidMessage,
    event_deduplication_id,
    parse_processor_event,
    processor_event_message,
)
from payments import signing

logger = logging.getLogger(__name__)

# Seconds the processor should wait before retrying when the queue is down. Short: an SQS
# outage is usually brief and every retry that lands after recovery is accepted.
RETRY_AFTER_SECONDS = 10


class _RecentSends:
    """processor_event_id -> SQS message id of this process's recent sends.

    SQS answers a send inside its deduplication window with the original message id; seeing
    the same id again for the same deduplication id is how a repeat delivery becomes visible
    (per process, bounded; only for the metric, never for a decision).
    """

    def __init__(self, size: int = 10_000) -> None:
        self._size = size
        self._ids: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def is_repeat(self, deduplication_id: str, message_id: str) -> bool:
        with self._lock:
            repeat = self._ids.get(deduplication_id) == message_id
            self._ids[deduplication_id] = message_id
            self._ids.move_to_end(deduplication_id)
            if len(self._ids) > self._size:
                self._ids.popitem(last=False)
        return repeat


_recent_sends = _RecentSends()


def _reject(status: int, outcome: str, payload: dict) -> JsonResponse:
    CALLBACKS_RECEIVED.labels(outcome=outcome).inc()
    return JsonResponse(payload, status=status)


def _declared_length(request: HttpRequest) -> int | None:
    value = request.META.get("CONTENT_LENGTH")
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        return None


@csrf_exempt
@require_POST
def processor_callback(request: HttpRequest) -> JsonResponse:
    limit = settings.CALLBACK_MAX_BODY_BYTES
    too_large = {"detail": f"Request body is larger than {limit} bytes."}
    declared = _declared_length(request)
    if declared is not None and declared > limit:
        return _reject(413, "too_large", too_large)
    # The declared length can be absent (chunked) or wrong (ASGI streams the real body), so
    # read one byte past the limit rather than trusting it.
    body = request.read(limit + 1)
    if len(body) > limit:
        return _reject(413, "too_large", too_large)

    if request.content_type.lower() != "application/json":
        return _reject(
            415,
            "unsupported_media_type",
            {"detail": f"Content-Type must be application/json, got {request.content_type!r}."},
        )

    try:
        signing.verify(
            request.headers.get(signing.HEADER),
            body,
            settings.CALLBACK_SIGNING_SECRETS,
            tolerance_seconds=settings.CALLBACK_TOLERANCE_SECONDS,
        )
    except signing.SignatureError as exc:
        logger.warning("callback rejected: %s", exc, extra={"outcome": "bad_signature"})
        return _reject(401, "bad_signature", {"detail": str(exc)})

    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as exc:
        # ValueError covers both malformed JSON and bytes that are not UTF-8/16/32.
        return _reject(
            400, "bad_body", {"errors": {"non_field_errors": [f"Body is not valid JSON: {exc}"]}}
        )
    try:
        event = parse_processor_event(data)
    except InvalidMessage as exc:
        return _reject(400, "bad_body", {"errors": exc.errors})

    deduplication_id = event_deduplication_id(event)
    try:
        message_id = sqs.send_message_now(
            body=processor_event_message(event),
            group_id=str(event.payment_id),
            deduplication_id=deduplication_id,
        )
    except sqs.QueueUnavailable as exc:
        logger.error(
            "callback not accepted, queue unavailable: %s",
            exc,
            extra={
                "payment_id": str(event.payment_id),
                "processor_event_id": event.processor_event_id,
                "outcome": "queue_unavailable",
            },
        )
        response = _reject(
            503,
            "queue_unavailable",
            {"detail": "The event queue is unavailable; nothing was accepted, retry later."},
        )
        response["Retry-After"] = str(RETRY_AFTER_SECONDS)
        return response

    if _recent_sends.is_repeat(deduplication_id, message_id):
        DEDUP_HITS.labels(layer="sqs").inc()
    CALLBACKS_RECEIVED.labels(outcome="accepted").inc()
    logger.info(
        "callback accepted",
        extra={
            "payment_id": str(event.payment_id),
            "processor_event_id": event.processor_event_id,
            "event_type": event.event_type,
            "message_id": message_id,
            "outcome": "accepted",
        },
    )
    return JsonResponse(
        {"status": "accepted", "processor_event_id": event.processor_event_id}, status=202
    )
