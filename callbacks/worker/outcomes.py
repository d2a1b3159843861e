"""What becomes of a message: the one place a failure turns into a retry, a dead letter or a
deferral, and the one place a message's end is counted, measured and logged (``finish``).

``fail`` takes any failure of a started message's work. Its handler may say the failure is a
dependency's, not the message's (``Handler.defers``): the attempt is given back and the message
deferred. Otherwise ``retry.classify`` says whether a retry can help: if so, and attempts are
left, the message is hidden for its backoff and its group waits behind it; if not, it is
dead-lettered (a DLQ copy, its payment on hold). Every failure is recorded in its own
transaction first, so no rollback loses it.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import time
import traceback
from dataclasses import dataclass

from django.db import DatabaseError
from django.utils import timezone

from callbacks import sqs
from callbacks.handlers import Deferral, Handler, UnstorableBody
from callbacks.metrics import ENQUEUE_TO_APPLIED_SECONDS, MESSAGES_DEFERRED, WORKER_MESSAGES
from callbacks.models import QueueMessage
from callbacks.retry import classify
from callbacks.services import (
    ReceivedMessage,
    StartAction,
    message_dead_letter,
    message_defer,
    message_send_behind,
    moves_behind,
    processing_error_record,
    queue_message_complete,
    queue_message_defer,
    queue_message_start,
    storable_text,
)
from callbacks.worker.hand import Hand
from callbacks.worker.outage import DatabaseDown, is_outage
from callbacks.worker.rules import Rules

# The worker's one logger name (see callbacks.worker.loop).
logger = logging.getLogger("callbacks.worker")


class Outcome(enum.StrEnum):
    """What the worker itself decided for a message (a handler that succeeded returns its own
    outcome instead). The values are the ``outcome`` metric labels and log fields."""

    DUPLICATE = "duplicate"  # finished before (a redelivery after commit): delete it
    PARKED = "parked"  # its payment is on hold: kept in ParkedMessage, delete it
    RETRIED = "retried"  # failed; hidden for its backoff, the group waits behind it
    DEFERRED = "deferred"  # a dependency is down as a whole: parked off the queue, no attempt
    DEAD_LETTERED = "dead_lettered"  # copied to the DLQ, payment held: delete it
    # Waits for a later message of its group: sent again to the group's back, delete it.
    MOVED_BEHIND = "moved_behind"

    @property
    def finished(self) -> bool:
        """The message is done with: delete it from the main queue."""
        return self in (
            Outcome.DUPLICATE,
            Outcome.PARKED,
            Outcome.DEFERRED,
            Outcome.DEAD_LETTERED,
            Outcome.MOVED_BEHIND,
        )

    @property
    def stops_group(self) -> bool:
        """The group's later messages in the batch must wait (released untouched)."""
        # A deferred message's payment is on hold now: its later messages are parked behind it.
        return self in (Outcome.RETRIED, Outcome.DEAD_LETTERED)


@dataclass(frozen=True, kw_only=True)
class Result:
    outcome: str  # an Outcome, or the outcome a handler returned
    delete: bool  # the message is finished: delete it from the main queue
    stop_group: bool = False  # it waits for a retry: the group's later messages must wait too

    @classmethod
    def of(cls, outcome: Outcome) -> Result:
        return cls(outcome=outcome, delete=outcome.finished, stop_group=outcome.stops_group)

    @classmethod
    def handled(cls, outcome: str) -> Result:
        """A handler's work committed with the done mark."""
        return cls(outcome=outcome, delete=True)


@dataclass(frozen=True)
class Failure:
    """A failure as it is recorded: the error class by its dotted name (what operators see in
    the error history and the dead letter), and a text that is never empty."""

    exc: Exception
    error_class: str
    text: str

    @classmethod
    def of(cls, exc: Exception) -> Failure:
        error_class = f"{type(exc).__module__}.{type(exc).__qualname__}"
        return cls(exc, error_class, str(exc) or error_class)

    @property
    def traceback(self) -> str:
        return "".join(traceback.format_exception(self.exc))


