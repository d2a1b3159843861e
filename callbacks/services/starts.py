"""The start of an attempt: recorded, committed, before any of the message's work runs.

One statement starts the common case, for one message (``queue_message_start``) or for a
batch's group heads (``queue_messages_start_batch``), built by ``_start_sql``: it inserts a
message seen for the first time, or counts one more attempt of an unfinished one that comes
back, unless the payment is on hold or an earlier message of its group is unfinished. Its
columns and values come from ``QueueMessage._meta`` and an unsaved instance
(``queue_message_new``), as the ORM's own insert takes them, so a column added to the model is
written by both starts alike (tests/callbacks/test_services_start.py holds them to that).

The ORM's locking path (``_queue_message_start``) is left only for what the statement leaves
out, each needing a decision of its own: a payment on hold (the message is parked, unless it
is one meant to end the hold), a redrive (its original no longer counts as unfinished), a gap
(an earlier message of the group unfinished: the RedrivePolicy took it away, so the payment
goes on hold), and a redelivery of a finished message. The statement is PostgreSQL's; on
another database (SQLite, the quick start) every start takes the ORM path.
"""

import enum
import json
import logging
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime
from functools import cache

from django.db import IntegrityError, connection, connections, models, transaction
from django.utils import timezone

from callbacks.models import (
    FINISHED_STATUSES,
    UNFINISHED_STATUSES,
    HoldKind,
    ParkedMessage,
    PaymentHold,
    QueueMessage,
    QueueMessageStatus,
)
from callbacks.services.holds import hold_create, hold_passes
from callbacks.services.republish import (
    redrive_original,
    released_by_round,
    released_original_id,
)
from callbacks.sqs import ReceivedMessage
from payments.kernel import propagation

