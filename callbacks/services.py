"""Writes of the queue layer: message starts, failures, dead letters, payment holds, releases.

Each service owns its transaction, except ``queue_message_complete`` and
``queue_messages_complete``, which must commit in the caller's transaction together with the
messages' work. Services whose names end in ``_now`` or
that document a send act on SQS immediately and are never called inside a transaction.
"""

import enum
import json
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import IntegrityError, connection, transaction
from django.db.models import CharField, Exists, F, OuterRef
from django.db.models.functions import Cast
from django.utils import timezone

from callbacks import conf, sqs
from callbacks.models import (
    FINISHED_STATUSES,
    UNFINISHED_STATUSES,
    HoldKind,
    ParkedMessage,
    PaymentHold,
    ProcessingError,
    QueueMessage,
    QueueMessageStatus,
)
from callbacks.sqs import ReceivedMessage
from payments.locks import single_flight
from payments.models import AttemptOutcome, ProcessorAttempt
from payments.retention import batched_delete, id_bound

logger = logging.getLogger(__name__)

# Keys the queue layer adds to a message body; stripped before a body is republished.
DEAD_LETTER_KEY = "dead_letter"
REDRIVE_KEY = "redrive"
RELEASE_MARK = ":release:"


def storable_text(raw: str) -> str:
    """``raw`` with what PostgreSQL's text cannot hold escaped: NUL as ``\\x00``, an unpaired
    surrogate as ``\\udxxx``. Everything else is kept as it is, readable."""
    return raw.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")


class StartAction(enum.StrEnum):
    PROCESS = "process"  # do its work
    FINISHED = "finished"  # a redelivery after a crash between commit and delete: delete it
    PARKED = "parked"  # its payment is on hold: kept in ParkedMessage, delete it


@dataclass(frozen=True)
class StartDecision:
    """What to do with a received message, and its record."""

    action: StartAction
    queue_message: QueueMessage
    hold: PaymentHold | None = None


def queue_message_start(*, message: ReceivedMessage) -> StartDecision:
    """Record the start of an attempt, in its own committed transaction, before any work.

    In the same transaction: a payment on hold gets the message parked instead; and an earlier
    message of the group that our records show unfinished means SQS's RedrivePolicy took it
    away (it crashed workers until its receive count ran out), so the payment goes on hold and
    this message is parked rather than applied ahead of it.
    """
    started = _queue_message_start_fast(message)
    if started is not None:
        return started
    try:
        return _queue_message_start(message)
    except IntegrityError:
        # Another worker inserted the same message id first (its visibility ran out while a
        # first worker was still starting it): read the row it wrote.
        return _queue_message_start(message)


def queue_messages_start_batch(*, messages: list[ReceivedMessage]) -> dict[str, QueueMessage]:
    """Record the start of an attempt of every message given, in ONE autocommitted statement,
    before any of their work runs; returns the records of those started, by message id.

    This is what makes the attempt count survive a SIGKILL at any later point: the statement has
    committed before the first handler runs, so a process killed during the work, between the
    work's savepoints, or before their commit has already counted the attempt, as the
    per-message ``queue_message_start`` does. One multi-row ``INSERT ... ON CONFLICT DO UPDATE
    SET attempts = attempts + 1 ... RETURNING`` inserts new messages with one attempt and counts
    another for an unfinished one that comes back.

    It takes only the common case, which it can decide in bulk: a message whose payment has no
    active hold and with nothing unfinished before it in its group (the same questions the
    per-message fast path asks), that is not a redrive. A message it leaves out (finished
    before, held, behind an unfinished one, a redrive, a body the database would refuse) gets
    no row change and is not returned: the caller starts it with ``queue_message_start``, which
    makes every other decision. Give at most one message per group (the batch's group heads):
    the checks do not see each other's rows.

    The body is not stored: these are messages whose payload the work records itself (processor
    events in the payment's event log). A failure writes it with the error row
    (``processing_error_record``), so a message that fails or is dead-lettered keeps it.
    """
    messages = [m for m in messages if not _redrive_original(m) and _storable_body(m)]
    if not messages:
        return {}
    now = timezone.now()
    unfinished = [str(s) for s in UNFINISHED_STATUSES]
    params: list = [now, now, str(QueueMessageStatus.IN_PROGRESS), now]
    for m in messages:
        params += [
            m.message_id,
            m.kind[:64],
            m.group_id,
            m.payment_id,
            m.deduplication_id,
            m.sequence_number,
            m.enqueued_at,
        ]
    with connection.cursor() as cursor:
        cursor.execute(_start_batch_sql(len(messages)), [*params, *unfinished, *unfinished])
        returned = cursor.fetchall()
    by_id = {m.message_id: m for m in messages}
    started = {}
    for pk, message_id, attempts, first_started_at in returned:
        message = by_id[message_id]
        queue_message = _queue_message_new(message, first_started_at, attempts=attempts)
        queue_message.pk = pk
        queue_message.last_started_at = now
        queue_message._state.adding = False
        queue_message._state.db = connection.alias
        started[message_id] = queue_message
    return started