def fail(
    hand: Hand,
    rules: Rules,
    message: ReceivedMessage,
    queue_message: QueueMessage,
    exc: Exception,
    started: float,
) -> Result:
    """A started message failed (its work rolled back): defer it when its handler says the
    failure is a dependency's; otherwise record the failed attempt, then dead-letter it (not
    retryable, or out of attempts) or hide it for its backoff."""
    failure = Failure.of(exc)
    handler = rules.handlers.get(message.kind)
    deferral = handler.defers(exc) if handler is not None and handler.defers else None
    if deferral is not None:
        if deferral.backoff_attempt is not None:
            # A degraded dependency: the backoff a retry would wait, without its attempt.
            deferral = deferral.backed_off(rules.backoff(deferral.backoff_attempt))
        _give_back(message, queue_message, failure, deferral)
        return defer(hand, rules, message, queue_message, started, deferral)
    retryable, retry_after = classify(exc)
    if retryable and handler is not None and handler.waits_behind is not None:
        moved = move_behind(hand, rules, message, queue_message, failure, handler, started)
        if moved is not None:
            return moved
    attempt = queue_message.attempts
    give_up = not retryable or attempt >= rules.max_attempts
    delay = None
    if not give_up:
        delay = rules.backoff(attempt, retry_after=retry_after)
    _record_failure(message, queue_message, failure, retryable=retryable, delay=delay)
    if give_up:
        if _dead_letter(message, queue_message, failure):
            return finish(
                hand,
                rules,
                message,
                queue_message,
                Result.of(Outcome.DEAD_LETTERED),
                started,
                error=failure.text,
            )
        # Not moved: keep it in the main queue and try again after a pause; it will be
        # dead-lettered on its next failure, since its attempts are past the limit.
        delay = rules.backoff(attempt)
    hand.hide(message, delay or 0)
    return finish(
        hand,
        rules,
        message,
        queue_message,
        Result.of(Outcome.RETRIED),
        started,
        error=failure.text,
        delay=delay,
    )


# How many times one message may be sent to the back of its group; then it is retried in place
# like any other, and dead-lettered when its attempts are spent.
MAX_MOVES_BEHIND = 3


def move_behind(
    hand: Hand,
    rules: Rules,
    message: ReceivedMessage,
    queue_message: QueueMessage,
    failure: Failure,
    handler: Handler,
    started: float,
) -> Result | None:
    """A failure that waits for a later message of the group (``Handler.waits_behind``): a
    retry would hide the message and keep its group, that later message with it, waiting
    behind it until it is dead-lettered. It is sent again to the back of its group instead (a
    copy, ``message_send_behind``), its failed attempt recorded, and it is marked done and
    deleted; the group goes on. At most ``MAX_MOVES_BEHIND`` times, so a message whose
    awaited message never comes is retried and dead-lettered as before. None: not moved (not
    waiting, moved too often, or the queue or the database failed: the usual retry follows)."""
    moves = moves_behind(message.deduplication_id) + 1
    if moves > MAX_MOVES_BEHIND:
        return None
    try:
        reason = handler.waits_behind(message, failure.exc)
    except DatabaseError as exc:
        logger.warning("could not tell whether message %s waits: %s", message.message_id, exc)
        return None
    if reason is None:
        return None
    text = (
        f"{failure.text}; {reason}: sent to the back of its group "
        f"(move {moves} of {MAX_MOVES_BEHIND})"
    )
    try:
        copy_id = message_send_behind(message=message, moves=moves)
    except sqs.QueueUnavailable as exc:
        logger.warning("could not move message %s behind its group: %s", message.message_id, exc)
        return None
    # Recorded once the copy is sent (a worker that dies first leaves the message to come back
    # and be moved again, its copy then dropped by SQS's deduplication).
    _record_failure(
        message, queue_message, dataclasses.replace(failure, text=text), retryable=True, delay=0
    )
    try:
        queue_message_complete(queue_message=queue_message, outcome=Outcome.MOVED_BEHIND)
    except DatabaseError as exc:
        if is_outage(exc):
            raise DatabaseDown(exc) from exc
        # Not marked: hidden for a pause instead, it comes back and is moved again (its copy
        # dropped by SQS's deduplication) or, its awaited message applied meanwhile, applied.
        logger.warning("could not mark message %s moved: %s", message.message_id, exc)
        delay = rules.backoff(queue_message.attempts)
        hand.hide(message, delay)
        return finish(
            hand, rules, message, queue_message, Result.of(Outcome.RETRIED), started, delay=delay
        )
    return finish(
        hand,
        rules,
        message,
        queue_message,
        Result.of(Outcome.MOVED_BEHIND),
        started,
        error=f"{text}; the copy is message {copy_id}",
    )


