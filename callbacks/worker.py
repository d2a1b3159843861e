"""The SQS FIFO consumer behind ``run_sqs_worker``.

One loop: relay the outbox, long-poll a batch, handle it, delete what committed. A batch's
processor events (the group heads) start in one statement and apply in one transaction, a
savepoint each; everything else (submissions, which call the processor, and later messages of
a group) goes one message at a time in sequence order. The guarantees and where they come from:

- in order per payment: SQS FIFO delivers a group's messages in order and never hands out a
  later one while an earlier one is in flight; within a batch (AWS may return several of one
  group, fauxqs at most one) we stop a group at its first failure and release the rest
  untouched, so nothing overtakes a message that is waiting for its retry;
- exactly once: the work and the "done" mark commit in one transaction (the batch's, or the
  message's own), the SQS delete comes after; a failure rolls back only its savepoint and is
  recorded after the commit; a commit that fails leaves every message of it to be retried; a
  redelivery of a done message is only deleted, and the payments services deduplicate
  processor events by id on top;
- nothing lost: every failure is written in its own transaction; a message is dead-lettered
  (a copy in the DLQ, its payment on hold) before it is deleted; a message that crashes the
  process is caught by the queue's RedrivePolicy, and ``queue_message_start`` notices the gap
  it leaves and holds the payment.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import math
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

from django.db import (
    DatabaseError,
    DataError,
    InterfaceError,
    OperationalError,
    close_old_connections,
    connection,
    transaction,
)
from django.utils import timezone

from callbacks import conf as callbacks_conf
from callbacks import sqs
from callbacks.handlers import (
    DEFAULT_HANDLERS,
    Handler,
    InvalidBody,
    UnknownMessageKind,
    UnstorableBody,
)
from callbacks.metrics import (
    ENQUEUE_TO_APPLIED_SECONDS,
    MESSAGES_DEFERRED,
    WORKER_BATCH_MESSAGES,
    WORKER_MESSAGES,
)
from callbacks.models import QueueMessage
from callbacks.outbox import outbox_relay_publish
from callbacks.retry import MAX_VISIBILITY_SECONDS, backoff_delay, classify
from callbacks.services import (
    ReceivedMessage,
    StartAction,
    message_dead_letter,
    message_defer,
    outage_holds_release,
    outage_holds_waiting,
    processing_error_record,
    queue_message_complete,
    queue_message_defer,
    queue_message_start,
    queue_messages_complete,
    queue_messages_start_batch,
    storable_text,
)
from callbacks.sqs import VisibilityHeartbeat
from payments.exceptions import ProcessorCircuitOpen
from payments.models import BreakerState
from payments.services import SUBMIT_PAYMENT

logger = logging.getLogger(__name__)

# Recorded error classes name these as callbacks.worker.<name> (see callbacks.handlers).
__all__ = ["InvalidBody", "UnknownMessageKind", "UnstorableBody", "Worker"]

# Seconds between outbox relay queries while batches keep arriving.
RELAY_BUSY_INTERVAL = 1.0
# The longest WORKER_RECEIVE_LINGER_SECONDS may be: it is latency added to every event.
MAX_LINGER_SECONDS = 1.0
# Seconds between looks at the processor's breaker from the loop (trial due? release held?).
BREAKER_TICK_INTERVAL = 1.0
# Outage holds released per look once calls flow again: a long outage's backlog goes back to
# the queue (and to the processor) at a pace, not all at once.
OUTAGE_RELEASE_PER_TICK = 100
# Messages this worker had received when the database went away are hidden for its backoff cap
# (at least this long); it makes them visible again itself as soon as the database answers. No
# longer: if it dies meanwhile they must come back soon, and a visible message costs nothing
# while every worker waits for the database, since none receives.
DATABASE_OUTAGE_MIN_HIDE_SECONDS = 5


class DatabaseDown(Exception):
    """The database does not answer (not: it refused a value). Raised through a batch, whose
    unfinished messages are then held back until it answers again."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


def database_answers() -> bool:
    """Does the database answer a trivial query now? An ``OperationalError`` alone does not
    say: a lock timeout or a deadlock is one too, with the database there."""
    try:
        if not connection.in_atomic_block:
            connection.close()  # a broken connection would keep failing; open a fresh one
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return True
    except DatabaseError:
        return False


def _outage(exc: BaseException) -> bool:
    """``exc`` is the database being unreachable, not a failure of the message's work."""
    return isinstance(exc, OperationalError | InterfaceError) and not database_answers()


class BatchRolledBack(Exception):
    """The batch's transaction was left unusable (a savepoint could not be rolled back)."""