def _start_batch_sql(rows: int) -> str:
    """The bulk start's one statement for ``rows`` messages (see queue_messages_start_batch).
    Parameters: first_started_at, last_started_at, status, updated_at; 7 per message; the two
    unfinished statuses twice."""
    quote = connection.ops.quote_name
    table = quote(QueueMessage._meta.db_table)
    holds = quote(PaymentHold._meta.db_table)
    values = ", ".join(["(%s, %s, %s, %s, %s, %s, %s::timestamptz)"] * rows)
    return (
        f"INSERT INTO {table} (message_id, kind, group_id, payment_id, deduplication_id, "  # noqa: S608
        "sequence_number, body, raw_body, enqueued_at, first_started_at, last_started_at, "
        "attempts, status, outcome, last_error_class, updated_at) "
        "SELECT v.message_id, v.kind, v.group_id, v.payment_id, v.deduplication_id, "
        "v.sequence_number, NULL, '', v.enqueued_at, %s, %s, 1, %s, '', '', %s "
        f"FROM (VALUES {values}) AS v(message_id, kind, group_id, payment_id, deduplication_id, "
        "sequence_number, enqueued_at) "
        f"WHERE NOT EXISTS (SELECT 1 FROM {holds} h WHERE h.payment_id = v.payment_id "
        "AND h.released_at IS NULL) "
        f"AND NOT EXISTS (SELECT 1 FROM {table} q WHERE v.sequence_number <> '' "
        "AND q.group_id = v.group_id AND q.sequence_number < v.sequence_number "
        "AND q.status IN (%s, %s) AND q.message_id <> v.message_id) "
        f"ON CONFLICT (message_id) DO UPDATE SET attempts = {table}.attempts + 1, "
        "status = EXCLUDED.status, last_started_at = EXCLUDED.last_started_at, "
        f"updated_at = EXCLUDED.updated_at WHERE {table}.status IN (%s, %s) "
        "RETURNING id, message_id, attempts, first_started_at"
    )


def _storable_body(message: ReceivedMessage) -> bool:
    """Whether PostgreSQL's jsonb would take the body (no NaN or infinity, no NUL, no unpaired
    surrogate). The bulk start stores no body, so it would not notice one it refuses; such a
    message takes the per-message path, which keeps it as text and sends it to a person."""
    if message.body is None:
        return False
    try:
        text = json.dumps(message.body, allow_nan=False, ensure_ascii=False)
        text.encode("utf-8")
    except (ValueError, UnicodeError):
        return False
    return "\\u0000" not in text


def _queue_message_start_fast(message: ReceivedMessage) -> StartDecision | None:
    """The common case in two statements and no explicit transaction: a message seen for the
    first time, for a payment with no hold and nothing unfinished ahead of it in its group.

    One query asks all three questions; if any answer is not the common one (a redelivery, a
    hold, an earlier unfinished message, a redrive), return None and let the full locking path
    decide. The insert then records the start; a concurrent insert of the same message id
    (IntegrityError) also falls back to the full path.
    """
    if _redrive_original(message):
        return None
    qm = QueueMessage._meta
    hold = PaymentHold._meta
    quote = connection.ops.quote_name
    unfinished = [str(s) for s in UNFINISHED_STATUSES]
    sql = (
        f"SELECT EXISTS (SELECT 1 FROM {quote(qm.db_table)} WHERE message_id = %s), "  # noqa: S608
        f"EXISTS (SELECT 1 FROM {quote(hold.db_table)} "
        "WHERE payment_id = %s AND released_at IS NULL)"
    )
    params: list = [message.message_id, message.payment_id]
    if message.sequence_number:
        sql += (
            f", EXISTS (SELECT 1 FROM {quote(qm.db_table)} WHERE group_id = %s "
            "AND sequence_number < %s AND status IN (%s, %s) AND message_id <> %s)"
        )
        params += [message.group_id, message.sequence_number, *unfinished, message.message_id]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        if any(cursor.fetchone()):
            return None
    queue_message = _queue_message_new(message, timezone.now(), attempts=1)
    try:
        if connection.in_atomic_block:
            with transaction.atomic():  # a savepoint, so a lost race leaves the caller usable
                queue_message.save(force_insert=True)
        else:
            queue_message.save(force_insert=True)  # one autocommitted statement
    except IntegrityError:
        return None
    return StartDecision(StartAction.PROCESS, queue_message)


