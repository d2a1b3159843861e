"""Writes of triage: dead letters taken out of the DLQ, and the human decisions about them.

Ingestion (``dead_letters_ingest``) stores each DLQ message as a ``DeadLetter`` row, commits,
and only then deletes it from the DLQ; the row's unique ``original_message_id`` makes a second
delivery of the same message (after a crash between commit and delete) a no-op.

The actions (``dead_letter_redrive``, ``dead_letter_resolve``, ``dead_letter_discard``) act only
on an open dead letter, need the ``triage.act_on_deadletter`` permission and a note, and leave a
``TriageAction`` audit row and an admin ``LogEntry``. When the payment's last open dead letter is
handled, its hold is released: the parked messages are republished in their original order
behind the redriven message (``callbacks.services.hold_release``).
"""

from __future__ import annotations

import logging
import math
import uuid
from dataclasses import dataclass, field
from datetime import datetime

from django.contrib.admin.models import CHANGE, LogEntry
from django.db import DatabaseError, DataError, IntegrityError, transaction
from django.urls import reverse
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from callbacks import sqs
from callbacks.models import (
    PaymentHold,
    ProcessingError,
    QueueMessage,
)
from callbacks.schema import EVENT_KEY, PROCESSOR_EVENT
from callbacks.selectors import payment_active_hold
from callbacks.services import (
    DEAD_LETTER_KEY,
    hold_release,
    message_republish,
    payment_hold,
    queue_message_mark_redrive_policy_dead_letter,
    storable_text,
)
from callbacks.sqs import ReceivedMessage
from payments.alerts import alert_raise
from triage.exceptions import (
    DeadLetterNotOpen,
    HoldReleaseFailed,
    NotAllowed,
    NoteRequired,
    RedrivePublishFailed,
    TriageError,
)
from triage.models import (
    BulkTriageJob,
    DeadLetter,
    DeadLetterSource,
    DeadLetterStatus,
    TriageAction,
    TriageActionKind,
)
from triage.selectors import hold_release_blockers

logger = logging.getLogger(__name__)

ACT_PERMISSION = "triage.act_on_deadletter"
# Hidden long enough to store and delete a batch; a crash makes them visible again after this.
INGEST_VISIBILITY_TIMEOUT = 60
ERROR_MESSAGE_MAX = 4000


# --- Ingestion ---------------------------------------------------------------------------------


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


