"""Coalesced sends: the threads of one process that send at the same time share one
``SendMessageBatch`` (boto3's CPU is per call, not per message), and each caller still gets
the answer for its own message.

The sender calls no SQS itself: the gateway hands it its batch send
(``callbacks.sqs.send_message_coalesced_now`` builds one sender per process), so what is sent,
where, and under which transaction rule stays the gateway's.
"""

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from callbacks.metrics import CALLBACK_SEND_BATCH_ENTRIES
from callbacks.sqs_messages import BATCH_LIMIT, BatchOutcome, OutgoingMessage, QueueUnavailable

BATCH_MAX_BYTES = 256 * 1024  # SQS's limit on the sum of a batch's message bodies


@dataclass(eq=False)
class _Waiter:
    """One caller's message in a coalesced batch, and what became of it."""

    message: OutgoingMessage
    size: int
    answered: threading.Event = field(default_factory=threading.Event)
    message_id: str | None = None
    error: str | None = None


@dataclass(eq=False)
class _OpenBatch:
    url: str
    waiters: list[_Waiter] = field(default_factory=list)
    size: int = 0
    announced: int = 0  # its waiters whose requests were announced (coalesced_send_expected)
    closed: bool = False

    def fits(self, waiter: _Waiter) -> bool:
        return len(self.waiters) < BATCH_LIMIT and self.size + waiter.size <= BATCH_MAX_BYTES


class RequestGauge:
    """How many announced requests run in this process now, and the most that ever ran at once
    (in practice the server's thread count)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.active = 0
        self.peak = 0

    def enter(self) -> None:
        with self._lock:
            self.active += 1
            self.peak = max(self.peak, self.active)

    def leave(self) -> None:
        with self._lock:
            self.active -= 1


class CoalescingSender:
    """Sends the messages of concurrent callers as one ``SendMessageBatch`` (per process).

    Callers announce their requests (``coalesced_send_expected``). The first caller to find no
    open batch opens one and leads it. In a process that has only ever run one announced
    request at a time, it sends at once (a lone callback waits for nothing). Otherwise it waits,
    at most ``window`` seconds, for others to join, and stops early once the batch is full (ten
    entries or 256 KiB) or holds as many announced callers as the process ever ran at once
    (nobody else can come). It then closes the batch, sends it and answers every waiter from
    SQS's answer for *its own* entry: its message id, or ``QueueUnavailable`` if its entry was
    refused or the call failed. One refused entry fails only its own caller. Waiters never wait
    forever: the leader answers every waiter in a ``finally``, and the send is bounded by the
    client's timeouts and retries. Thread-safe; one instance per process.
    """

    def __init__(
        self,
        *,
        window: float,
        send_batch: Callable[..., BatchOutcome[OutgoingMessage]],  # (messages, url=...)
        requests: RequestGauge,
    ) -> None:
        self._window = window
        self._send_batch = send_batch
        self._requests = requests
        self._changed = threading.Condition(threading.Lock())  # a waiter joined a batch
        self._open: dict[str, _OpenBatch] = {}

    def send(self, message: OutgoingMessage, *, url: str, announced: bool) -> str:
        waiter = _Waiter(message=message, size=message.size)
        with self._changed:
            batch, closed_another = self._join(waiter, url)
            batch.announced += announced
            leader = batch.waiters[0] is waiter
            # A leader waiting in _gather stops only when its batch was closed or holds every
            # caller that can come: waking it for any other join costs a thread switch and
            # changes nothing.
            if closed_another or batch.closed or batch.announced >= self._requests.peak:
                self._changed.notify_all()
            if leader:
                if self._requests.peak > 1:
                    self._gather(batch)
                self._close(batch)
        if leader:
            self._flush(batch)
        else:
            waiter.answered.wait()
        if waiter.message_id is None:
            raise QueueUnavailable(waiter.error or "send to SQS failed")
        return waiter.message_id

    def _gather(self, batch: _OpenBatch) -> None:
        """Wait for others to join ``batch`` (lock held; released while waiting)."""
        deadline = time.monotonic() + self._window
        while not batch.closed and batch.announced < self._requests.peak:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._changed.wait(remaining)

    def _join(self, waiter: _Waiter, url: str) -> tuple[_OpenBatch, bool]:
        """Add ``waiter`` to the open batch for ``url`` or a new one (lock held); and whether
        the open one was closed to make way for it."""
        batch = self._open.get(url)
        closed_another = batch is not None and not batch.fits(waiter)
        if closed_another:
            self._close(batch)  # its leader sends it now; this caller leads the next one
            batch = None
        if batch is None:
            batch = self._open[url] = _OpenBatch(url=url)
        batch.waiters.append(waiter)
        batch.size += waiter.size
        if len(batch.waiters) == BATCH_LIMIT:
            self._close(batch)
        return batch, closed_another

    def _close(self, batch: _OpenBatch) -> None:
        """Stop ``batch`` taking entries (lock held)."""
        if self._open.get(batch.url) is batch:
            del self._open[batch.url]
        batch.closed = True

    def _flush(self, batch: _OpenBatch) -> None:
        waiters = batch.waiters
        CALLBACK_SEND_BATCH_ENTRIES.observe(len(waiters))
        try:
            outcome = self._send_batch([w.message for w in waiters], url=batch.url)
            done = zip(outcome.done, outcome.results, strict=True)
            accepted = {id(message): result.get("MessageId") for message, result in done}
            failed = {id(message): why for message, why in outcome.refused + outcome.unreachable}
            for waiter in waiters:
                waiter.message_id = accepted.get(id(waiter.message))
                if waiter.message_id is None:
                    waiter.error = failed.get(id(waiter.message), "no answer from SQS")
        except QueueUnavailable as exc:
            for waiter in waiters:
                waiter.error = str(exc)
        finally:
            for waiter in waiters:
                if waiter.message_id is None and waiter.error is None:
                    waiter.error = "the batch send failed"
                waiter.answered.set()