def _queue_message_new(message: ReceivedMessage, now: datetime, *, attempts: int) -> QueueMessage:
    """The (unsaved) record of a message seen for the first time."""
    return QueueMessage(
        message_id=message.message_id,
        kind=message.kind[:64],
        group_id=message.group_id,
        payment_id=message.payment_id,
        deduplication_id=message.deduplication_id,
        sequence_number=message.sequence_number,
        body=message.body,
        raw_body="" if message.body is not None else message.raw_body,
        enqueued_at=message.enqueued_at,
        first_started_at=now,
        last_started_at=now,
        attempts=attempts,
        status=QueueMessageStatus.IN_PROGRESS,
    )


def _queue_message_start(message: ReceivedMessage) -> StartDecision:
    now = timezone.now()
    with transaction.atomic():
        queue_message = (
            QueueMessage.objects.select_for_update().filter(message_id=message.message_id).first()
        )
        if queue_message is not None and queue_message.status in FINISHED_STATUSES:
            return StartDecision(StartAction.FINISHED, queue_message)
        if queue_message is None:
            queue_message = _queue_message_new(message, now, attempts=0)

        hold = (
            PaymentHold.objects.select_for_update()
            .filter(payment_id=message.payment_id, released_at__isnull=True)
            .first()
        )
        if hold is not None and not _passes_hold(message, hold):
            return _park(message, queue_message, hold, now)

        redrive_of = _redrive_original(message)
        if redrive_of:
            # The original left the queue (dead-lettered by us, or moved by the RedrivePolicy
            # while our record still says it is running): it is not an earlier message to wait
            # for, this redrive replaces it.
            queue_message_mark_redrive_policy_dead_letter(message_id=redrive_of, now=now)

        earlier = _earlier_unfinished(message)
        if earlier is not None:
            hold = _hold_for_vanished(message, earlier, hold, now)
            return _park(message, queue_message, hold, now)

        queue_message.attempts += 1
        queue_message.status = QueueMessageStatus.IN_PROGRESS
        queue_message.last_started_at = now
        if queue_message.pk is None:
            queue_message.save(force_insert=True)
        else:
            queue_message.save(
                update_fields=["attempts", "status", "last_started_at", "updated_at"]
            )
    return StartDecision(StartAction.PROCESS, queue_message, hold)


def _earlier_unfinished(message: ReceivedMessage) -> QueueMessage | None:
    """The group's first message before this one that our records show unfinished."""
    if not message.sequence_number:
        return None
    return (
        QueueMessage.objects.filter(
            group_id=message.group_id,
            sequence_number__lt=message.sequence_number,
            status__in=UNFINISHED_STATUSES,
        )
        .exclude(message_id=message.message_id)
        .order_by("sequence_number")
        .first()
    )


def _hold_for_vanished(
    message: ReceivedMessage, earlier: QueueMessage, hold: PaymentHold | None, now: datetime
) -> PaymentHold:
    """``earlier`` is unfinished but SQS hands out ``message`` after it: the RedrivePolicy took
    it away (it crashed workers until its receive count ran out). Mark it so and hold the
    payment (or keep its active hold); call inside the start's transaction."""
    queue_message_mark_redrive_policy_dead_letter(message_id=earlier.message_id, now=now)
    if hold is None:
        hold = _hold_create(
            kind=HoldKind.TRIAGE,
            payment_id=message.payment_id,
            reason=(
                f"Message {earlier.message_id} ({earlier.kind or 'unknown kind'}, "
                f"{earlier.attempts} attempt(s) started) never finished and left the "
                "queue: SQS's RedrivePolicy moved it to the dead-letter queue after it "
                f"crashed the worker; message {message.message_id} arrived after it."
            ),
            caused_by=earlier,
        )
    elif hold.kind != HoldKind.TRIAGE:
        # It held a submission for the processor; now a person is needed too.
        hold.kind = HoldKind.TRIAGE
        hold.reason = f"{hold.reason}\nMessage {earlier.message_id} left the queue unfinished."
        hold.save(update_fields=["kind", "reason"])
    logger.error(
        "payment %s held: earlier message %s vanished unfinished (RedrivePolicy)",
        message.payment_id,
        earlier.message_id,
        extra={"payment_id": message.payment_id, "message_id": earlier.message_id},
    )
    return hold