def _audit_unchanged(
    dead_letter: DeadLetter,
    action: str,
    *,
    user,
    note: str,
    details: dict,
    bulk_job: BulkTriageJob | None = None,
) -> TriageAction:
    """An audit row for an action that left the dead letter's status as it was (a failed
    publish, a release of its hold, a race lost to another operator)."""
    return TriageAction.objects.create(
        dead_letter=dead_letter,
        action=action,
        user=user,
        note=note,
        status_before=dead_letter.status,
        status_after=dead_letter.status,
        details=details,
        bulk_job=bulk_job,
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
    envelope = body.get(DEAD_LETTER_KEY)
    if isinstance(envelope, dict) and envelope.get("original_message_id"):
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
    body, envelope = parsed.body, parsed.envelope
    attributes = message.attributes
    queue_message = QueueMessage.objects.filter(message_id=parsed.original_message_id).first()
    errors = list(
        ProcessingError.objects.filter(message_id=parsed.original_message_id).order_by(
            "created_at", "id"
        )
    )
    kind = body.get("kind") if isinstance(body.get("kind"), str) else ""
    # A processor event's fields are nested in the envelope; a submit_payment is all ours.
    nested = body.get(EVENT_KEY) if kind == PROCESSOR_EVENT else None
    fields = nested if isinstance(nested, dict) else body
    event_id = fields.get("processor_event_id")
    receive_count = _count(attributes.get("ApproximateReceiveCount")) or 0
    now = timezone.now()
    dead_letter = DeadLetter(
        original_message_id=parsed.original_message_id,
        dlq_message_id=message.message_id,
        payment_id=_as_uuid(parsed.group_id, fields.get("payment_id")),
        kind=kind[:32],
        group_id=parsed.group_id[:128],
        deduplication_id=(
            queue_message.deduplication_id
            if queue_message is not None
            else (
                message.deduplication_id if parsed.source == DeadLetterSource.REDRIVE_POLICY else ""
            )
        )[:128],
        processor_event_id=event_id[:128] if isinstance(event_id, str) else "",
        body=body,
        attributes=attributes,
        source=parsed.source,
    )
    if parsed.source == DeadLetterSource.WORKER:
        dead_letter.attempts = _count(envelope.get("attempts")) or len(errors)
        dead_letter.first_failed_at = (
            errors[0].created_at if errors else _when(envelope.get("first_started_at"))
        )
        dead_letter.last_failed_at = _when(envelope.get("dead_lettered_at")) or (
            errors[-1].created_at if errors else now
        )
        dead_letter.last_error_class = str(envelope.get("error_class") or "")[:255]
        dead_letter.last_error_message = str(envelope.get("error") or "")[:ERROR_MESSAGE_MAX]
        return dead_letter

    # RedrivePolicy: the worker never finished the message (it crashed or hung past the
    # visibility timeout on each try), so its own records are the only history there is.
    started = queue_message.attempts if queue_message is not None else 0
    dead_letter.attempts = max(started, receive_count)
    moments = [e.created_at for e in errors]
    if queue_message is not None:
        moments += [queue_message.first_started_at, queue_message.last_started_at]
    dead_letter.first_failed_at = min(moments) if moments else None
    dead_letter.last_failed_at = max(moments) if moments else now
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
    return dead_letter


def _hold_for_redrive_policy(dead_letter: DeadLetter) -> None:
    """The worker may not have seen this message fail: make sure its payment is on hold and
    its record no longer counts as unfinished (it has left the queue)."""
    queue_message = QueueMessage.objects.filter(message_id=dead_letter.original_message_id).first()
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


# --- Actions -----------------------------------------------------------------------------------


@dataclass
class ActionResult:
    """What an action did: the dead letter after it, its audit row, and the hold's fate."""

    dead_letter: DeadLetter
    action: TriageAction
    released: int | None = None  # messages republished by the release; None = not released
    release_note: str = ""  # why the hold was not released, or why the release failed
    release_failed: bool = False


def _note_clean(note: str | None) -> str:
    note = (note or "").strip()
    if not note:
        raise NoteRequired()
    return note


def _check_allowed(user) -> None:
    if user is None or not user.is_active or not user.has_perm(ACT_PERMISSION):
        raise NotAllowed(user)


def _log_entry(user, dead_letter: DeadLetter, message: str) -> None:
    LogEntry.objects.log_actions(
        user_id=user.pk,
        queryset=[dead_letter],
        action_flag=CHANGE,
        change_message=message[:2000],
        single_object=True,
    )


def _lock_open(dead_letter_id: int, verb: str) -> DeadLetter:
    locked = DeadLetter.objects.select_for_update().get(pk=dead_letter_id)
    if locked.status != DeadLetterStatus.OPEN:
        raise DeadLetterNotOpen(locked, verb)
    return locked


def _close(
    *,
    dead_letter_id: int,
    user,
    note: str,
    kind: str,
    status: str,
    verb: str,
    details: dict,
    redrive_message_id: str = "",
    bulk_job: BulkTriageJob | None = None,
) -> tuple[DeadLetter, TriageAction]:
    """Mark an open dead letter with its new status and write the audit rows, in one
    transaction under the row lock."""
    with transaction.atomic():
        locked = _lock_open(dead_letter_id, verb)
        locked.status = status
        locked.status_changed_at = timezone.now()
        fields = ["status", "status_changed_at"]
        if redrive_message_id:
            locked.redrive_message_id = redrive_message_id
            fields.append("redrive_message_id")
        locked.save(update_fields=fields)
        action = TriageAction.objects.create(
            dead_letter=locked,
            action=kind,
            user=user,
            note=note,
            status_before=DeadLetterStatus.OPEN,
            status_after=status,
            details=details,
            bulk_job=bulk_job,
        )
        _log_entry(user, locked, f"{kind}: {note}")
    logger.warning(
        "dead letter %s %s by %s: %s",
        locked.pk,
        verb,
        user,
        note,
        extra={"payment_id": locked.group_id, "message_id": locked.original_message_id},
    )
    return locked, action


def redrive_deduplication_id(dead_letter: DeadLetter) -> str:
    # Only an open dead letter can be redriven, so each is redriven at most once ("1"); a
    # redriven message that dies again comes back as a new dead letter with its own message id.
    return f"{dead_letter.original_message_id}:redrive:1"


def dead_letter_redrive(
    *, dead_letter: DeadLetter, user, note: str, bulk_job: BulkTriageJob | None = None
) -> ActionResult:
    """Publish the dead message again to the main FIFO queue (same group, new deduplication id),
    mark the dead letter redriven, and release the payment's hold if nothing else blocks it.

    Order: publish first, then commit. The publish never runs inside a transaction that could
    roll back, and its deduplication id is deterministic, so:

    - if the publish fails, nothing changed: the dead letter stays open, the failed attempt is
      recorded as an audit row and ``RedrivePublishFailed`` tells the operator;
    - if the process dies after the publish and before the commit, the dead letter is still
      open; redriving it again within SQS's 5-minute window is dropped by SQS, and after it the
      worker's own dedup (processed event ids, the processor's idempotency key) makes a second
      copy harmless;
    - if another operator closed it in the meantime (the send takes milliseconds), the publish
      already happened: it is recorded on an audit row and reported, never hidden.

    Then, after the commit, ``hold_release`` republishes the parked messages behind it.
    """
    note = _note_clean(note)
    _check_allowed(user)
    current = DeadLetter.objects.get(pk=dead_letter.pk)
    if current.status != DeadLetterStatus.OPEN:
        raise DeadLetterNotOpen(current, "redriven")
    body_fields = set(current.body) - {DEAD_LETTER_KEY}
    if body_fields == {"raw_body"} or not current.group_id:
        raise TriageError(
            f"Dead letter {current.pk} has no JSON body or no message group: it cannot be "
            "redriven. Resolve it (if fixed elsewhere) or discard it."
        )
    deduplication_id = redrive_deduplication_id(current)
    try:
        new_message_id = message_republish(
            deduplication_id=deduplication_id,
            body=current.body,
            group_id=current.group_id,
            original_message_id=current.original_message_id,
        )
    except sqs.QueueUnavailable as exc:
        _audit_unchanged(
            current,
            TriageActionKind.REDRIVE,
            user=user,
            note=note,
            details={"outcome": "publish_failed", "error": str(exc)[:2000]},
            bulk_job=bulk_job,
        )
        logger.error("redrive of dead letter %s failed: %s", current.pk, exc)
        raise RedrivePublishFailed(
            f"The main queue did not accept the redrive of dead letter {current.pk}: {exc}. "
            "Nothing changed; the dead letter is still open. Try again when the queue is back."
        ) from exc
    details = {
        "outcome": "published",
        "deduplication_id": deduplication_id,
        "redrive_message_id": new_message_id,
    }
    try:
        closed, action = _close(
            dead_letter_id=current.pk,
            user=user,
            note=note,
            kind=TriageActionKind.REDRIVE,
            status=DeadLetterStatus.REDRIVEN,
            verb="redriven",
            details=details,
            redrive_message_id=new_message_id,
            bulk_job=bulk_job,
        )
    except DeadLetterNotOpen as exc:
        other = exc.dead_letter
        if other.redrive_message_id == new_message_id:
            # Someone redrove it a moment before us: SQS dropped our copy as a duplicate (same
            # deduplication id) and answered with the first copy's id. Nothing extra was sent.
            outcome = "deduplicated_concurrent_redrive"
            text = (
                f"Dead letter {other.pk} was redriven by someone else a moment ago; SQS "
                f"dropped this second copy as a duplicate (message {new_message_id})."
            )
        else:
            outcome = "published_after_concurrent_action"
            text = (
                f"Dead letter {other.pk} was {other.status} by someone else while this redrive "
                f"was being published: message {new_message_id} was sent anyway and the worker "
                "will apply it (processor events are deduplicated by id). Check the payment."
            )
        _audit_unchanged(
            other,
            TriageActionKind.REDRIVE,
            user=user,
            note=note,
            details={**details, "outcome": outcome},
            bulk_job=bulk_job,
        )
        logger.error("%s", text, extra={"payment_id": other.group_id})
        raise DeadLetterNotOpen(other, "redriven", detail=text) from exc
    return _release_if_last(closed, action, user=user, note=note, bulk_job=bulk_job)


def dead_letter_resolve(
    *, dead_letter: DeadLetter, user, note: str, bulk_job: BulkTriageJob | None = None
) -> ActionResult:
    """Mark it resolved (fixed elsewhere): nothing is published or applied for the message
    itself; the payment's hold is released if this was its last open dead letter."""
    return _close_without_publishing(
        dead_letter,
        user,
        note,
        TriageActionKind.RESOLVE,
        DeadLetterStatus.RESOLVED,
        "resolved",
        bulk_job=bulk_job,
    )


def dead_letter_discard(
    *, dead_letter: DeadLetter, user, note: str, bulk_job: BulkTriageJob | None = None
) -> ActionResult:
    """Mark it discarded: the message is never applied; the body and history stay for audit;
    the payment's hold is released if this was its last open dead letter."""
    return _close_without_publishing(
        dead_letter,
        user,
        note,
        TriageActionKind.DISCARD,
        DeadLetterStatus.DISCARDED,
        "discarded",
        bulk_job=bulk_job,
    )


def _close_without_publishing(
    dead_letter: DeadLetter,
    user,
    note: str,
    kind: str,
    status: str,
    verb: str,
    *,
    bulk_job: BulkTriageJob | None = None,
) -> ActionResult:
    note = _note_clean(note)
    _check_allowed(user)
    closed, action = _close(
        dead_letter_id=dead_letter.pk,
        user=user,
        note=note,
        kind=kind,
        status=status,
        verb=verb,
        details={"outcome": verb},
        bulk_job=bulk_job,
    )
    return _release_if_last(closed, action, user=user, note=note, bulk_job=bulk_job)


ACTIONS = {
    "redrive": dead_letter_redrive,
    "resolve": dead_letter_resolve,
    "discard": dead_letter_discard,
}


def _release_if_last(
    dead_letter: DeadLetter,
    action: TriageAction,
    *,
    user,
    note: str,
    bulk_job: BulkTriageJob | None = None,
):
    result = ActionResult(dead_letter=dead_letter, action=action)
    hold = payment_active_hold(dead_letter.group_id)
    if hold is None:
        result.release_note = "The payment has no active hold."
        return result
    blockers = hold_release_blockers(dead_letter.group_id)
    if blockers:
        result.release_note = "The payment's hold stays: " + "; ".join(blockers) + "."
        return result
    try:
        result.released = _hold_release_audited(
            dead_letter, hold, user=user, note=note, bulk_job=bulk_job
        )
    except HoldReleaseFailed as exc:
        result.release_failed = True
        result.release_note = str(exc)
    return result


def _hold_release_audited(
    dead_letter: DeadLetter,
    hold: PaymentHold,
    *,
    user,
    note: str,
    bulk_job: BulkTriageJob | None = None,
) -> int:
    """Release the hold through ``callbacks.services.hold_release`` and audit it either way."""
    try:
        sent = hold_release(
            payment_id=dead_letter.group_id, released_by=user.get_username(), note=note
        )
    except sqs.QueueUnavailable as exc:
        _audit_unchanged(
            dead_letter,
            TriageActionKind.RELEASE_HOLD,
            user=user,
            note=note,
            details={"outcome": "release_failed", "hold_id": hold.pk, "error": str(exc)[:2000]},
            bulk_job=bulk_job,
        )
        logger.error("release of hold %s failed: %s", hold.pk, exc)
        raise HoldReleaseFailed(
            f"The hold on payment {dead_letter.group_id} could not be released: {exc}. Its "
            "parked messages stay parked (nothing was lost); use “Release hold” on this dead "
            "letter when the queue is back."
        ) from exc
    with transaction.atomic():
        _audit_unchanged(
            dead_letter,
            TriageActionKind.RELEASE_HOLD,
            user=user,
            note=note,
            details={"outcome": "released", "hold_id": hold.pk, "republished": sent},
            bulk_job=bulk_job,
        )
        _log_entry(user, dead_letter, f"release_hold: {sent} parked message(s) republished")
    return sent


def dead_letter_hold_release(*, dead_letter: DeadLetter, user, note: str) -> int:
    """Release the payment's hold from a closed dead letter (when the automatic release after
    its action failed or was blocked then). Refused while anything still blocks it."""
    note = _note_clean(note)
    _check_allowed(user)
    current = DeadLetter.objects.get(pk=dead_letter.pk)
    if current.status == DeadLetterStatus.OPEN:
        raise TriageError(
            f"Dead letter {current.pk} is still open: redrive, resolve or discard it; its hold "
            "is released then."
        )
    hold = payment_active_hold(current.group_id)
    if hold is None:
        raise TriageError(f"Payment {current.group_id} has no active hold to release.")
    blockers = hold_release_blockers(current.group_id)
    if blockers:
        raise TriageError("The hold cannot be released yet: " + "; ".join(blockers) + ".")
    return _hold_release_audited(current, hold, user=user, note=note)


@dataclass
class BulkResult:
    done: list[ActionResult] = field(default_factory=list)
    refused: list[tuple[int, str]] = field(default_factory=list)  # (dead letter id, reason)


def dead_letters_act(*, action: str, dead_letter_ids: list[int], user, note: str) -> BulkResult:
    """Apply one action to exactly these dead letters, each in its own transaction (one
    failure does not undo the others); report what was done and what was refused and why."""
    if action not in ACTIONS:
        raise ValueError(f"unknown triage action {action!r}; use one of {', '.join(ACTIONS)}")
    note = _note_clean(note)
    _check_allowed(user)
    service = ACTIONS[action]
    result = BulkResult()
    dead_letters = {d.pk: d for d in DeadLetter.objects.filter(pk__in=dead_letter_ids)}
    for pk in dead_letter_ids:
        dead_letter = dead_letters.get(pk)
        if dead_letter is None:
            result.refused.append((pk, f"dead letter {pk} does not exist"))
            continue
        try:
            result.done.append(service(dead_letter=dead_letter, user=user, note=note))
        except TriageError as exc:
            result.refused.append((pk, str(exc)))
    return result