def give_up(
    hand: Hand,
    rules: Rules,
    message: ReceivedMessage,
    queue_message: QueueMessage,
    exc: Exception,
    started: float,
) -> Result:
    """Dead-letter a message that is not started again (its error rows are written already):
    its payment goes on hold, and the group's later messages in hand go on to be parked
    behind that hold now, rather than released to be received again. When the dead letter
    cannot be sent, the message is hidden for a pause and its group waits, as in ``fail``."""
    failure = Failure.of(exc)
    if _dead_letter(message, queue_message, failure):
        dead = dataclasses.replace(Result.of(Outcome.DEAD_LETTERED), stop_group=False)
        return finish(hand, rules, message, queue_message, dead, started, error=failure.text)
    delay = rules.backoff(queue_message.attempts)
    hand.hide(message, delay)
    return finish(
        hand,
        rules,
        message,
        queue_message,
        Result.of(Outcome.RETRIED),
        started,
        error=failure.text,
        delay=delay,
    )


def _record_failure(
    message: ReceivedMessage,
    queue_message: QueueMessage,
    failure: Failure,
    *,
    retryable: bool,
    delay: float | None,
) -> None:
    """The failed attempt's error row, in its own transaction; a database that cannot take it
    is logged (the retry or dead letter goes ahead)."""
    try:
        processing_error_record(
            queue_message=queue_message,
            error_class=failure.error_class,
            message=failure.text,
            traceback=failure.traceback,
            retryable=retryable,
            delay_seconds=delay,
        )
    except DatabaseError:
        logger.exception(
            "could not record the failure of message %s (%s: %s)",
            message.message_id,
            failure.error_class,
            failure.text,
        )


def _dead_letter(message: ReceivedMessage, queue_message: QueueMessage, failure: Failure) -> bool:
    """Move the message to the DLQ and hold its payment; False when that failed."""
    try:
        message_dead_letter(
            queue_message=queue_message, error_class=failure.error_class, error=failure.text
        )
    except (sqs.QueueUnavailable, DatabaseError) as exc:
        logger.error("could not dead-letter message %s: %s", message.message_id, exc)
        return False
    return True


def _give_back(
    message: ReceivedMessage, queue_message: QueueMessage, failure: Failure, deferral: Deferral
) -> None:
    """Give back the attempt the deferred work started; a real call that failed stays in the
    error history (``Deferral.keep_error``)."""
    try:
        queue_message_defer(
            queue_message=queue_message,
            error_class=failure.error_class if deferral.keep_error else "",
            message=str(failure.exc),
            traceback=failure.traceback if deferral.keep_error else "",
            delay_seconds=deferral.wait,
        )
    except DatabaseError:
        logger.exception(
            "could not record the deferral of message %s (%s)", message.message_id, failure.exc
        )


def defer(
    hand: Hand,
    rules: Rules,
    message: ReceivedMessage,
    queue_message: QueueMessage | None,
    started: float,
    deferral: Deferral,
) -> Result:
    """Take a message a dependency cannot take now off the queue, parked behind an outage hold
    of its payment (``message_defer``): no attempt spent, and no more receives however long the
    outage lasts. A tick releases it when calls may flow."""
    MESSAGES_DEFERRED.labels(reason=deferral.label).inc()
    hand.stats.deferred += 1
    try:
        decision = message_defer(
            message=message,
            queue_message=queue_message,
            reason=deferral.reason,
            release_in=deferral.release_in,
        )
    except DatabaseError as exc:
        if is_outage(exc):
            raise DatabaseDown(exc) from exc
        # Not parked: hide it for the pause instead (that costs it a receive).
        logger.warning("could not park deferred message %s: %s", message.message_id, exc)
        delay = max(deferral.wait, 1.0)
        hand.hide(message, delay, wait_for=deferral.due_in is not None)
        return finish(
            hand,
            rules,
            message,
            queue_message,
            Result.of(Outcome.RETRIED),
            started,
            error=deferral.reason,
            delay=delay,
        )
    if deferral.due_in is not None:
        # A pause with a known end: --until-empty stays to release and run it.
        hand.expect_back(deferral.due_in)
    outcome = Outcome.DUPLICATE if decision.action == StartAction.FINISHED else Outcome.DEFERRED
    return finish(
        hand,
        rules,
        message,
        decision.queue_message,
        Result.of(outcome),
        started,
        error=deferral.reason,
    )