def queue_message_mark_redrive_policy_dead_letter(
    *, message_id: str, now: datetime | None = None
) -> bool:
    """Record that SQS's RedrivePolicy moved an unfinished message to the dead-letter queue.

    The worker never saw it fail (it crashed or hung past the visibility timeout), so our
    record still says it is running; it has left the queue, so it must no longer count as
    unfinished or block the messages behind it. A record already finished is left as it is.
    True when a record changed.
    """
    now = now or timezone.now()
    changed = QueueMessage.objects.filter(
        message_id=message_id, status__in=UNFINISHED_STATUSES
    ).update(
        status=QueueMessageStatus.DEAD_LETTERED,
        outcome="redrive_policy",
        finished_at=now,
        updated_at=now,
    )
    return changed > 0


def _passes_hold(message: ReceivedMessage, hold: PaymentHold) -> bool:
    """A held payment still takes the messages meant to end the hold: the parked ones its own
    release republishes, and a redrive of a dead letter (a person chose to apply it now; it is
    the head of the line, since a dead letter is what stopped the payment)."""
    if released_original_id(message.deduplication_id):
        return message.deduplication_id.rpartition(RELEASE_MARK)[2] == str(hold.pk)
    return bool(_redrive_original(message))


def _redrive_original(message: ReceivedMessage) -> str:
    redrive = (message.body or {}).get(REDRIVE_KEY)
    if isinstance(redrive, dict) and isinstance(redrive.get("original_message_id"), str):
        return redrive["original_message_id"]
    return ""


def _park(
    message: ReceivedMessage, queue_message: QueueMessage, hold: PaymentHold, now: datetime
) -> StartDecision:
    queue_message.status = QueueMessageStatus.PARKED
    queue_message.outcome = "parked"
    queue_message.finished_at = now
    queue_message.last_started_at = now
    if queue_message.pk is None:
        queue_message.save(force_insert=True)
    else:
        queue_message.save(
            update_fields=["status", "outcome", "finished_at", "last_started_at", "updated_at"]
        )
    order_key = message.sequence_number
    if _redrive_original(message):
        # A person's redrive of the message the hold waits for: it heads the line (an outage
        # may defer it), however late its own sequence number.
        order_key = ""
    original_id = released_original_id(message.deduplication_id)
    if original_id:
        # A copy sent by the release of an earlier hold, parked again because a new hold
        # superseded that one: it keeps its original place among the parked messages.
        original = ParkedMessage.objects.filter(message_id=original_id).first()
        if original is not None:
            if original.hold_id == hold.pk and not original.republished_message_id:
                # The original is parked here and unsent: one row is enough.
                return StartDecision(StartAction.PARKED, queue_message, hold)
            order_key = original.sequence_number
    ParkedMessage.objects.create(
        hold=hold,
        payment_id=message.payment_id,
        message_id=message.message_id,
        sequence_number=order_key,
        kind=message.kind[:64],
        body=message.body if message.body is not None else {"raw_body": message.raw_body},
        arrived_at=message.enqueued_at,
    )
    return StartDecision(StartAction.PARKED, queue_message, hold)


def released_original_id(deduplication_id: str) -> str:
    """The parked message id a release copy was made from ("" for any other message)."""
    original, mark, _ = deduplication_id.rpartition(RELEASE_MARK)
    return original if mark else ""


def queue_message_complete(*, queue_message: QueueMessage, outcome: str) -> None:
    """Mark the message done. Call inside the transaction of its work so both commit together."""
    now = timezone.now()
    QueueMessage.objects.filter(pk=queue_message.pk).update(
        status=QueueMessageStatus.DONE, outcome=outcome[:32], finished_at=now, updated_at=now
    )
    queue_message.status = QueueMessageStatus.DONE
    queue_message.outcome = outcome
    queue_message.finished_at = now


def queue_messages_complete(*, done: list[tuple[QueueMessage, str]]) -> None:
    """Mark messages done, in one statement. Call inside the transaction of their work so the
    marks and the work commit together."""
    if not done:
        return
    now = timezone.now()
    table = connection.ops.quote_name(QueueMessage._meta.db_table)
    rows = ", ".join(["(%s::bigint, %s)"] * len(done))
    params: list = [str(QueueMessageStatus.DONE), now, now]
    for queue_message, outcome in done:
        params += [queue_message.pk, outcome[:32]]
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET status = %s, outcome = v.outcome, finished_at = %s, "  # noqa: S608
            f"updated_at = %s FROM (VALUES {rows}) AS v(id, outcome) WHERE {table}.id = v.id",
            params,
        )
    for queue_message, outcome in done:
        queue_message.status = QueueMessageStatus.DONE
        queue_message.outcome = outcome
        queue_message.finished_at = now


