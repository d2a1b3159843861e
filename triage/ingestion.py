"""DLQ ingestion: dead letters taken out of the dead-letter queue into the database.

``dead_letters_ingest`` stores each DLQ message as a ``DeadLetter`` row, commits, and only then
deletes it from the DLQ; the row's unique ``original_message_id`` makes a second delivery of the
same message (after a crash between commit and delete) a no-op. A message SQS's RedrivePolicy
moved (the worker never finished it) also puts its payment on hold. The worker's records of the
message (its ``QueueMessage`` and ``ProcessingError`` rows) are read through
``callbacks.selectors``; the operator's decisions about the stored rows are in
``triage.services``.
"""

from __future__ import annotations

import logging
import math
import uuid
from dataclasses import dataclass, field
from datetime import datetime

from django.db import DatabaseError, DataError, IntegrityError, transaction
from django.urls import reverse
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from callbacks import sqs
from callbacks.models import ProcessingError, QueueMessage
from callbacks.selectors import message_processing_errors, queue_message_by_id
from callbacks.services import (
    payment_hold,
    queue_message_mark_redrive_policy_dead_letter,
    storable_text,
)
from callbacks.sqs import ReceivedMessage
from payments.alerts import alert_raise
from payments.messages import dead_letter_mark, event_fields, message_kind
from triage.models import DeadLetter, DeadLetterSource

logger = logging.getLogger(__name__)

# Hidden long enough to store and delete a batch; a crash makes them visible again after this.
INGEST_VISIBILITY_TIMEOUT = 60
ERROR_MESSAGE_MAX = 4000


def dead_letters_ingest(*, max_messages: int = 100) -> int:
    """Move up to ``max_messages`` messages from the DLQ into the database; return how many
    new dead letters were stored.

    Per message: one transaction stores the row (and, for a message SQS's RedrivePolicy moved,
    puts its payment on hold), commits, then the message is deleted from the DLQ. A crash
    between commit and delete leaves the message in the DLQ; it is received again after its
    visibility timeout, found by its ``original_message_id`` and only deleted. A delete that
    fails is logged and retried the same way at the next run. Each new dead letter raises the
    high-severity alert once, after its commit. Raises ``sqs.QueueUnavailable`` when the DLQ
    cannot be read (nothing is lost: the messages stay in the DLQ).
    """
    if max_messages < 1:
        raise ValueError(f"max_messages must be at least 1, got {max_messages}")
    url = sqs.dead_letter_queue_url()
    taken = stored = 0
    while taken < max_messages:
        messages = sqs.receive_messages(
            url=url,
            max_messages=min(10, max_messages - taken),
            wait_seconds=0,
            visibility_timeout=INGEST_VISIBILITY_TIMEOUT,
        )
        if not messages:
            break
        for message in messages:
            taken += 1
            try:
                dead_letter = _dead_letter_store(message)
            except DatabaseError as exc:
                # Left in the DLQ (it comes back after the visibility timeout); the others of
                # the batch still go through, and a human hears about this one.
                _store_failed(message, exc)
                continue
            if dead_letter is not None:
                stored += 1
            _dlq_delete(url, message)
    if taken:
        logger.info("DLQ ingestion: %s message(s) taken, %s new dead letter(s)", taken, stored)
    return stored


def _dlq_delete(url: str, message: ReceivedMessage) -> None:
    """Delete one ingested message from the DLQ; a failure is logged, never raised: the row is
    committed, and the message comes back after its visibility timeout to be deleted then."""
    try:
        sqs.delete_message(url=url, receipt_handle=message.receipt_handle)
    except sqs.QueueUnavailable as exc:  # the next run retries; nothing is lost
        logger.warning(
            "could not delete message %s from the DLQ (it will be seen again): %s",
            message.message_id,
            exc,
        )


def _store_failed(message: ReceivedMessage, exc: Exception) -> None:
    message_id = message.message_id
    logger.exception("dead letter %s could not be stored; it stays in the DLQ", message_id)
    alert_raise(
        severity="high",
        key=f"dead_letter_ingest_failed:{message_id}",
        summary=(
            f"DLQ message {message_id} could not be stored as a dead letter and stays in the "
            f"DLQ: {exc}"
        ),
        details={"dlq_message_id": message_id, "error": str(exc)[:2000]},
        payment_id=message.group_id or None,
    )


@dataclass
class _Parsed:
    body: dict
    source: str
    original_message_id: str
    group_id: str
    envelope: dict = field(default_factory=dict)