class Outcome(enum.StrEnum):
    """What the worker itself decided for a message (a handler that succeeded returns its own
    outcome instead). The values are the ``outcome`` metric labels and log fields."""

    DUPLICATE = "duplicate"  # finished before (a redelivery after commit): delete it
    PARKED = "parked"  # its payment is on hold: kept in ParkedMessage, delete it
    RETRIED = "retried"  # failed; hidden for its backoff, the group waits behind it
    DEFERRED = "deferred"  # the processor is down as a whole: parked off the queue, no attempt
    DEAD_LETTERED = "dead_lettered"  # copied to the DLQ, payment held: delete it

    @property
    def finished(self) -> bool:
        """The message is done with: delete it from the main queue."""
        return self in (Outcome.DUPLICATE, Outcome.PARKED, Outcome.DEFERRED, Outcome.DEAD_LETTERED)

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


@dataclass
class WorkerStats:
    received: int = 0
    processed: int = 0
    deferred: int = 0  # submissions parked while the processor could not be called
    held_back: int = 0  # messages hidden through a database outage, no work done
    deleted: int = 0
    released: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)

    def count(self, outcome: str) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1


def group_in_order(messages: Iterable[ReceivedMessage]) -> list[list[ReceivedMessage]]:
    """The batch split by message group, each group in sequence-number order."""
    groups: dict[str, list[ReceivedMessage]] = {}
    for m in messages:
        groups.setdefault(m.group_id, []).append(m)
    return [sorted(g, key=lambda m: m.sequence_number) for g in groups.values()]


