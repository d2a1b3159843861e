"""What becomes of a started attempt: done, failed (an error row, then a retry), deferred for
an outage, or dead-lettered.

``queue_message_complete`` and ``queue_messages_complete`` commit in the caller's transaction,
together with the messages' work; every other service here owns its transaction, and runs
after the work's has rolled back, so the record of a failure is never lost with it.
``message_dead_letter`` sends to SQS first and is never called inside a transaction.
"""

from datetime import datetime
from functools import cache

from django.db import connection, models, transaction
from django.db.models import F
from django.utils import timezone

from callbacks import sqs
from callbacks.models import (
    FINISHED_STATUSES,
    HoldKind,
    PaymentHold,
    ProcessingError,
    QueueMessage,
    QueueMessageStatus,
)
from callbacks.services.holds import hold_passes, outage_hold_reopen, payment_hold
from callbacks.services.republish import released_original_id
from callbacks.services.starts import (
    StartAction,
    StartDecision,
    message_park,
    queue_message_new,
)
from callbacks.sqs import ReceivedMessage
from payments.messages import dead_letter_marked


def queue_message_complete(*, queue_message: QueueMessage, outcome: str) -> None:
    """Mark the message done. Call inside the transaction of its work so both commit together."""
    now = timezone.now()
    sql, finished_at = _complete_sql()
    stamp = finished_at.get_db_prep_value(now, connection)
    params = [str(QueueMessageStatus.DONE), outcome[:32], stamp, stamp, queue_message.pk]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
    queue_message.status = QueueMessageStatus.DONE
    queue_message.outcome = outcome
    queue_message.finished_at = now


@cache
def _complete_sql() -> tuple[str, models.Field]:
    """The done mark's ``UPDATE`` (status, outcome, finished_at, updated_at; by id), written
    once: the ORM's own ``update()`` compiled it again for every message the worker finished
    on its own (every submission). And the field that adapts its times for the database."""
    meta = QueueMessage._meta
    quote = connection.ops.quote_name
    columns = [quote(meta.get_field(name).column) for name in _COMPLETE_FIELDS]
    sets = ", ".join(f"{column} = %s" for column in columns)
    sql = f"UPDATE {quote(meta.db_table)} SET {sets} WHERE {quote(meta.pk.column)} = %s"  # noqa: S608
    return sql, meta.get_field("finished_at")


_COMPLETE_FIELDS = ("status", "outcome", "finished_at", "updated_at")


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


def queue_message_never_finished(
    *, queue_message: QueueMessage, error_class: str, message: str, delay_seconds: float | None
) -> ProcessingError | None:
    """Record that the message's last start never finished (the worker died while it ran, or
    held it past its visibility timeout): an error row numbered with that attempt, and the
    record marked retrying, so that only a start made after this one can count again.

    Once per start: only while the record still shows that start in progress (the same
    ``attempts``); a second worker that saw it too records nothing and gets None. Writes the
    body the record may lack (a start in bulk stores none), for the operator and a redrive.
    """
    now = timezone.now()
    with transaction.atomic():
        changed = QueueMessage.objects.filter(
            pk=queue_message.pk,
            status=QueueMessageStatus.IN_PROGRESS,
            attempts=queue_message.attempts,
        ).update(
            status=QueueMessageStatus.RETRYING,
            last_error_class=error_class[:255],
            updated_at=now,
            body=queue_message.body,
            raw_body=queue_message.raw_body,
        )
        if not changed:
            return None
        error = _processing_error_create(
            queue_message=queue_message,
            error_class=error_class,
            message=message,
            traceback="",
            retryable=True,
            delay_seconds=delay_seconds,
        )
    queue_message.status = QueueMessageStatus.RETRYING
    queue_message.last_error_class = error_class[:255]
    return error


def queue_messages_interrupted(*, message_ids: list[str]) -> int:
    """Mark these messages' starts that are still in progress as interrupted (retrying): the
    worker that holds them lost the database mid-work and hands them back, so their next
    receive must not take them for starts the worker died in. Returns how many changed."""
    if not message_ids:
        return 0
    return QueueMessage.objects.filter(
        message_id__in=message_ids, status=QueueMessageStatus.IN_PROGRESS
    ).update(status=QueueMessageStatus.RETRYING, updated_at=timezone.now())


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
    *,
    message: ReceivedMessage,
    queue_message: QueueMessage | None,
    reason: str,
    release_in: float | None = None,
) -> StartDecision:
    """Take a submission the processor cannot take now (its breaker is open, or calls are
    paused) off the queue: park it, in its group's order, behind an outage hold of its
    payment, which the workers release when calls may flow. The caller deletes it from SQS.

    An outage may last hours; hidden in the queue, the message would be handed out again at
    every release or expiry, and each receive would bring it closer to the RedrivePolicy.
    Parked, it costs one receive however long the outage lasts, and the payment's later
    messages are parked behind it, so nothing overtakes it. A payment already on hold (for a
    person) keeps that hold: the submission waits behind it like any other message.
    ``release_in``: a new hold is released no sooner than this many seconds from now (a
    degraded processor: the backoff the submission would have waited as a retry).
    """
    now = timezone.now()
    with transaction.atomic():
        if queue_message is None:
            queue_message = (
                QueueMessage.objects.select_for_update()
                .filter(message_id=message.message_id)
                .first()
            ) or queue_message_new(message, now, attempts=0)
        if queue_message.status in FINISHED_STATUSES:
            return StartDecision(StartAction.FINISHED, queue_message)
        active = PaymentHold.objects.filter(
            payment_id=message.payment_id, released_at__isnull=True
        ).first()
        reason = f"Submission waits for the processor: {reason}"
        # A copy whose outage hold was lifted meanwhile waits in that hold again, not in a
        # new one: however often the processor comes and goes, one hold per payment.
        hold = (
            outage_hold_reopen(message=message, reason=reason, release_in=release_in)
            if active is None
            else None
        )
        if hold is None:
            hold = payment_hold(
                payment_id=message.payment_id,
                reason=reason,
                kind=HoldKind.OUTAGE,
                # A copy its own hold's release just sent: that release may be about to mark
                # the copy's row sent and lift the hold, which would lose it; the release
                # starts over (an outage hold) or a new hold takes it (a person's).
                supersede=active is not None
                and bool(released_original_id(message.deduplication_id))
                and hold_passes(message, active),
                release_in=release_in,
            )
        return message_park(message, queue_message, hold, now)


def dead_letter_body(
    *, queue_message: QueueMessage, error_class: str, error: str, now: datetime
) -> dict:
    return dead_letter_marked(
        queue_message.body,
        raw_body=queue_message.raw_body,
        original_message_id=queue_message.message_id,
        attempts=queue_message.attempts,
        error_class=error_class,
        error=error[:2000],
        first_started_at=queue_message.first_started_at,
        dead_lettered_at=now,
    )


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