def _parse(message: ReceivedMessage) -> _Parsed:
    body = message.body if message.body is not None else {"raw_body": message.raw_body}
    envelope = dead_letter_mark(body)
    if envelope is not None:
        return _Parsed(
            body=body,
            source=DeadLetterSource.WORKER,
            original_message_id=str(envelope["original_message_id"])[:128],
            group_id=message.group_id,
            envelope=envelope,
        )
    # Moved by the RedrivePolicy: SQS keeps the message id and the body untouched.
    return _Parsed(
        body=body,
        source=DeadLetterSource.REDRIVE_POLICY,
        original_message_id=message.message_id,
        group_id=message.group_id,
    )


def _as_uuid(*candidates) -> uuid.UUID | None:
    for value in candidates:
        if isinstance(value, str):
            try:
                return uuid.UUID(value)
            except ValueError:
                continue
    return None


def _when(value) -> datetime | None:
    try:
        return parse_datetime(value) if isinstance(value, str) else None
    except ValueError:  # well formed but impossible, e.g. month 13: keep the row, lose the date
        return None


def _count(value) -> int | None:
    try:
        return max(int(value), 0)
    except (TypeError, ValueError):
        return None


def _storable(value):
    """``value`` with every string made storable and every non-finite number made a string."""
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {storable_text(str(k)): _storable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_storable(v) for v in value]
    return value


def _as_text(message: ReceivedMessage, parsed: _Parsed) -> _Parsed:
    """The same dead letter with its body kept as escaped text: what the database refused
    (a NUL, an unpaired surrogate, a NaN) must not keep the message in the DLQ."""
    return _Parsed(
        body={"raw_body": storable_text(message.raw_body)},
        source=parsed.source,
        original_message_id=storable_text(parsed.original_message_id),
        group_id=storable_text(parsed.group_id),
        envelope=_storable(parsed.envelope),
    )


def _dead_letter_store(message: ReceivedMessage) -> DeadLetter | None:
    """Store one DLQ message; None when it was stored before (by us or a concurrent run).
    A body the database refuses is stored as escaped text instead."""
    parsed = _parse(message)
    if DeadLetter.objects.filter(original_message_id=parsed.original_message_id).exists():
        return None
    try:
        return _dead_letter_insert(message, parsed)
    except (DataError, UnicodeError) as exc:
        logger.warning(
            "dead letter %s: body refused by the database (%s); stored as text",
            message.message_id,
            exc,
        )
        return _dead_letter_insert(message, _as_text(message, parsed))


def _dead_letter_insert(message: ReceivedMessage, parsed: _Parsed) -> DeadLetter | None:
    try:
        with transaction.atomic():
            dead_letter = _dead_letter_build(message, parsed)
            dead_letter.save(force_insert=True)
            if parsed.source == DeadLetterSource.REDRIVE_POLICY and parsed.group_id:
                _hold_for_redrive_policy(dead_letter)
            transaction.on_commit(lambda: _dead_letter_alert(dead_letter))
    except IntegrityError:
        # A concurrent ingestion stored the same message first: someone else did it.
        if DeadLetter.objects.filter(original_message_id=parsed.original_message_id).exists():
            return None
        raise
    logger.error(
        "dead letter %s stored: %s for payment %s, %s attempt(s), %s",
        dead_letter.pk,
        dead_letter.kind or "unknown kind",
        dead_letter.group_id,
        dead_letter.attempts,
        dead_letter.last_error_class or "no error recorded",
        extra={"payment_id": dead_letter.group_id, "message_id": dead_letter.original_message_id},
    )
    return dead_letter


def _dead_letter_build(message: ReceivedMessage, parsed: _Parsed) -> DeadLetter:
    """The unsaved row for one DLQ message, with the history the worker recorded for it."""
    queue_message = queue_message_by_id(parsed.original_message_id)
    errors = list(message_processing_errors(parsed.original_message_id))
    dead_letter = _dead_letter_identity(message, parsed, queue_message)
    if parsed.source == DeadLetterSource.WORKER:
        _history_from_worker(dead_letter, parsed.envelope, errors)
    else:
        receive_count = _count(message.attributes.get("ApproximateReceiveCount")) or 0
        _history_from_redrive_policy(dead_letter, queue_message, errors, receive_count)
    return dead_letter


def _dead_letter_identity(
    message: ReceivedMessage, parsed: _Parsed, queue_message: QueueMessage | None
) -> DeadLetter:
    """What the message is: its ids, kind, payment and body (no history yet)."""
    body = parsed.body
    kind = message_kind(body)
    # A processor event's fields are nested in the envelope; a submit_payment is all ours.
    fields = event_fields(body)
    event_id = fields.get("processor_event_id")
    return DeadLetter(
        original_message_id=parsed.original_message_id,
        dlq_message_id=message.message_id,
        payment_id=_as_uuid(parsed.group_id, fields.get("payment_id")),
        kind=kind[:32],
        group_id=parsed.group_id[:128],
        deduplication_id=_deduplication_id(message, parsed, queue_message)[:128],
        processor_event_id=event_id[:128] if isinstance(event_id, str) else "",
        body=body,
        attributes=message.attributes,
        source=parsed.source,
    )