class Worker:
    """Consumes the main FIFO queue until stopped (see the module docstring)."""

    def __init__(
        self,
        *,
        batch_size: int = 10,
        wait_time: int = 20,
        visibility_timeout: int = 30,
        until_empty: bool = False,
        max_messages: int | None = None,
        relay: bool = True,
        handlers: dict[str, Handler] | None = None,
        linger: float | None = None,
    ) -> None:
        if not 1 <= batch_size <= 10:
            raise ValueError(f"batch_size must be 1-10, got {batch_size}")
        if not 0 <= wait_time <= 20:
            raise ValueError(f"wait_time must be 0-20, got {wait_time}")
        if not 1 <= visibility_timeout <= MAX_VISIBILITY_SECONDS:
            raise ValueError(f"visibility_timeout must be 1-43200, got {visibility_timeout}")
        if max_messages is not None and max_messages < 1:
            raise ValueError(f"max_messages must be at least 1, got {max_messages}")
        if linger is None:
            linger = float(callbacks_conf.WORKER_RECEIVE_LINGER_SECONDS)
        if not (0 <= linger <= MAX_LINGER_SECONDS):  # also refuses NaN
            raise ValueError(f"linger must be 0-{MAX_LINGER_SECONDS} seconds, got {linger}")
        self.batch_size = batch_size
        self.wait_time = wait_time
        self.visibility_timeout = visibility_timeout
        self.until_empty = until_empty
        self.max_messages = max_messages
        self.linger = linger
        self.handlers = dict(DEFAULT_HANDLERS if handlers is None else handlers)
        self.relay = _outbox_relay() if relay else None
        self.backoff_base = float(callbacks_conf.WORKER_BACKOFF_BASE_SECONDS)
        self.backoff_cap = float(callbacks_conf.WORKER_BACKOFF_CAP_SECONDS)
        self.max_attempts = int(callbacks_conf.WORKER_MAX_ATTEMPTS)
        self.max_failed_starts = int(callbacks_conf.WORKER_MAX_FAILED_STARTS)
        self.stats = WorkerStats()
        self._stopping = threading.Event()
        self._signals = 0
        # until_empty must not stop while a message it hid for a backoff is still due, nor in
        # the next full wait time: visibility timeouts are approximate (some servers return an
        # expired message up to a second late).
        self._retry_due = 0.0
        self._due_grace = max(float(wait_time), 1.0)
        # A database outage: since when (monotonic), and the messages held back meanwhile.
        self._db_down_since: float | None = None
        self._db_down_checks = 0
        self._held_back: dict[str, ReceivedMessage] = {}
        self._queue_url = ""
        self._relay_due = 0.0
        self._breaker_due = 0.0
        self.heartbeat: VisibilityHeartbeat | None = None

    # --- lifecycle -------------------------------------------------------------------------

    def request_stop(self) -> None:
        self._stopping.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def _on_signal(self, signum, frame) -> None:
        self._signals += 1
        if self._signals > 1:
            # Second signal: the operator wants out now. Skip cleanup; whatever was in flight
            # becomes visible again when its visibility timeout runs out, and a started message
            # is recognised by its QueueMessage row.
            os._exit(1)
        logger.info("signal %s: finishing the current message, then stopping", signum)
        self._stopping.set()

    @contextmanager
    def running(self) -> Iterator[Worker]:
        """Signal handlers (in the main thread), the queue URL and the heartbeat, for ``run()``
        or for a caller driving ``process_batch`` itself; all undone on exit."""
        previous = {}
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                previous[signum] = signal.signal(signum, self._on_signal)
        try:
            self._queue_url = self._main_queue_url()
            self.heartbeat = VisibilityHeartbeat(
                queue_url=self._queue_url, visibility_timeout=self.visibility_timeout
            )
            # Off only to show what it prevents: a slow call outliving the visibility timeout
            # and a second worker taking the message (the tests' negative control).
            if callbacks_conf.WORKER_VISIBILITY_HEARTBEAT:
                self.heartbeat.start()
            try:
                yield self
            finally:
                self.heartbeat.stop()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            close_old_connections()

    def _main_queue_url(self) -> str:
        """Resolve the queue, waiting out an outage: a worker started while SQS is unreachable
        keeps trying (with backoff) instead of exiting, as a running worker does. With
        ``--until-empty`` it gives up after three tries, since a bounded run must end."""
        failures = 0
        while True:
            try:
                return sqs.main_queue_url()
            except sqs.QueueUnavailable as exc:
                failures += 1
                if (self.until_empty and failures >= 3) or self.stopping:
                    raise
                pause = backoff_delay(failures, base=self.backoff_base, cap=self.backoff_cap)
                logger.warning("queue unavailable at start (%s); next try in %.1f s", exc, pause)
                self._stopping.wait(pause)

    def run(self) -> WorkerStats:
        failures = 0
        with self.running():
            busy = False
            while not self.stopping and not self._limit_reached():
                close_old_connections()
                if self._database_still_down():
                    continue
                relayed = self._relay(busy=busy)
                self._breaker_tick()
                try:
                    messages = self.receive()
                except sqs.QueueUnavailable as exc:
                    failures += 1
                    if self.until_empty and failures >= 3:
                        raise
                    pause = backoff_delay(failures, base=self.backoff_base, cap=self.backoff_cap)
                    logger.warning("receive failed (%s); next try in %.1f s", exc, pause)
                    self._stopping.wait(pause)
                    continue
                failures = 0
                busy = bool(messages)
                if messages:
                    self.process_batch(messages)
                    if len(messages) < self.batch_size and self.linger:
                        # The queue is keeping up: let the next batch gather several messages,
                        # so one receive, one delete and one commit serve them all.
                        self._stopping.wait(self.linger)
                elif self.until_empty and not relayed:
                    if self._relay(busy=False):
                        continue  # rows were waiting in the outbox: go round again
                    if self._breaker_tick(force=True):
                        continue  # deferred submissions were released: go round again
                    remaining = self._retry_due - time.monotonic()
                    if remaining <= 0:
                        break
                    # A retry this worker scheduled is not due yet: wait for it, gently.
                    self._stopping.wait(min(remaining, 0.2) if self.wait_time == 0 else 0)
            if self._held_back:
                self.release(self._held_back.values())  # stopping in an outage: give them back
                self._held_back.clear()
        return self.stats

    # --- a database outage -----------------------------------------------------------------

    def _database_down(self, exc: BaseException) -> None:
        """Enter the outage (once): no receive until the database answers, since a message
        received now could only be handed back, and every receive counts toward the
        RedrivePolicy."""
        if self._db_down_since is not None:
            return
        self._db_down_since = time.monotonic()
        self._db_down_checks = 0
        logger.error(
            "database unavailable since %s UTC (%s: %s); receiving nothing until it answers",
            f"{timezone.now():%Y-%m-%d %H:%M:%S}",
            type(exc).__name__,
            str(exc).strip().splitlines()[0][:300] if str(exc).strip() else "",
        )

    def _database_still_down(self) -> bool:
        """In an outage, wait a backoff (the worker's settings), then ask the database; True
        while it does not answer. When it does, the held-back messages are released at once."""
        if self._db_down_since is None:
            return False
        self._db_down_checks += 1
        pause = backoff_delay(self._db_down_checks, base=self.backoff_base, cap=self.backoff_cap)
        self._stopping.wait(max(pause, 0.1))  # a zero backoff (tests) must not spin
        if self.stopping or not database_answers():
            return True
        lasted = time.monotonic() - self._db_down_since
        held = list(self._held_back.values())
        self._db_down_since = None
        self._held_back.clear()
        self.release(held)
        logger.warning(
            "database back after %.0f s; %s held-back message(s) released", lasted, len(held)
        )
        return False

    def _hold_back(self, messages: list[ReceivedMessage]) -> None:
        """Hide messages received before the database went away, without any work or record:
        this worker releases them when it answers again (``_database_still_down``)."""
        if not messages:
            return
        self.heartbeat.untrack([m.message_id for m in messages])
        seconds = int(max(DATABASE_OUTAGE_MIN_HIDE_SECONDS, min(self.backoff_cap, 300)))
        outcome = sqs.change_visibility_batch(
            url=self._queue_url, messages=messages, seconds=seconds
        )
        for m in outcome.done:
            self._held_back[m.message_id] = m
        for m, why in outcome.unreachable + outcome.refused:
            logger.warning("could not hold back message %s: %s", m.message_id, why)
        self.stats.held_back += len(messages)
        WORKER_MESSAGES.labels(kind="any", outcome="held_back").inc(len(messages))

    def _limit_reached(self) -> bool:
        return self.max_messages is not None and self.stats.processed >= self.max_messages

    def _relay(self, *, busy: bool) -> int:
        """Publish what the outbox holds. Idle, every loop (a long poll paces it); busy, at
        most every RELAY_BUSY_INTERVAL, since a query per batch would cost as much as the
        batch's work when batches are small, and fresh rows are published on commit anyway."""
        if self.relay is None:
            return 0
        now = time.monotonic()
        if busy and now < self._relay_due:
            return 0
        self._relay_due = now + RELAY_BUSY_INTERVAL
        try:
            return self.relay()
        except DatabaseError as exc:
            if _outage(exc):
                self._database_down(exc)
            else:
                logger.exception("outbox relay failed")
            return 0
        except Exception:  # noqa: BLE001 - the relay retries on its next call; never stop here
            logger.exception("outbox relay failed")
            return 0

    def _breaker_tick(self, *, force: bool = False) -> int:
        """At most every BREAKER_TICK_INTERVAL: start the breaker's trial when its pause is
        over (one process wins it) and release that many held submissions to make it; once
        calls may flow, release the outage holds at a pace. Returns how many messages went
        back to the queue."""
        now = time.monotonic()
        if not force and now < self._breaker_due:
            return 0
        self._breaker_due = now + BREAKER_TICK_INTERVAL
        try:
            return self._breaker_step()
        except DatabaseError as exc:
            if _outage(exc):
                self._database_down(exc)
            else:
                logger.exception("processor breaker tick failed")
        except sqs.QueueUnavailable as exc:
            logger.warning("could not release held submissions (%s); next tick tries again", exc)
        except Exception:  # noqa: BLE001 - the next tick tries again; never stop the loop
            logger.exception("processor breaker tick failed")
        return 0

    @staticmethod
    def _breaker_step() -> int:
        from payments.processor.breaker import (
            processor_breaker_close_when_trials_done,
            processor_breaker_incident_end,
            processor_breaker_trial_start,
            processor_breaker_wait,
            trial_calls,
        )

        gate = processor_breaker_wait()
        if gate.state == BreakerState.CLOSED:
            if gate.incident:
                processor_breaker_incident_end()
            if gate.allowed and outage_holds_waiting():
                return outage_holds_release(limit=OUTAGE_RELEASE_PER_TICK)
            return 0
        if gate.allowed and processor_breaker_trial_start():
            return outage_holds_release(limit=trial_calls(), trial=True)
        if gate.state == BreakerState.HALF_OPEN and not outage_holds_waiting():
            # Nothing left to make more trial calls with: what went through decides.
            processor_breaker_close_when_trials_done()
        return 0

    def receive(self) -> list[ReceivedMessage]:
        count = self.batch_size
        if self.max_messages is not None:
            count = max(1, min(count, self.max_messages - self.stats.processed))
        messages = sqs.receive_messages(
            url=self._queue_url,
            max_messages=count,
            wait_seconds=self.wait_time,
            visibility_timeout=self.visibility_timeout,
        )
        self.stats.received += len(messages)
        return messages

    # --- a batch ---------------------------------------------------------------------------

    def process_batch(self, messages: list[ReceivedMessage]) -> None:
        """Handle one received batch; groups keep their order, finished messages are deleted
        in batches after their commits.

        First the batch's group heads whose work is atomic (processor events) are started in
        one statement and applied in one transaction, a savepoint each (``_apply_started``).
        Then every other message, in group order, takes the per-message path: started alone,
        its work in its own transaction, or none for work that calls the network (a
        submission), so no network call ever runs inside the batch's transaction. A group whose
        head failed goes no further. Messages not started (a group stopped at a failure, a stop
        request, the message limit) are made visible again at once; they were never started,
        so no attempt is counted: the bulk start counts only group heads, which always run.
        """
        if self.heartbeat is None:
            raise RuntimeError("process_batch runs inside Worker.running() or Worker.run()")
        self.heartbeat.track(messages)
        WORKER_BATCH_MESSAGES.observe(len(messages))
        pending = {m.message_id: m for m in messages}
        finished: list[ReceivedMessage] = []

        def settle(message: ReceivedMessage, result: Result) -> None:
            del pending[message.message_id]
            self.heartbeat.untrack([message.message_id])
            if result.delete:
                finished.append(message)

        try:
            groups = group_in_order(messages)
            results = self._apply_started(self._start_heads(groups))
            for group in groups:
                for message in group:
                    result = results.get(message.message_id)
                    if result is None:
                        if self.stopping or self._limit_reached():
                            break
                        result = self.process_message(message)
                    settle(message, result)
                    if result.stop_group:
                        break
        except DatabaseDown as exc:
            # Nothing more of this batch can be started or recorded: hold back what is left.
            self._database_down(exc.cause)
            self._hold_back(list(pending.values()))
            pending.clear()
        finally:
            self.heartbeat.untrack(pending)
            self.release(pending.values())
            self.delete(finished)

    def _start_heads(
        self, groups: list[list[ReceivedMessage]]
    ) -> list[tuple[ReceivedMessage, QueueMessage]]:
        """Start the group heads the batch path can take, in one statement (see
        ``queue_messages_start_batch``); the rest keep the per-message path. A database that
        cannot take the start leaves them all to the per-message path, which records why. The
        bulk statement is PostgreSQL's; on another database (SQLite, the quick start) every
        message takes the per-message path."""
        if self.stopping or self._limit_reached() or connection.vendor != "postgresql":
            return []
        heads = [
            group[0]
            for group in groups
            if group[0].body is not None
            and (handler := self.handlers.get(group[0].kind)) is not None
            and handler.atomic
        ]
        if self.max_messages is not None:
            heads = heads[: max(self.max_messages - self.stats.processed, 0)]
        if not heads:
            return []
        try:
            started = queue_messages_start_batch(messages=heads)
        except (DatabaseError, UnicodeError) as exc:
            logger.warning("could not start the batch in bulk (%s); one at a time instead", exc)
            return []
        self.stats.processed += len(started)
        return [(m, started[m.message_id]) for m in heads if m.message_id in started]

    def _apply_started(
        self, started: list[tuple[ReceivedMessage, QueueMessage]]
    ) -> dict[str, Result]:
        """Apply started atomic messages in ONE transaction, a savepoint each (the handler's own
        when it declares one, see ``Handler.own_savepoint``), with their done marks (one
        statement); then, after the commit, record each failure (error row, retry or
        dead letter: SQS is never called inside the transaction). A failing message rolls back
        only its savepoint. If the transaction itself fails (at commit, or the connection broke
        so a savepoint could not be rolled back), nothing of it committed: every message is
        retried as failed with that error."""
        if not started:
            return {}
        began = time.monotonic()
        outcomes: dict[str, str] = {}
        failures: dict[str, Exception] = {}
        try:
            with transaction.atomic():
                for message, _ in started:
                    handler = self.handlers[message.kind]
                    try:
                        with transaction.atomic() if not handler.own_savepoint else nullcontext():
                            outcomes[message.message_id] = handler.func(message)
                    except Exception as exc:  # noqa: BLE001 - becomes this message's retry
                        failures[message.message_id] = exc
                if transaction.get_rollback():
                    raise BatchRolledBack("a savepoint could not be rolled back")
                queue_messages_complete(
                    done=[
                        (qm, outcomes[m.message_id])
                        for m, qm in started
                        if m.message_id in outcomes
                    ]
                )
                _pause_at("batch_commit")
        except Exception as exc:  # noqa: BLE001 - nothing committed: all of them are retried
            if _outage(exc):
                raise DatabaseDown(exc) from exc  # not the messages' fault: hold them back
            logger.error("the batch transaction of %s message(s) failed: %s", len(started), exc)
            for message, _ in started:  # those that ran, and any the failure kept from running
                failures.setdefault(message.message_id, exc)
            outcomes.clear()
        results = {}
        for message, queue_message in started:
            if message.message_id in failures:
                results[message.message_id] = self._fail(
                    message, queue_message, failures[message.message_id], began
                )
            else:
                self._observe_applied(message)
                results[message.message_id] = self._finish(
                    message, queue_message, Result.handled(outcomes[message.message_id]), began
                )
        return results

    def release(self, messages: Iterable[ReceivedMessage]) -> None:
        """Make messages visible again now (ChangeMessageVisibility 0), untouched."""
        outcome = sqs.change_visibility_batch(
            url=self._queue_url, messages=list(messages), seconds=0
        )
        # Those not released become visible anyway when their visibility timeout runs out.
        for m, why in outcome.unreachable + outcome.refused:
            logger.warning("could not release message %s: %s", m.message_id, why)
        self.stats.released += len(outcome.done)

    def delete(self, messages: Iterable[ReceivedMessage]) -> None:
        """Delete finished messages in batches. A delete that fails is harmless: the message
        comes back, its QueueMessage row says it is finished, and it is deleted then."""
        outcome = sqs.delete_messages(url=self._queue_url, messages=list(messages))
        for m, why in outcome.unreachable + outcome.refused:
            logger.warning("could not delete finished message %s: %s", m.message_id, why)
        self.stats.deleted += len(outcome.done)

    def hide(self, message: ReceivedMessage, seconds: float, *, wait_for: bool = True) -> None:
        """Hide a message for ``seconds``. ``wait_for``: ``--until-empty`` keeps running until
        it is due again (a backoff, a 429 pause); False for a deferral by the open breaker,
        whose end nobody knows."""
        visibility = int(math.ceil(seconds))  # SQS takes whole seconds
        try:
            sqs.change_visibility(
                url=self._queue_url, receipt_handle=message.receipt_handle, seconds=visibility
            )
        except sqs.QueueUnavailable as exc:
            logger.warning(
                "could not hide message %s for its backoff (%s); it returns after the "
                "visibility timeout instead",
                message.message_id,
                exc,
            )
        if wait_for:
            self._retry_due = max(self._retry_due, time.monotonic() + visibility + self._due_grace)

    # --- one message -----------------------------------------------------------------------

    def process_message(self, message: ReceivedMessage) -> Result:
        started = time.monotonic()
        if message.kind == SUBMIT_PAYMENT:
            deferred = self._breaker_defer(message, started)
            if deferred is not None:
                return deferred
        self.stats.processed += 1
        try:
            decision = queue_message_start(message=message)
        except (DatabaseError, UnicodeError) as exc:
            # The start could not be recorded, so no work ran. A database that answered with a
            # data error refused this body, not an outage: no retry will change that, so after
            # a few receives (SQS counts them; we could not) it goes to a person with its body
            # kept as text. Otherwise let it come back after a short pause, and keep the
            # group's later messages behind it.
            if _outage(exc):
                raise DatabaseDown(exc) from exc
            logger.error("could not record the start of message %s: %s", message.message_id, exc)
            if _refused_content(exc) and message.receive_count >= self.max_failed_starts:
                return self._quarantine(message, exc, started)
            return self._retry_unstarted(message, started)

        queue_message = decision.queue_message
        if decision.action == StartAction.FINISHED:
            return self._finish(message, queue_message, Result.of(Outcome.DUPLICATE), started)
        if decision.action == StartAction.PARKED:
            return self._finish(message, queue_message, Result.of(Outcome.PARKED), started)
        return self._run_handler(message, queue_message, started)

    def _run_handler(
        self, message: ReceivedMessage, queue_message: QueueMessage, started: float
    ) -> Result:
        """Do a started message's work and mark it done (in one transaction when the handler
        is atomic); a failure becomes a retry or a dead letter."""
        handler = self.handlers.get(message.kind)
        try:
            if message.body is None:
                raise InvalidBody("the message body is not a JSON object")
            if handler is None:
                raise UnknownMessageKind(
                    f"no handler for message kind {message.kind!r}; known kinds: "
                    f"{', '.join(sorted(self.handlers))}"
                )
            if handler.atomic:
                with transaction.atomic():
                    outcome = handler.func(message)
                    queue_message_complete(queue_message=queue_message, outcome=outcome)
            else:
                outcome = handler.func(message)
                queue_message_complete(queue_message=queue_message, outcome=outcome)
        except Exception as exc:  # noqa: BLE001 - the one place failures become retry/dead letter
            if _outage(exc):
                # Whatever the work did rolled back (or, for a submission, the processor keeps
                # the idempotency key): it is done again once the database answers.
                raise DatabaseDown(exc) from exc
            return self._fail(message, queue_message, exc, started)
        self._observe_applied(message)
        return self._finish(message, queue_message, Result.handled(outcome), started)

    @staticmethod
    def _observe_applied(message: ReceivedMessage) -> None:
        if message.enqueued_at is not None:
            ENQUEUE_TO_APPLIED_SECONDS.labels(kind=message.kind).observe(
                max((timezone.now() - message.enqueued_at).total_seconds(), 0)
            )

    def _retry_unstarted(self, message: ReceivedMessage, started: float) -> Result:
        """A message whose start could not be recorded: no work ran, no attempt was counted;
        it comes back after a short pause and its group waits behind it."""
        self.heartbeat.untrack([message.message_id])
        self.hide(
            message,
            backoff_delay(message.receive_count, base=self.backoff_base, cap=self.backoff_cap),
        )
        return self._finish(message, None, Result.of(Outcome.RETRIED), started)

    def _breaker_defer(self, message: ReceivedMessage, started: float) -> Result | None:
        """Before starting a submission: while the processor's breaker is open (or calls are
        paused by a 429), park it off the queue until calls may flow (``_defer``); nothing is
        started: no attempt counted, no error row."""
        from payments.processor.breaker import processor_breaker_wait

        try:
            gate = processor_breaker_wait()
        except DatabaseError as exc:
            # The start would fail the same way; let the usual path record and retry it.
            logger.warning("could not read the processor breaker: %s", exc)
            return None
        if gate.allowed:
            return None
        return self._defer(
            message,
            None,
            started,
            wait=gate.wait_seconds,
            breaker_open=gate.state != BreakerState.CLOSED,
            reason=gate.reason,
        )

    def _defer(
        self,
        message: ReceivedMessage,
        queue_message: QueueMessage | None,
        started: float,
        *,
        wait: float,
        breaker_open: bool,
        reason: str,
    ) -> Result:
        """Take a submission the processor cannot take now off the queue, parked behind an
        outage hold of its payment (``message_defer``): no attempt spent, and no more receives
        however long the outage lasts. The tick releases it when calls may flow."""
        reason_label = "breaker_open" if breaker_open else "paused"
        MESSAGES_DEFERRED.labels(reason=reason_label).inc()
        self.stats.deferred += 1
        self.heartbeat.untrack([message.message_id])
        try:
            decision = message_defer(message=message, queue_message=queue_message, reason=reason)
        except DatabaseError as exc:
            if _outage(exc):
                raise DatabaseDown(exc) from exc
            # Not parked: hide it for the pause instead (that costs it a receive).
            logger.warning("could not park deferred message %s: %s", message.message_id, exc)
            delay = max(wait, 1.0)
            self.hide(message, delay, wait_for=not breaker_open)
            return self._finish(
                message,
                queue_message,
                Result.of(Outcome.RETRIED),
                started,
                error=reason,
                delay=delay,
            )
        if not breaker_open:
            # A 429 pause has a known end: --until-empty stays to release and submit it.
            self._retry_due = max(
                self._retry_due,
                time.monotonic() + wait + BREAKER_TICK_INTERVAL + self._due_grace,
            )
        outcome = Outcome.DUPLICATE if decision.action == StartAction.FINISHED else Outcome.DEFERRED
        return self._finish(
            message, decision.queue_message, Result.of(outcome), started, error=reason
        )

    def _quarantine(self, message: ReceivedMessage, exc: Exception, started: float) -> Result:
        """Record a message whose body the database refuses with that body as escaped text,
        then dead-letter it like any other message that cannot be processed: an error row, a
        DLQ copy holding the text, the payment on hold."""
        as_text = dataclasses.replace(message, body=None, raw_body=storable_text(message.raw_body))
        try:
            decision = queue_message_start(message=as_text)
        except DatabaseError as again:
            logger.error("could not record message %s even as text: %s", message.message_id, again)
            return self._retry_unstarted(message, started)
        if decision.action == StartAction.FINISHED:
            return self._finish(
                message, decision.queue_message, Result.of(Outcome.DUPLICATE), started
            )
        if decision.action == StartAction.PARKED:
            return self._finish(message, decision.queue_message, Result.of(Outcome.PARKED), started)
        problem = UnstorableBody(
            f"the database refused the message body ({type(exc).__name__}: {exc}"[:1000]
            + f"); it failed to start {message.receive_count} time(s) and is kept as text"
        )
        return self._fail(message, decision.queue_message, problem, started)

    def _fail(
        self,
        message: ReceivedMessage,
        queue_message: QueueMessage,
        exc: Exception,
        started: float,
    ) -> Result:
        """A started message failed (its work rolled back): record the failed attempt, then
        dead-letter it (not retryable, or out of attempts) or hide it for its backoff."""
        if isinstance(exc, ProcessorCircuitOpen):
            return self._fail_circuit_open(message, queue_message, exc, started)
        retryable, retry_after = classify(exc)
        error_class = f"{type(exc).__module__}.{type(exc).__qualname__}"
        error_text = str(exc) or error_class
        attempt = queue_message.attempts
        give_up = not retryable or attempt >= self.max_attempts
        delay = None
        if not give_up:
            delay = backoff_delay(
                attempt, base=self.backoff_base, cap=self.backoff_cap, retry_after=retry_after
            )
        self._record_failure(message, queue_message, exc, retryable=retryable, delay=delay)
        if give_up:
            if self._dead_letter(message, queue_message, error_class, error_text):
                return self._finish(
                    message,
                    queue_message,
                    Result.of(Outcome.DEAD_LETTERED),
                    started,
                    error=error_text,
                )
            # Not moved: keep it in the main queue and try again after a pause; it will be
            # dead-lettered on its next failure, since its attempts are past the limit.
            delay = backoff_delay(attempt, base=self.backoff_base, cap=self.backoff_cap)
        self.heartbeat.untrack([message.message_id])
        self.hide(message, delay or 0)
        return self._finish(
            message,
            queue_message,
            Result.of(Outcome.RETRIED),
            started,
            error=error_text,
            delay=delay,
        )

    @staticmethod
    def _record_failure(
        message: ReceivedMessage,
        queue_message: QueueMessage,
        exc: Exception,
        *,
        retryable: bool,
        delay: float | None,
    ) -> None:
        """The failed attempt's error row, in its own transaction; a database that cannot take
        it is logged (the retry or dead letter goes ahead)."""
        error_class = f"{type(exc).__module__}.{type(exc).__qualname__}"
        error_text = str(exc) or error_class
        try:
            processing_error_record(
                queue_message=queue_message,
                error_class=error_class,
                message=error_text,
                traceback="".join(traceback.format_exception(exc)),
                retryable=retryable,
                delay_seconds=delay,
            )
        except DatabaseError:
            logger.exception(
                "could not record the failure of message %s (%s: %s)",
                message.message_id,
                error_class,
                error_text,
            )

    @staticmethod
    def _dead_letter(
        message: ReceivedMessage, queue_message: QueueMessage, error_class: str, error_text: str
    ) -> bool:
        """Move the message to the DLQ and hold its payment; False when that failed."""
        try:
            message_dead_letter(
                queue_message=queue_message, error_class=error_class, error=error_text
            )
        except (sqs.QueueUnavailable, DatabaseError) as exc:
            logger.error("could not dead-letter message %s: %s", message.message_id, exc)
            return False
        return True

    def _fail_circuit_open(
        self,
        message: ReceivedMessage,
        queue_message: QueueMessage,
        exc: ProcessorCircuitOpen,
        started: float,
    ) -> Result:
        """The submission started but the processor is down as a whole (the breaker opened,
        or was open when the call was to be made) or paused every caller: give the attempt
        back and defer. A real call that failed stays in the error history."""
        wait = max(exc.retry_after or 0.0, 1.0)
        error_class = f"{type(exc).__module__}.{type(exc).__qualname__}"
        try:
            queue_message_defer(
                queue_message=queue_message,
                error_class=error_class if exc.called else "",
                message=str(exc),
                traceback="".join(traceback.format_exception(exc)) if exc.called else "",
                delay_seconds=wait,
            )
        except DatabaseError:
            logger.exception(
                "could not record the deferral of message %s (%s)", message.message_id, exc
            )
        return self._defer(
            message,
            queue_message,
            started,
            wait=wait,
            breaker_open=exc.breaker_open,
            reason=str(exc),
        )

    def _finish(
        self,
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
        label = kind if kind in self.handlers else "unknown"
        WORKER_MESSAGES.labels(kind=label, outcome=outcome).inc()
        self.stats.count(outcome)
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
            # Retried, dead-lettered and deferred messages stop their group: worth a warning.
            logging.WARNING if result.stop_group else logging.INFO,
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


def _refused_content(exc: BaseException) -> bool:
    """A data exception (SQLSTATE class 22) or an encoding error: the value was refused, the
    database was there to refuse it."""
    return isinstance(exc, DataError | UnicodeError)


def _pause_at(point: str) -> None:
    """Tests only: stop here for good when ``WORKER_PAUSE_AT`` names this point, so a test can
    SIGKILL the process at a known place. A no-op unless a test sets it."""
    if point and callbacks_conf.WORKER_PAUSE_AT == point:
        logger.warning("paused at %s", point)
        while True:
            time.sleep(3600)


def _outbox_relay() -> Callable[[], int]:
    return lambda: outbox_relay_publish(limit=500)
