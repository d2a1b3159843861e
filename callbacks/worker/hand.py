"""The messages in hand: taking them, the heartbeat, and every way of letting one go.

``Hand`` is the one owner of what the worker holds from the queue. It takes a batch
(``take``: the receive, within what the worker may still start), keeps it hidden while the
worker holds it (``holding``: the heartbeat, the one place a message is tracked), and lets each
message go once: deleted once finished, released untouched, hidden for a backoff, or held back
through a database outage. Each way of letting go first takes the message off the heartbeat
(``let_go``, the one place it is untracked), so no beat overwrites a backoff or a release.
Every SQS call the worker makes on a received message is a method here.

The loop (``callbacks.worker.loop``) builds one and hands it to the runners (``batch``,
``message``, ``crashes``, ``outcomes``), which call it and never the loop: the worker's calls
go one way, down.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from callbacks import conf as callbacks_conf
from callbacks import sqs
from callbacks.metrics import WORKER_MESSAGES
from callbacks.sqs import ReceivedMessage, VisibilityHeartbeat

# The worker's one logger name (see callbacks.worker.loop).
logger = logging.getLogger("callbacks.worker")


@dataclass
class WorkerStats:
    received: int = 0
    processed: int = 0
    deferred: int = 0  # messages parked while a dependency could not take them
    held_back: int = 0  # messages hidden through a database outage, no work done
    deleted: int = 0
    released: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)

    def count(self, outcome: str) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1


class Hand:
    """What the worker holds from the queue, and how many more messages it may start.

    ``stopping``: the worker's stop request (set by its signal handler); ``max_messages``: how
    many messages it may start in all (``--max-messages``); ``hold_back_seconds``: how long a
    message held back through a database outage stays hidden if the worker dies meanwhile;
    ``due_grace``: how long past a hidden message's due time ``--until-empty`` still waits
    for it (visibility timeouts are approximate)."""

    def __init__(
        self,
        *,
        visibility_timeout: int,
        stopping: threading.Event,
        max_messages: int | None = None,
        hold_back_seconds: int,
        due_grace: float,
    ) -> None:
        self.visibility_timeout = visibility_timeout
        self.max_messages = max_messages
        self.hold_back_seconds = hold_back_seconds
        self.stats = WorkerStats()
        # Monotonic time by which what this worker hid for a known time is due back; until
        # then --until-empty does not call the queue empty.
        self.due_back = 0.0
        self._due_grace = due_grace
        self._stopping = stopping
        self._held_back: dict[str, ReceivedMessage] = {}
        self.queue_url = ""
        self.heartbeat: VisibilityHeartbeat | None = None

    @contextmanager
    def open(self, queue_url: str) -> Iterator[Hand]:
        """The queue this hand takes from, and its heartbeat, running until the block ends."""
        self.queue_url = queue_url
        self.heartbeat = VisibilityHeartbeat(
            queue_url=queue_url, visibility_timeout=self.visibility_timeout
        )
        # Off only to show what it prevents: a slow call outliving the visibility timeout and a
        # second worker taking the message (the tests' negative control).
        if callbacks_conf.WORKER_VISIBILITY_HEARTBEAT:
            self.heartbeat.start()
        try:
            yield self
        finally:
            self.heartbeat.stop()

    # --- how many more it may start ---------------------------------------------------------

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def limit_reached(self) -> bool:
        return self.max_messages is not None and self.stats.processed >= self.max_messages

    def may_start(self) -> bool:
        """Another message may start: no stop requested, the message limit not reached."""
        return not self.stopping and not self.limit_reached()

    def starts_left(self) -> int | None:
        """How many more messages may start (None: no limit)."""
        if self.max_messages is None:
            return None
        return max(self.max_messages - self.stats.processed, 0)

    def started(self, count: int = 1) -> None:
        self.stats.processed += count

    # --- taking them ------------------------------------------------------------------------

    def take(self, *, count: int, wait_seconds: int) -> list[ReceivedMessage]:
        """Receive up to ``count`` messages, hidden for the visibility timeout."""
        messages = sqs.receive_messages(
            url=self.queue_url,
            max_messages=count,
            wait_seconds=wait_seconds,
            visibility_timeout=self.visibility_timeout,
        )
        self.stats.received += len(messages)
        return messages

    @contextmanager
    def holding(self, messages: list[ReceivedMessage]) -> Iterator[None]:
        """The heartbeat keeps a batch hidden while the worker holds it. Each message is let
        go once: finished (its delete follows), hidden for a backoff, held back or released;
        whatever is left is let go on the way out."""
        if self.heartbeat is None:
            raise RuntimeError("a batch is held inside Worker.running() or Worker.run()")
        self.heartbeat.track(messages)
        try:
            yield
        finally:
            self.let_go(messages)

    # --- letting go -------------------------------------------------------------------------

    def let_go(self, messages: Iterable[ReceivedMessage]) -> None:
        """Stop the heartbeat for these messages: once this returns, no beat can overwrite the
        visibility the worker sets next."""
        if self.heartbeat is not None:
            self.heartbeat.untrack([m.message_id for m in messages])

    def release(self, messages: Iterable[ReceivedMessage]) -> None:
        """Make messages visible again now (ChangeMessageVisibility 0), untouched."""
        messages = list(messages)
        self.let_go(messages)
        outcome = sqs.change_visibility_batch(url=self.queue_url, messages=messages, seconds=0)
        # Those not released become visible anyway when their visibility timeout runs out.
        for m, why in outcome.unreachable + outcome.refused:
            logger.warning("could not release message %s: %s", m.message_id, why)
        self.stats.released += len(outcome.done)

    def delete(self, messages: Iterable[ReceivedMessage]) -> None:
        """Delete finished messages in batches. A delete that fails is harmless: the message
        comes back, its QueueMessage row says it is finished, and it is deleted then."""
        outcome = sqs.delete_messages(url=self.queue_url, messages=list(messages))
        for m, why in outcome.unreachable + outcome.refused:
            logger.warning("could not delete finished message %s: %s", m.message_id, why)
        self.stats.deleted += len(outcome.done)

    def hide(self, message: ReceivedMessage, seconds: float, *, wait_for: bool = True) -> None:
        """Hide a message for ``seconds``. ``wait_for``: ``--until-empty`` keeps running until
        it is due again (a backoff, a pause of known length); False for a deferral through an
        outage whose end nobody knows."""
        self.let_go([message])
        visibility = int(math.ceil(seconds))  # SQS takes whole seconds
        try:
            sqs.change_visibility(
                url=self.queue_url, receipt_handle=message.receipt_handle, seconds=visibility
            )
        except sqs.QueueUnavailable as exc:
            logger.warning(
                "could not hide message %s for its backoff (%s); it returns after the "
                "visibility timeout instead",
                message.message_id,
                exc,
            )
        if wait_for:
            self.expect_back(visibility)

    def expect_back(self, seconds: float) -> None:
        """``--until-empty`` keeps running until a message this worker put aside is due again
        in ``seconds`` (and a grace past that)."""
        self.due_back = max(self.due_back, time.monotonic() + seconds + self._due_grace)

    def hold_back(self, messages: list[ReceivedMessage]) -> None:
        """Hide messages received before the database went away, without any work or record,
        and keep them: the worker gives them back (``held_back_take``) once it answers."""
        if not messages:
            return
        self.let_go(messages)
        outcome = sqs.change_visibility_batch(
            url=self.queue_url, messages=messages, seconds=self.hold_back_seconds
        )
        for m in outcome.done:
            self._held_back[m.message_id] = m
        for m, why in outcome.unreachable + outcome.refused:
            logger.warning("could not hold back message %s: %s", m.message_id, why)
        self.stats.held_back += len(messages)
        WORKER_MESSAGES.labels(kind="any", outcome="held_back").inc(len(messages))

    def held_back_take(self) -> list[ReceivedMessage]:
        """The messages held back, no longer kept here: the caller releases them."""
        held = list(self._held_back.values())
        self._held_back.clear()
        return held