def processing_error_record(
    *,
    queue_message: QueueMessage,
    error_class: str,
    message: str,
    traceback: str,
    retryable: bool,
    delay_seconds: float | None,
) -> ProcessingError:
    """Write the failed attempt in its own transaction (the work's has already rolled back)
    and mark the message retrying."""
    with transaction.atomic():
        error = _processing_error_create(
            queue_message=queue_message,
            error_class=error_class,
            message=message,
            traceback=traceback,
            retryable=retryable,
            delay_seconds=delay_seconds,
        )
        QueueMessage.objects.filter(pk=queue_message.pk).update(
            status=QueueMessageStatus.RETRYING,
            last_error_class=error_class[:255],
            updated_at=timezone.now(),
            # A record started in bulk has no body yet: a failed message keeps its body for the
            # operator and for a redrive.
            body=queue_message.body,
            raw_body=queue_message.raw_body,
        )
    queue_message.status = QueueMessageStatus.RETRYING
    queue_message.last_error_class = error_class[:255]
    return error


def _processing_error_create(
    *,
    queue_message: QueueMessage,
    error_class: str,
    message: str,
    traceback: str,
    retryable: bool,
    delay_seconds: float | None,
) -> ProcessingError:
    """One row of the message's error history, numbered with its current attempt."""
    return ProcessingError.objects.create(
        queue_message=queue_message,
        payment_id=queue_message.payment_id,
        message_id=queue_message.message_id,
        attempt_number=queue_message.attempts,
        error_class=error_class[:255],
        message=message,
        traceback=traceback,
        retryable=retryable,
        delay_seconds=delay_seconds,
    )


def queue_message_defer(
    *,
    queue_message: QueueMessage,
    error_class: str = "",
    message: str = "",
    traceback: str = "",
    delay_seconds: float,
) -> ProcessingError | None:
    """Give back the attempt a message started while its dependency was down as a whole (the
    processor's circuit breaker is open, or it asked every caller to pause): the outage is not
    the message's fault and must not bring it closer to a dead letter.

    When a real call was made and failed (``error_class`` given), the failure stays in the
    error history, marked retryable with the pause as its delay; the attempt counter goes back
    by one in the same transaction, so ``attempts`` counts only attempts the message paid for.
    """
    error = None
    with transaction.atomic():
        if error_class:
            error = _processing_error_create(
                queue_message=queue_message,
                error_class=error_class,
                message=message,
                traceback=traceback,
                retryable=True,
                delay_seconds=delay_seconds,
            )
        QueueMessage.objects.filter(pk=queue_message.pk, attempts__gt=0).update(
            attempts=F("attempts") - 1,
            status=QueueMessageStatus.RETRYING,
            updated_at=timezone.now(),
            **({"last_error_class": error_class[:255]} if error_class else {}),
        )
    queue_message.attempts = max(0, queue_message.attempts - 1)
    queue_message.status = QueueMessageStatus.RETRYING
    return error


def message_defer(
    *, message: ReceivedMessage, queue_message: QueueMessage | None, reason: str
) -> StartDecision:
    """Take a submission the processor cannot take now (its breaker is open, or calls are
    paused) off the queue: park it, in its group's order, behind an outage hold of its
    payment, which the workers release when calls may flow. The caller deletes it from SQS.

    An outage may last hours; hidden in the queue, the message would be handed out again at
    every release or expiry, and each receive would bring it closer to the RedrivePolicy.
    Parked, it costs one receive however long the outage lasts, and the payment's later
    messages are parked behind it, so nothing overtakes it. A payment already on hold (for a
    person) keeps that hold: the submission waits behind it like any other message.
    """
    now = timezone.now()
    with transaction.atomic():
        if queue_message is None:
            queue_message = (
                QueueMessage.objects.select_for_update()
                .filter(message_id=message.message_id)
                .first()
            ) or _queue_message_new(message, now, attempts=0)
        if queue_message.status in FINISHED_STATUSES:
            return StartDecision(StartAction.FINISHED, queue_message)
        active = PaymentHold.objects.filter(
            payment_id=message.payment_id, released_at__isnull=True
        ).first()
        hold = payment_hold(
            payment_id=message.payment_id,
            reason=f"Submission waits for the processor: {reason}",
            kind=HoldKind.OUTAGE,
            # A copy its own hold's release just sent: that release may be about to mark the
            # copy's row sent and lift the hold, which would lose it; a new hold takes it.
            supersede=active is not None
            and bool(released_original_id(message.deduplication_id))
            and _passes_hold(message, active),
        )
        return _park(message, queue_message, hold, now)


