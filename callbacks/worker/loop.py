"""The worker's loop: signals, the outbox relay and the handlers' ticks, the receive, and the
database outage mode.

One loop: relay the outbox, run the handlers' ticks, take a batch, hand it to
``callbacks.worker.batch``, linger so the next batch fills. The loop is the top of the worker:
it builds the messages in hand (``callbacks.worker.hand``: the receive, the heartbeat, every
SQS call on a received message) and the rules the runners go by (``callbacks.worker.rules``),
and hands both down; no runner calls back up into it. While the database does not answer, the
loop receives nothing: what the batch held is hidden (``Hand.hold_back``) and given back as
soon as the database answers.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from django.db import DatabaseError, close_old_connections
from django.utils import timezone

from callbacks import conf as callbacks_conf
from callbacks import sqs
from callbacks.handlers import DEFAULT_HANDLERS, Handler, Tick
from callbacks.outbox import outbox_relay_publish
from callbacks.retry import MAX_VISIBILITY_SECONDS
from callbacks.services import ReceivedMessage, queue_messages_interrupted
from callbacks.worker.batch import process_batch
from callbacks.worker.hand import Hand, WorkerStats
from callbacks.worker.message import process_message
from callbacks.worker.outage import DatabaseDown, database_answers, is_outage
from callbacks.worker.outcomes import Result
from callbacks.worker.rules import Rules

# Every module of the worker (and the gates and ticks it runs) logs under the one name operators
# know it by, which the log format prints.
logger = logging.getLogger("callbacks.worker")

# Seconds between outbox relay queries while batches keep arriving.
RELAY_BUSY_INTERVAL = 1.0
# The longest WORKER_RECEIVE_LINGER_SECONDS may be: it is latency added to every event.
MAX_LINGER_SECONDS = 1.0
# Messages this worker had received when the database went away are hidden for its backoff cap
# (at least this long); it makes them visible again itself as soon as the database answers. No
# longer: if it dies meanwhile they must come back soon, and a visible message costs nothing
# while every worker waits for the database, since none receives.
DATABASE_OUTAGE_MIN_HIDE_SECONDS = 5


def _check_options(
    *, batch_size: int, wait_time: int, visibility_timeout: int, max_messages: int | None
) -> None:
    if not 1 <= batch_size <= 10:
        raise ValueError(f"batch_size must be 1-10, got {batch_size}")
    if not 0 <= wait_time <= 20:
        raise ValueError(f"wait_time must be 0-20, got {wait_time}")
    if not 1 <= visibility_timeout <= MAX_VISIBILITY_SECONDS:
        raise ValueError(f"visibility_timeout must be 1-43200, got {visibility_timeout}")
    if max_messages is not None and max_messages < 1:
        raise ValueError(f"max_messages must be at least 1, got {max_messages}")


class Worker:
    """Consumes the main FIFO queue until stopped (see ``callbacks.worker``)."""

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
        _check_options(
            batch_size=batch_size,
            wait_time=wait_time,
            visibility_timeout=visibility_timeout,
            max_messages=max_messages,
        )
        if linger is None:
            linger = float(callbacks_conf.WORKER_RECEIVE_LINGER_SECONDS)
        if not (0 <= linger <= MAX_LINGER_SECONDS):  # also refuses NaN
            raise ValueError(f"linger must be 0-{MAX_LINGER_SECONDS} seconds, got {linger}")
        self.batch_size = batch_size
        self.wait_time = wait_time
        self.visibility_timeout = visibility_timeout
        self.until_empty = until_empty
        self.linger = linger
        self.rules = Rules.from_settings(DEFAULT_HANDLERS if handlers is None else handlers)
        # Each tick once, however many handlers declare it.
        self._tick_due: dict[Tick, float] = {
            t: 0.0 for h in self.rules.handlers.values() for t in h.ticks
        }
        # Ticks whose turns are awaited now (Tick.awaited, asked after each turn).
        self._awaited: dict[Tick, bool] = {}
        self.relay = _outbox_relay() if relay else None
        self._stopping = threading.Event()
        self.hand = Hand(
            visibility_timeout=visibility_timeout,
            stopping=self._stopping,
            max_messages=max_messages,
            hold_back_seconds=int(
                max(DATABASE_OUTAGE_MIN_HIDE_SECONDS, min(self.rules.backoff_cap, 300))
            ),
            # until_empty must not stop while a message it hid for a backoff is still due, nor
            # in the next full wait time: visibility timeouts are approximate (some servers
            # return an expired message up to a second late).
            due_grace=max(float(wait_time), 1.0),
        )
        self._signals = 0
        self._receive_failures = 0
        # A database outage: since when (monotonic), and how often it was asked since.
        self._db_down_since: float | None = None
        self._db_down_checks = 0
        self._relay_due = 0.0

    @property
    def stats(self) -> WorkerStats:
        return self.hand.stats

    # --- lifecycle -------------------------------------------------------------------------

    def request_stop(self) -> None:
        self._stopping.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def limit_reached(self) -> bool:
        return self.hand.limit_reached()

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
            with self.hand.open(self._main_queue_url()):
                yield self
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
                pause = self.rules.backoff(failures)
                logger.warning("queue unavailable at start (%s); next try in %.1f s", exc, pause)
                self._stopping.wait(pause)

    def run(self) -> WorkerStats:
        with self.running():
            busy = False
            while not self.stopping and not self.limit_reached():
                close_old_connections()
                if self._database_still_down():
                    continue
                relayed = self._relay(busy=busy)
                self._tick()
                messages = self._receive_or_pause()
                if messages is None:
                    continue
                busy = bool(messages)
                if messages:
                    self.process_batch(messages)
                    if len(messages) < self.batch_size and self.linger:
                        # The queue is keeping up: let the next batch gather several messages,
                        # so one receive, one delete and one commit serve them all.
                        self._stopping.wait(self.linger)
                elif self.until_empty and not relayed and self._drained():
                    break
            held = self.hand.held_back_take()
            if held:
                self.hand.release(held)  # stopping in an outage: give them back
        return self.stats

    def _receive_or_pause(self) -> list[ReceivedMessage] | None:
        """A receive; None after a failed one, once its backoff has passed. With
        ``--until-empty`` the third failure in a row is raised, since a bounded run must end."""
        try:
            messages = self.receive()
        except sqs.QueueUnavailable as exc:
            self._receive_failures += 1
            if self.until_empty and self._receive_failures >= 3:
                raise
            pause = self.rules.backoff(self._receive_failures)
            logger.warning("receive failed (%s); next try in %.1f s", exc, pause)
            self._stopping.wait(pause)
            return None
        self._receive_failures = 0
        return messages

    def _drained(self) -> bool:
        """``--until-empty`` after an empty receive: True when nothing is left to wait for (the
        outbox empty, no tick sending anything back or with work pending, no retry this worker
        scheduled due)."""
        if self._relay(busy=False):
            return False  # rows were waiting in the outbox: go round again
        if self._tick(force=True):
            return False  # deferred messages were released: go round again
        if any(tick.pending and tick.pending() for tick in self._tick_due):
            self._stopping.wait(0.2)  # a paced release is not done: its next turn comes
            return False
        remaining = self.hand.due_back - time.monotonic()
        if remaining <= 0:
            return True
        # A retry this worker scheduled is not due yet: wait for it, gently.
        self._stopping.wait(min(remaining, 0.2) if self.wait_time == 0 else 0)
        return False

    # --- between receives ------------------------------------------------------------------

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
        return self._guarded("outbox relay", self.relay)

    def _tick(self, *, force: bool = False) -> int:
        """Run each tick the handlers declare that is due (every one, when ``force``). Returns
        how many messages they put back on the queue."""
        sent = 0
        for tick, due in self._tick_due.items():
            now = time.monotonic()
            if not force and now < due:
                continue
            self._tick_due[tick] = now + tick.interval
            sent += self._guarded(tick.name, tick.func)
            if tick.awaited is not None:
                awaited = bool(self._guarded(f"{tick.name} (awaited)", tick.awaited))
                self._awaited[tick] = awaited
        return sent

    def _wait_seconds(self) -> int:
        """The long poll's wait: no longer than the interval of a tick whose turns are awaited."""
        intervals = [t.interval for t, awaited in self._awaited.items() if awaited]
        if not intervals:
            return self.wait_time
        return min(self.wait_time, max(1, math.ceil(min(intervals))))

    def _guarded(self, name: str, work: Callable[[], int]) -> int:
        """Run loop work that must never stop the loop: it tries again on its next turn. A
        database that does not answer enters the outage mode."""
        try:
            return work()
        except DatabaseError as exc:
            if is_outage(exc):
                self.database_down(exc)
            else:
                logger.exception("%s failed", name)
        except Exception:  # noqa: BLE001 - the next turn tries again; never stop the loop
            logger.exception("%s failed", name)
        return 0

    # --- a database outage -----------------------------------------------------------------

    def database_down(self, exc: BaseException) -> None:
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
        pause = self.rules.backoff(self._db_down_checks)
        self._stopping.wait(max(pause, 0.1))  # a zero backoff (tests) must not spin
        if self.stopping or not database_answers():
            return True
        lasted = time.monotonic() - self._db_down_since
        held = self.hand.held_back_take()
        self._db_down_since = None
        # Their work was cut off by the outage, not by a message that kills the worker: their
        # next receive must not count those starts as never finished (callbacks.worker.crashes).
        self._guarded(
            "marking interrupted starts",
            lambda: queue_messages_interrupted(message_ids=[m.message_id for m in held]),
        )
        self.hand.release(held)
        logger.warning(
            "database back after %.0f s; %s held-back message(s) released", lasted, len(held)
        )
        return False

    # --- the queue and the work ------------------------------------------------------------

    def receive(self) -> list[ReceivedMessage]:
        """Take a batch: at most ``batch_size``, and no more than the message limit leaves."""
        count = self.batch_size
        left = self.hand.starts_left()
        if left is not None:
            count = max(1, min(count, left))
        return self.hand.take(count=count, wait_seconds=self._wait_seconds())

    def process_batch(self, messages: list[ReceivedMessage]) -> None:
        """Handle one received batch (``callbacks.worker.batch``); a database outage it meets
        starts the outage mode (what it held is held back already)."""
        try:
            process_batch(self.hand, self.rules, messages)
        except DatabaseDown as exc:
            self.database_down(exc.cause)

    def process_message(self, message: ReceivedMessage) -> Result:
        """Handle one message on its own (``callbacks.worker.message``)."""
        return process_message(self.hand, self.rules, message)


def _outbox_relay() -> Callable[[], int]:
    return lambda: outbox_relay_publish(limit=500)