logger = logging.getLogger(__name__)


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
    if _start_statement_runs_here() and not redrive_original(message):
        row = queue_message_new(message, timezone.now(), attempts=1)
        started = _start([row], store_bodies=True)
        if started:
            return StartDecision(StartAction.PROCESS, started[0])
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
    per-message ``queue_message_start`` does. It is the per-message start's statement
    (``_start_sql``) with a row per message.

    It takes only the common case, which it can decide in bulk: a message whose payment has no
    active hold and with nothing unfinished before it in its group, that is not a redrive. A
    message it leaves out (finished before, held, behind an unfinished one, a redrive, a body
    the database would refuse) gets no row change and is not returned: the caller starts it
    with ``queue_message_start``, which makes every other decision. Give at most one message
    per group (the batch's group heads): the checks do not see each other's rows.

    The body is not stored: these are messages whose payload the work records itself (processor
    events in the payment's event log). A failure writes it with the error row
    (``processing_error_record``), so a message that fails or is dead-lettered keeps it.
    """
    messages = [m for m in messages if not redrive_original(m) and _storable_body(m)]
    if not messages:
        return {}
    now = timezone.now()
    rows = [queue_message_new(message, now, attempts=1) for message in messages]
    return {row.message_id: row for row in _start(rows, store_bodies=False)}


def _start_statement_runs_here() -> bool:
    return connection.vendor == "postgresql"


def start_fields() -> list[models.Field]:
    """The columns a start writes: every concrete field of QueueMessage but its auto key."""
    return [f for f in QueueMessage._meta.concrete_fields if not isinstance(f, models.AutoField)]


_BODY_FIELDS = ("body", "raw_body")

# The first condition of a start that is its own transaction: ``synchronous_commit`` off for that
# transaction only (``set_config``'s ``is_local``); an uncorrelated subquery, run once before
# any row is written.
_ASYNCHRONOUS_COMMIT = "(SELECT set_config('synchronous_commit', 'off', true)) = 'off' AND "


@cache
def _start_sql(rows: int, vendor: str, *, asynchronous: bool = False) -> str:
    """The start of ``rows`` messages in one statement; its parameters are each row's values
    of ``start_fields()``, in order, and nothing else.

    Inserts each row unless its payment has an active hold or an earlier message of its group
    is unfinished; a message already recorded and unfinished instead counts one more attempt
    (its other columns are left as they are: a failed one keeps the body written with its
    error). Returns a row for each message started: a finished one, or one held or behind an
    unfinished one, returns none. Built once per row count.

    ``asynchronous`` (only for a statement that is its own transaction): its commit does not
    wait for the WAL flush (``synchronous_commit`` off for that transaction alone, set by the
    statement itself, so no round trip more). See ``_start``."""
    quote = connection.ops.quote_name
    table = quote(QueueMessage._meta.db_table)
    holds = quote(PaymentHold._meta.db_table)
    fields = start_fields()
    columns = ", ".join(quote(f.column) for f in fields)
    row = "(" + ", ".join(f"CAST(%s AS {f.cast_db_type(connection)})" for f in fields) + ")"
    # Statuses are the model's own constants, written into the statement so that its only
    # parameters are the rows' values.
    unfinished = ", ".join(f"'{status}'" for status in UNFINISHED_STATUSES)
    return (
        f"INSERT INTO {table} ({columns}) "  # noqa: S608
        f"SELECT {', '.join(f'v.{quote(f.column)}' for f in fields)} "
        f"FROM (VALUES {', '.join([row] * rows)}) AS v ({columns}) "
        f"WHERE {_ASYNCHRONOUS_COMMIT if asynchronous else ''}"
        f"NOT EXISTS (SELECT 1 FROM {holds} h WHERE h.payment_id = v.payment_id "
        "AND h.released_at IS NULL) "
        f"AND NOT EXISTS (SELECT 1 FROM {table} q WHERE v.sequence_number <> '' "
        "AND q.group_id = v.group_id AND q.sequence_number < v.sequence_number "
        f"AND q.status IN ({unfinished}) AND q.message_id <> v.message_id) "
        f"ON CONFLICT (message_id) DO UPDATE SET attempts = {table}.attempts + 1, "
        "status = EXCLUDED.status, last_started_at = EXCLUDED.last_started_at, "
        f"updated_at = EXCLUDED.updated_at WHERE {table}.status IN ({unfinished}) "
        "RETURNING id, message_id, attempts, first_started_at"
    )


def _start(rows: list[QueueMessage], *, store_bodies: bool) -> list[QueueMessage]:
    """Run ``_start_sql`` for the unsaved records ``rows``; return those started, as saved
    records (an unfinished one that came back with its attempts and first start counted).

    Each value is the one the ORM's insert would write (defaults, ``auto_now``, adaptation);
    without ``store_bodies`` the rows store no body, though the records keep theirs (for a
    failure to write). Autocommitted, or in a savepoint inside a caller's transaction, so that
    an error (a body the database refuses) leaves that transaction usable.

    Autocommitted, its commit does not wait for the WAL to reach the disk (``_start_sql``'s
    ``asynchronous``): the start must outlive the worker, which a commit does at once, visible
    to every session whether or not it was flushed; only a crash of PostgreSQL itself in the
    next moments (the WAL writer flushes within ``wal_writer_delay``, and the batch's own
    commit flushes it first) could lose it, and the worker counts no attempt cut off by a
    database outage anyway (``queue_messages_interrupted``). A flush per batch less: the
    start was the second commit, and the second fsync, of every batch. Inside a caller's
    transaction it is left alone: the setting would last for that whole transaction."""
    fields = start_fields()
    # The thread's connection itself, not the proxy, which looks it up again on every attribute
    # read: a batch's start adapts some two hundred values.
    db = connections[connection.alias]
    params = [
        f.get_default()
        if not store_bodies and f.attname in _BODY_FIELDS
        else f.get_db_prep_save(f.pre_save(row, add=True), db)
        for row in rows
        for f in fields
    ]
    inside = db.in_atomic_block
    sql = _start_sql(len(rows), db.vendor, asynchronous=not inside)
    with transaction.atomic(using=db.alias) if inside else nullcontext():
        with db.cursor() as cursor:
            cursor.execute(sql, params)
            returned = cursor.fetchall()
    by_id = {row.message_id: row for row in rows}
    started = []
    for pk, message_id, attempts, first_started_at in returned:
        queue_message = by_id[message_id]
        queue_message.pk = pk
        queue_message.attempts = attempts
        queue_message.first_started_at = first_started_at
        queue_message._state.adding = False
        queue_message._state.db = db.alias
        started.append(queue_message)
    return started


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


def queue_message_new(message: ReceivedMessage, now: datetime, *, attempts: int) -> QueueMessage:
    """The (unsaved) record of a message seen for the first time: every start writes this."""
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
    """The ORM's locking path: every decision the one statement leaves out (see the module)."""
    now = timezone.now()
    with transaction.atomic():
        queue_message = (
            QueueMessage.objects.select_for_update().filter(message_id=message.message_id).first()
        )
        if queue_message is not None and queue_message.status in FINISHED_STATUSES:
            return StartDecision(StartAction.FINISHED, queue_message)
        if queue_message is None:
            queue_message = queue_message_new(message, now, attempts=0)

        hold = (
            PaymentHold.objects.select_for_update()
            .filter(payment_id=message.payment_id, released_at__isnull=True)
            .first()
        )
        if hold is not None and not hold_passes(message, hold):
            return message_park(message, queue_message, hold, now)

        redrive_of = redrive_original(message)
        if redrive_of:
            # The original left the queue (dead-lettered by us, or moved by the RedrivePolicy
            # while our record still says it is running): it is not an earlier message to wait
            # for, this redrive replaces it.
            queue_message_mark_redrive_policy_dead_letter(message_id=redrive_of, now=now)

        earlier = _earlier_unfinished(message)
        if earlier is not None:
            hold = _hold_for_vanished(message, earlier, hold, now)
            return message_park(message, queue_message, hold, now)

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
        hold = hold_create(
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


def message_park(
    message: ReceivedMessage, queue_message: QueueMessage, hold: PaymentHold, now: datetime
) -> StartDecision:
    """Park ``message`` behind ``hold`` (in the start's or the deferral's transaction): its
    record finishes as parked, and a ParkedMessage keeps it in its place in the line."""
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
    if redrive_original(message):
        # A person's redrive of the message the hold waits for: it heads the line (an outage
        # may defer it), however late its own sequence number.
        order_key = ""
    original_id = released_original_id(message.deduplication_id)
    if original_id:
        # A copy sent by the release of a hold, parked again: because a new hold superseded
        # that one, it keeps its original place among the parked messages; because the same
        # hold's release started over, its own row waits again, unsent, where it was.
        original = ParkedMessage.objects.filter(message_id=original_id).first()
        if original is not None:
            if original.hold_id == hold.pk and not original.republished_message_id:
                # The original is parked here and unsent: one row is enough.
                return StartDecision(StartAction.PARKED, queue_message, hold)
            released = released_by_round(message.deduplication_id)
            if original.hold_id == hold.pk and released and released[1] < hold.release_round:
                # Sent by an earlier round of this hold's release: the next round sends it
                # again, with a deduplication id of its own.
                ParkedMessage.objects.filter(pk=original.pk).update(
                    republished_message_id="", released_at=None
                )
                return StartDecision(StartAction.PARKED, queue_message, hold)
            order_key = original.sequence_number
    ParkedMessage.objects.create(
        hold=hold,
        payment_id=message.payment_id,
        message_id=message.message_id,
        sequence_number=order_key,
        kind=message.kind[:64],
        body=message.body if message.body is not None else {"raw_body": message.raw_body},
        carried=propagation.carried(message.message_attributes),
        arrived_at=message.enqueued_at,
    )
    return StartDecision(StartAction.PARKED, queue_message, hold)