def outage_holds_waiting() -> bool:
    return PaymentHold.objects.filter(kind=HoldKind.OUTAGE, released_at__isnull=True).exists()


def outage_holds_release(*, limit: int, trial: bool = False) -> int:
    """Release up to ``limit`` outage holds, oldest first: their parked messages go back to the
    queue in order. Returns how many messages were sent. One process at a time releases (a
    cluster-wide guard), so two workers do not send the same copies; SQS's deduplication would
    drop them anyway. Raises ``sqs.QueueUnavailable`` when the queue cannot be reached (the
    holds stay, for the next call).

    ``trial``: these are the breaker's trial calls, so payments that never failed at the
    processor go first: the oldest holds are those whose failing call opened the breaker, and
    a payment that fails on its own (a bad account) would fail the trial every time."""
    sent = 0
    with single_flight("callbacks.outage_holds_release") as acquired:
        if not acquired:
            return 0
        waiting = PaymentHold.objects.filter(kind=HoldKind.OUTAGE, released_at__isnull=True)
        if trial:
            failed_before = ProcessorAttempt.objects.annotate(
                payment_text=Cast("payment_id", CharField())
            ).filter(payment_text=OuterRef("payment_id"), outcome=AttemptOutcome.RETRYABLE)
            waiting = waiting.annotate(failed_before=Exists(failed_before))
        holds = list(waiting.order_by(*(["failed_before"] if trial else []), "id")[:limit])
        for hold in holds:
            sent += hold_release(
                payment_id=hold.payment_id,
                released_by="run_sqs_worker",
                note="the processor takes calls again",
                hold=hold,
            )
    if holds:
        logger.info("released %s outage hold(s): %s message(s) back on the queue", len(holds), sent)
    return sent


def dead_letter_body(
    *, queue_message: QueueMessage, error_class: str, error: str, now: datetime
) -> dict:
    body = dict(queue_message.body) if queue_message.body is not None else {}
    if queue_message.body is None:
        body["raw_body"] = queue_message.raw_body
    body[DEAD_LETTER_KEY] = {
        "original_message_id": queue_message.message_id,
        "attempts": queue_message.attempts,
        "error_class": error_class,
        "error": error[:2000],
        "first_started_at": queue_message.first_started_at.isoformat(),
        "dead_lettered_at": now.isoformat(),
    }
    return body


def message_dead_letter(*, queue_message: QueueMessage, error_class: str, error: str) -> str:
    """Move a message to the DLQ ourselves and put its payment on hold.

    Sends a copy to the DLQ first (deduplication id = the original message id, so a repeat after
    a crash is dropped by SQS), then marks the message dead-lettered and creates the hold in one
    transaction. The caller deletes the original from the main queue afterwards. Raises
    ``sqs.QueueUnavailable`` when the copy cannot be sent (nothing was changed then).
    Returns the DLQ copy's message id.
    """
    now = timezone.now()
    copy_id = sqs.send_message_now(
        body=dead_letter_body(
            queue_message=queue_message, error_class=error_class, error=error, now=now
        ),
        group_id=queue_message.group_id,
        deduplication_id=queue_message.message_id,
        url=sqs.dead_letter_queue_url(),
    )
    with transaction.atomic():
        QueueMessage.objects.filter(pk=queue_message.pk).update(
            status=QueueMessageStatus.DEAD_LETTERED,
            outcome="dead_lettered",
            finished_at=now,
            last_error_class=error_class[:255],
            updated_at=now,
            body=queue_message.body,  # kept for the operator (a bulk start stored none)
            raw_body=queue_message.raw_body,
        )
        payment_hold(
            payment_id=queue_message.payment_id,
            reason=(
                f"Message {queue_message.message_id} ({queue_message.kind or 'unknown kind'}) "
                f"was dead-lettered after {queue_message.attempts} attempt(s): "
                f"{error_class}: {error[:500]}"
            ),
            caused_by=queue_message,
        )
    queue_message.status = QueueMessageStatus.DEAD_LETTERED
    return copy_id