def _deduplication_id(
    message: ReceivedMessage, parsed: _Parsed, queue_message: QueueMessage | None
) -> str:
    if queue_message is not None:
        return queue_message.deduplication_id
    # SQS's RedrivePolicy keeps the original deduplication id; the worker's copy has its own.
    return message.deduplication_id if parsed.source == DeadLetterSource.REDRIVE_POLICY else ""


def _history_from_worker(
    dead_letter: DeadLetter, envelope: dict, errors: list[ProcessingError]
) -> None:
    """The worker dead-lettered it itself: its envelope says how many attempts and why."""
    dead_letter.attempts = _count(envelope.get("attempts")) or len(errors)
    dead_letter.first_failed_at = (
        errors[0].created_at if errors else _when(envelope.get("first_started_at"))
    )
    dead_letter.last_failed_at = _when(envelope.get("dead_lettered_at")) or (
        errors[-1].created_at if errors else timezone.now()
    )
    dead_letter.last_error_class = str(envelope.get("error_class") or "")[:255]
    dead_letter.last_error_message = str(envelope.get("error") or "")[:ERROR_MESSAGE_MAX]


def _history_from_redrive_policy(
    dead_letter: DeadLetter,
    queue_message: QueueMessage | None,
    errors: list[ProcessingError],
    receive_count: int,
) -> None:
    """RedrivePolicy: the worker never finished the message (it crashed or hung past the
    visibility timeout on each try), so its own records are the only history there is."""
    started = queue_message.attempts if queue_message is not None else 0
    dead_letter.attempts = max(started, receive_count)
    moments = [e.created_at for e in errors]
    if queue_message is not None:
        moments += [queue_message.first_started_at, queue_message.last_started_at]
    dead_letter.first_failed_at = min(moments) if moments else None
    dead_letter.last_failed_at = max(moments) if moments else timezone.now()
    dead_letter.last_error_class = errors[-1].error_class if errors else ""
    explanation = (
        f"Moved to the DLQ by the queue's RedrivePolicy: the worker never finished it "
        f"({started} attempt(s) started, {len(errors)} error(s) recorded, SQS receive count "
        f"{receive_count or 'unknown'}). That points to a worker crash or a hang longer than "
        "the visibility timeout while handling this message."
    )
    if errors:
        explanation += f" Last recorded error: {errors[-1].error_class}: {errors[-1].message}"
    dead_letter.last_error_message = explanation[:ERROR_MESSAGE_MAX]


def _hold_for_redrive_policy(dead_letter: DeadLetter) -> None:
    """The worker may not have seen this message fail: make sure its payment is on hold and
    its record no longer counts as unfinished (it has left the queue)."""
    queue_message = queue_message_by_id(dead_letter.original_message_id)
    if queue_message is not None:
        queue_message_mark_redrive_policy_dead_letter(message_id=queue_message.message_id)
    payment_hold(
        payment_id=dead_letter.group_id,
        reason=(
            f"Message {dead_letter.original_message_id} ({dead_letter.kind or 'unknown kind'}) "
            "was moved to the dead-letter queue by the RedrivePolicy (dead letter "
            f"{dead_letter.pk})."
        ),
        caused_by=queue_message,
    )


def _dead_letter_alert(dead_letter: DeadLetter) -> None:
    alert_raise(
        severity="high",
        key=f"dead_letter:{dead_letter.pk}",
        summary=(
            f"Dead letter {dead_letter.pk}: {dead_letter.kind or 'message'} for payment "
            f"{dead_letter.group_id or 'unknown'} after {dead_letter.attempts} attempt(s): "
            f"{dead_letter.last_error_class or 'no error recorded'}"
        ),
        details={
            "dead_letter_id": dead_letter.pk,
            "original_message_id": dead_letter.original_message_id,
            "source": dead_letter.source,
            "kind": dead_letter.kind,
            "attempts": dead_letter.attempts,
            "error_class": dead_letter.last_error_class,
            "error": dead_letter.last_error_message[:500],
            "admin_path": reverse("admin:triage_deadletter_change", args=[dead_letter.pk]),
        },
        payment_id=dead_letter.payment_id or dead_letter.group_id or None,
    )
