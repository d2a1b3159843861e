"""The publish after commit, off the request: one thread per process publishes what the
process's transactions committed, many rows a claim.

A create's outbox row used to go out from the request's own thread once its transaction
committed: the claim's four statements and one ``SendMessageBatch`` for one row, paid by every
create before its answer. Here the request only hands the committed ids to its process's
publisher and answers; the publisher's thread waits up to ``OUTBOX_PUBLISH_LINGER_SECONDS`` for
more ids to join (or until a claim's worth, ``CLAIM_SIZE``, has), then publishes them all with
one ``outbox_relay_publish_ids``: four statements and one send per ten rows, whatever the
number of requests that committed them.

Nothing is promised that the relay does not already keep: a row is published by whichever
publisher claims it first, in its group's order, and a row this thread never reaches (the
process killed, the database or the queue failing) stays unpublished, and the relay of every
``run_sqs_worker`` publishes it. At exit (``atexit``) the ids still waiting are published at
once, within ``EXIT_WAIT_SECONDS``.

``OUTBOX_PUBLISH_LINGER_SECONDS = 0`` publishes in the committing thread instead, as before;
so does a database without advisory locks (the SQLite quick start), whose claim serialises
writers anyway. The thread is started on first use in each process (after a fork, its child
starts its own) and opens its own database connection, closed as ``CONN_MAX_AGE`` says.
"""

import atexit
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable

from django.db import DatabaseError, close_old_connections, connections

from callbacks import conf

logger = logging.getLogger(__name__)

# At exit, the ids still waiting are published within this long; past it they are the relay's.
EXIT_WAIT_SECONDS = 5.0


class AfterCommitPublisher:
    """Collects committed outbox ids and publishes them from one thread, ``linger`` seconds
    after the first of a round arrived or as soon as ``claim_size`` have. Thread-safe; one per
    process (``publisher``)."""

    def __init__(
        self, *, publish: Callable[[list[int]], int], linger: float, claim_size: int
    ) -> None:
        self._publish = publish
        self._linger = linger
        self._claim_size = claim_size
        self._changed = threading.Condition(threading.Lock())
        self._waiting: list[int] = []
        self._busy = False  # a round is being published
        self._stopping = False
        self._thread: threading.Thread | None = None

    def submit(self, ids: Iterable[int]) -> None:
        """Hand committed ids to the publisher thread (started on the first call)."""
        with self._changed:
            before = len(self._waiting)
            self._waiting.extend(ids)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="outbox-after-commit", daemon=True
                )
                self._thread.start()
            # The thread waits for a first id, then for a claim's worth: wake it when either
            # arrives (one commit may bring several ids at once).
            if before == 0 or before < self._claim_size <= len(self._waiting):
                self._changed.notify_all()

    def _next_round(self) -> list[int] | None:
        """The ids of the next round, once the first has lingered; None when stopping with
        nothing left."""
        with self._changed:
            self._busy = False
            self._changed.notify_all()  # stop() may wait for the round just published
            while not self._waiting and not self._stopping:
                self._changed.wait()
            deadline = time.monotonic() + self._linger
            while len(self._waiting) < self._claim_size and not self._stopping:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._changed.wait(remaining)
            if not self._waiting:
                return None
            ids, self._waiting = self._waiting, []
            self._busy = True
            return ids

    def _run(self) -> None:
        try:
            while (ids := self._next_round()) is not None:
                self._round(ids)
        finally:
            connections.close_all()  # this thread's own connection

    def _round(self, ids: list[int]) -> None:
        """Publish one round's ids; any failure leaves them to the relay, logged."""
        close_old_connections()
        try:
            self._publish(ids)
        except Exception as exc:
            # The thread outlives any error (a dead publisher would leave every later row to
            # the relay's pace); the rows stay unpublished, and an error that is not the
            # database's is logged with its traceback.
            logger.warning(
                "publishing outbox rows %s after commit failed, left for the relay: %s",
                ids,
                exc,
                exc_info=not isinstance(exc, DatabaseError),
                extra={"outbox_ids": ids, "outcome": "left_for_relay"},
            )
        finally:
            close_old_connections()

    def stop(self, timeout: float) -> bool:
        """Publish what is waiting at once and stop the thread; True if it finished in time."""
        with self._changed:
            thread, self._stopping = self._thread, True
            self._changed.notify_all()
        if thread is None:
            return True
        thread.join(timeout)
        return not thread.is_alive()

    def idle(self) -> bool:
        """Nothing waiting and no round being published (tests)."""
        with self._changed:
            return not self._waiting and not self._busy

    def wait_idle(self, timeout: float) -> bool:
        """Wait until ``idle()``; True if it became so within ``timeout`` (tests)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while self._waiting or self._busy:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._changed.wait(remaining)
            return True


_lock = threading.Lock()
_publisher: AfterCommitPublisher | None = None
_publisher_key: tuple | None = None


def publisher() -> AfterCommitPublisher:
    """This process's publisher for the current linger (a forked child builds its own)."""
    from callbacks.outbox import CLAIM_SIZE, outbox_relay_publish_ids

    global _publisher, _publisher_key
    key = (os.getpid(), conf.OUTBOX_PUBLISH_LINGER_SECONDS)
    with _lock:
        if _publisher is None or _publisher_key != key:
            if _publisher is not None and _publisher_key[0] == key[0]:
                _publisher.stop(EXIT_WAIT_SECONDS)  # the linger changed (tests)
            _publisher = AfterCommitPublisher(
                publish=outbox_relay_publish_ids,
                linger=conf.OUTBOX_PUBLISH_LINGER_SECONDS,
                claim_size=CLAIM_SIZE,
            )
            _publisher_key = key
        return _publisher


def _stop_at_exit() -> None:
    if _publisher is not None and _publisher_key and _publisher_key[0] == os.getpid():
        if not _publisher.stop(EXIT_WAIT_SECONDS):
            logger.warning(
                "outbox rows committed before exit were not all published within %s s; "
                "the relay publishes them",
                EXIT_WAIT_SECONDS,
            )


atexit.register(_stop_at_exit)