def payment_hold(
    *,
    payment_id: str,
    reason: str,
    caused_by: QueueMessage | None = None,
    kind: str = HoldKind.TRIAGE,
    supersede: bool = False,
) -> PaymentHold:
    """Put a payment on hold, or return its active hold (pointed at the newest cause).

    An outage hold that a person is now needed for (a message of it was dead-lettered)
    becomes a triage hold; a triage hold stays one whatever else comes. ``supersede``: the
    caller is a copy the active hold's release sent, which must wait again; the release may
    not have marked that copy's row sent yet, so the hold is superseded whatever its rows say.

    A payment has at most one active hold (a conditional unique constraint). When one exists
    and its release has not started (e.g. its redriven cause failed again), it stays and records
    the new cause. When its release is under way (some parked messages already republished), a
    republished message failed: the old hold is closed as superseded and a new one takes its
    unsent parked messages, so the copies still on the queue (marked for the old hold) are
    parked again, behind the failure, instead of being applied ahead of it.
    """
    payment_id = str(payment_id)
    with transaction.atomic():
        hold = (
            PaymentHold.objects.select_for_update()
            .filter(payment_id=payment_id, released_at__isnull=True)
            .first()
        )
        if hold is not None:
            if not supersede and not hold.parked.exclude(republished_message_id="").exists():
                changed = []
                if caused_by is not None and hold.caused_by_id != caused_by.pk:
                    hold.caused_by = caused_by
                    hold.reason = f"{hold.reason}\n{reason}"
                    changed += ["caused_by", "reason"]
                if kind == HoldKind.TRIAGE and hold.kind != HoldKind.TRIAGE:
                    hold.kind = HoldKind.TRIAGE
                    changed.append("kind")
                    if "reason" not in changed:
                        hold.reason = f"{hold.reason}\n{reason}"
                        changed.append("reason")
                if changed:
                    hold.save(update_fields=changed)
                return hold
            hold.released_at = timezone.now()
            hold.released_by = "run_sqs_worker"
            hold.save(update_fields=["released_at", "released_by"])
            new_hold = _hold_create(
                payment_id=payment_id, reason=reason, caused_by=caused_by, kind=kind
            )
            moved = ParkedMessage.objects.filter(hold=hold, republished_message_id="").update(
                hold=new_hold
            )
            hold.note = (
                f"Superseded by hold {new_hold.pk}: a message republished by this hold's "
                f"release failed; {moved} unsent parked message(s) moved there."
            )
            hold.save(update_fields=["note"])
            return new_hold
        try:
            with transaction.atomic():
                return _hold_create(
                    payment_id=payment_id, reason=reason, caused_by=caused_by, kind=kind
                )
        except IntegrityError:
            # A concurrent transaction created the active hold first: that one stands.
            return PaymentHold.objects.get(payment_id=payment_id, released_at__isnull=True)


def _hold_create(
    *, payment_id: str, reason: str, caused_by: QueueMessage | None, kind: str
) -> PaymentHold:
    hold = PaymentHold.objects.create(
        payment_id=payment_id, reason=reason, caused_by=caused_by, kind=kind
    )
    # An outage hold is routine (the workers release it); a triage hold needs a person.
    logger.log(
        logging.INFO if kind == HoldKind.OUTAGE else logging.ERROR,
        "payment %s put on %s hold: %s",
        payment_id,
        kind,
        reason,
        extra={"payment_id": payment_id, "hold_id": hold.pk, "hold_kind": kind},
    )
    return hold


def hold_release(
    *, payment_id, released_by: str, note: str, hold: PaymentHold | None = None
) -> int:
    """Republish a held payment's parked messages in arrival order, then lift the hold.

    Sends one message at a time so the queue keeps their order (group = payment id,
    deduplication id ``<message id>:release:<hold id>``, which also lets them through the
    still-active hold), and marks each parked row as it goes: a crash part-way resends only what
    was not marked, and a resend of a marked one is dropped by SQS's deduplication. The hold is
    lifted in a transaction that locks it and finds nothing left unpublished, so a message
    parked meanwhile is never stranded. If a republished message fails for good meanwhile, the
    worker supersedes the hold (see ``payment_hold``) and this release stops sending. Safe to
    call twice; returns how many this call sent. Raises ``sqs.QueueUnavailable`` if the queue
    cannot be reached (the hold then stays). Release after redriving the message that caused
    the hold, so that one is applied first.

    ``hold`` names one hold of the payment to release instead of its active one: a hold
    superseded meanwhile is then left alone (nothing sent, 0 returned).
    """
    if not released_by:
        raise ValueError("released_by is required: say who released the hold")
    payment_id = str(payment_id)
    if hold is None:
        hold = PaymentHold.objects.filter(payment_id=payment_id, released_at__isnull=True).first()
        if hold is None:
            return 0
    elif hold.payment_id != payment_id:
        raise ValueError(f"hold {hold.pk} belongs to payment {hold.payment_id}, not {payment_id}")
    sent = 0
    while True:
        while (row := hold.parked.filter(republished_message_id="").first()) is not None:
            if not parked_message_republish(row=row, hold=hold):
                return sent  # the hold was superseded or released meanwhile
            sent += 1
        with transaction.atomic():
            locked = PaymentHold.objects.select_for_update().get(pk=hold.pk)
            if locked.released_at is not None:
                return sent  # another call released it
            if hold.parked.filter(republished_message_id="").exists():
                continue  # parked while we were sending: send those too
            locked.released_at = timezone.now()
            locked.released_by = released_by[:255]
            locked.note = note
            locked.save(update_fields=["released_at", "released_by", "note"])
        logger.info(
            "hold %s on payment %s released by %s: %s message(s) republished",
            hold.pk,
            hold.payment_id,
            released_by,
            sent,
            extra={"payment_id": hold.payment_id, "hold_id": hold.pk},
        )
        return sent