def retry_unstarted(hand: Hand, rules: Rules, message: ReceivedMessage, started: float) -> Result:
    """A message whose start could not be recorded: no work ran, no attempt was counted; it
    comes back after a short pause and its group waits behind it."""
    hand.hide(message, rules.backoff(message.receive_count))
    return finish(hand, rules, message, None, Result.of(Outcome.RETRIED), started)


def quarantine(
    hand: Hand, rules: Rules, message: ReceivedMessage, exc: Exception, started: float
) -> Result:
    """Record a message whose body the database refuses with that body as escaped text, then
    dead-letter it like any other message that cannot be processed: an error row, a DLQ copy
    holding the text, the payment on hold."""
    as_text = dataclasses.replace(message, body=None, raw_body=storable_text(message.raw_body))
    try:
        decision = queue_message_start(message=as_text)
    except DatabaseError as again:
        logger.error("could not record message %s even as text: %s", message.message_id, again)
        return retry_unstarted(hand, rules, message, started)
    if decision.action == StartAction.FINISHED:
        return finish(
            hand, rules, message, decision.queue_message, Result.of(Outcome.DUPLICATE), started
        )
    if decision.action == StartAction.PARKED:
        return finish(
            hand, rules, message, decision.queue_message, Result.of(Outcome.PARKED), started
        )
    problem = UnstorableBody(
        f"the database refused the message body ({type(exc).__name__}: {exc}"[:1000]
        + f"); it failed to start {message.receive_count} time(s) and is kept as text"
    )
    return fail(hand, rules, message, decision.queue_message, problem, started)


def observe_applied(message: ReceivedMessage) -> None:
    """The time from the endpoint's enqueue to the work's commit."""
    if message.enqueued_at is not None:
        ENQUEUE_TO_APPLIED_SECONDS.labels(kind=message.kind).observe(
            max((timezone.now() - message.enqueued_at).total_seconds(), 0)
        )


def finish(
    hand: Hand,
    rules: Rules,
    message: ReceivedMessage,
    queue_message: QueueMessage | None,
    result: Result,
    started: float,
    *,
    error: str = "",
    delay: float | None = None,
) -> Result:
    """Count, measure and log what became of the message; returns ``result``."""
    outcome = str(result.outcome)
    duration_ms = round((time.monotonic() - started) * 1000, 1)
    attempt = queue_message.attempts if queue_message is not None else 0
    kind = message.kind or "unknown"
    # A metric label takes only the kinds this worker knows: a queued body's own ``kind``
    # (sent around the endpoint) must not mint label values without end.
    label = kind if kind in rules.handlers else "unknown"
    WORKER_MESSAGES.labels(kind=label, outcome=outcome).inc()
    hand.stats.count(outcome)
    extra = {
        "payment_id": message.payment_id,
        "message_id": message.message_id,
        "kind": kind,
        "outcome": outcome,
        "attempt": attempt,
        "duration_ms": duration_ms,
    }
    if delay is not None:
        extra["delay_seconds"] = round(delay, 3)
    if error:
        extra["error"] = error[:500]
    logger.log(
        # Retried and dead-lettered messages stop their group (or have it parked): worth a
        # warning.
        logging.WARNING if result.stop_group or outcome == Outcome.DEAD_LETTERED else logging.INFO,
        "message payment=%s message=%s kind=%s outcome=%s attempt=%s duration_ms=%s%s",
        message.payment_id,
        message.message_id,
        kind,
        outcome,
        attempt,
        duration_ms,
        f" error={error[:200]!r}" if error else "",
        extra=extra,
    )
    return result