def parked_message_republish(*, row: ParkedMessage, hold: PaymentHold) -> bool:
    """Send one parked message back to the main queue as part of ``hold``'s release and mark
    it; False (nothing sent) when the hold is no longer active or the row is no longer its."""
    if not PaymentHold.objects.filter(pk=hold.pk, released_at__isnull=True).exists():
        return False
    new_id = sqs.send_message_now(
        body=_republishable(row.body),
        group_id=row.payment_id,
        deduplication_id=f"{row.message_id}{RELEASE_MARK}{hold.pk}"[:128],
    )
    marked = ParkedMessage.objects.filter(pk=row.pk, hold=hold, republished_message_id="").update(
        republished_message_id=new_id, released_at=timezone.now()
    )
    return bool(marked)


def _republishable(body: dict) -> dict:
    return {k: v for k, v in body.items() if k not in (DEAD_LETTER_KEY, REDRIVE_KEY)}


def message_republish(
    *,
    deduplication_id: str,
    queue_message_id: int | None = None,
    body: dict | None = None,
    group_id: str | None = None,
    original_message_id: str = "",
) -> str:
    """Send a dead-lettered message back to the main queue now; return the new message id.

    Give either ``queue_message_id`` (a QueueMessage the worker recorded) or ``body`` and
    ``group_id`` (e.g. a message read from the DLQ). The body keeps its fields, loses the
    queue layer's annotations, and gains ``redrive.original_message_id``: the worker applies it
    although its payment's hold is still active (it is the message the hold waits for).
    """
    if not deduplication_id:
        raise ValueError("deduplication_id is required")
    if queue_message_id is not None:
        queue_message = QueueMessage.objects.get(pk=queue_message_id)
        if queue_message.body is None:
            raise ValueError(
                f"message {queue_message.message_id} has no JSON body; it cannot be republished"
            )
        body, group_id = queue_message.body, queue_message.group_id
        original_message_id = original_message_id or queue_message.message_id
    if not isinstance(body, dict) or not group_id:
        raise ValueError("give queue_message_id, or body (a JSON object) and group_id")
    dead_letter = body.get(DEAD_LETTER_KEY)
    if not original_message_id and isinstance(dead_letter, dict):
        original_message_id = dead_letter.get("original_message_id") or ""
    new_body = _republishable(body)
    if original_message_id:
        new_body[REDRIVE_KEY] = {
            "original_message_id": original_message_id,
            "republished_at": timezone.now().isoformat(),
        }
    return sqs.send_message_now(
        body=new_body, group_id=str(group_id), deduplication_id=deduplication_id[:128]
    )


def queue_messages_purge(
    *, older_than: timedelta | None = None, batch_size: int | None = None
) -> int:
    """Delete the records of messages finished cleanly before ``now - older_than`` (default:
    QUEUE_MESSAGE_RETENTION); returns how many went. Records with a processing error or behind
    a hold are kept: they are the error history a person may still need (ProcessingError and
    PaymentHold protect them; ``callbacks.retention`` purges them later, on its own terms).

    Deletes ``batch_size`` rows per transaction in id order, looking only below the first id
    started after the cutoff (``id_bound``), so a run over months of records holds no long
    lock, no huge transaction, and needs no index on ``finished_at``."""
    cutoff = timezone.now() - (older_than or conf.QUEUE_MESSAGE_RETENTION)
    bound = id_bound(QueueMessage, "first_started_at", cutoff)
    stale = QueueMessage.objects.filter(
        status=QueueMessageStatus.DONE, finished_at__lt=cutoff, pk__lt=bound or 0
    ).exclude(
        Exists(ProcessingError.objects.filter(queue_message=OuterRef("pk")))
        | Exists(PaymentHold.objects.filter(caused_by=OuterRef("pk")))
    )
    return batched_delete(stale, batch_size=batch_size)
