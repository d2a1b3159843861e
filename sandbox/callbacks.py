"""Signed callback delivery from the sandbox processor, the way processors deliver webhooks.

Deliveries run on a few background threads from a schedule (a heap ordered by due time), so the
debit answer is never delayed. A delivery that gets a non-2xx answer or a connection error is
retried with exponential backoff, up to ``max_attempts``; the next event of the same debit is
only scheduled once the previous one was delivered or given up, so one debit's events go out in
order (``submitted`` before ``settled``).

A ``DropPlan`` drops a share of the callbacks on purpose, as a processor that gave up or lost
them: a dropped event is never posted (nor its duplicate), the debit's next event follows as
after a delivery given up, and the plan keeps the list of what it dropped.
"""

from __future__ import annotations

import heapq
import itertools
import json
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import requests

from payments import signing

logger = logging.getLogger(__name__)


class DropPlan:
    """Which callbacks are never delivered: ``share`` of them (of ``event_types`` only, when
    given), decided once per processor event id so a duplicate delivery is dropped too. Its
    own generator, seeded from the sandbox's seed: the fault plan's draws stay as they were."""

    def __init__(self, share: float = 0.0, seed: int | None = None) -> None:
        self._seed = seed
        self._lock = threading.Lock()
        self._random = random.Random(None if seed is None else f"drops:{seed}")
        self._decided: dict[str, bool] = {}
        self._dropped: list[dict] = []
        self.share = 0.0
        self.event_types: frozenset[str] = frozenset()
        self.set(share, None)

    def set(self, share: float, event_types: list[str] | None) -> None:
        if not 0 <= share <= 1:
            raise ValueError(f"share must be a probability within 0..1, got {share}")
        with self._lock:
            self.share = float(share)
            self.event_types = frozenset(event_types or ())

    def reset(self) -> None:
        with self._lock:
            self._random = random.Random(None if self._seed is None else f"drops:{self._seed}")
            self._decided.clear()
            self._dropped.clear()

    def drops(self, body: dict) -> bool:
        """Whether the callback ``body`` is dropped; recorded when it is, the first time."""
        event_id = str(body.get("processor_event_id"))
        with self._lock:
            decided = self._decided.get(event_id)
            if decided is None:
                wanted = not self.event_types or body.get("event_type") in self.event_types
                decided = wanted and self.share > 0 and self._random.random() < self.share
                self._decided[event_id] = decided
                if decided:
                    self._dropped.append(
                        {
                            "payment_id": body.get("payment_id"),
                            "event_type": body.get("event_type"),
                            "processor_event_id": body.get("processor_event_id"),
                            "timestamp": body.get("timestamp"),
                            "dropped_at": time.time(),
                        }
                    )
            return decided

    def dropped(self) -> list[dict]:
        with self._lock:
            return [dict(item) for item in self._dropped]

    def state(self) -> dict:
        with self._lock:
            return {
                "share": self.share,
                "event_types": sorted(self.event_types),
                "dropped": [dict(item) for item in self._dropped],
            }


@dataclass
class Delivery:
    body: dict
    attempt: int = 0
    then: Callable[[], None] | None = None  # scheduled after this one is done (or given up)
    on_send: Callable[[], None] | None = None  # runs once, just before the first attempt
    log: list[dict] = field(default_factory=list)


class CallbackSender:
    def __init__(
        self,
        *,
        url: str | None,
        secret: str,
        threads: int = 4,
        max_attempts: int = 5,
        backoff_seconds: float = 0.2,
        timeout_seconds: float = 5.0,
        drops: DropPlan | None = None,
        on_due: Callable[[dict], None] | None = None,
    ) -> None:
        self.url = url
        self.drops = drops or DropPlan()
        # Told of each delivery when it first comes due (a duplicate delivery too): the moment
        # the processor's event happens, which its events API lists from then on.
        self.on_due = on_due
        self.secret = secret
        self.max_attempts = max_attempts
        self.backoff_seconds = backoff_seconds
        self.timeout_seconds = timeout_seconds
        self._heap: list[tuple[float, int, Delivery]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._stopping = False
        self._in_flight = 0
        self.stats = {
            "sent": 0,
            "attempts": 0,
            "failed_attempts": 0,
            "given_up": 0,
            "dropped": 0,
        }
        self.delivered: list[dict] = []  # every successful delivery: body and headers
        self._session = requests.Session()
        self._threads = [
            threading.Thread(target=self._run, name=f"sandbox-callbacks-{i}", daemon=True)
            for i in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    def schedule(self, delivery: Delivery, delay: float = 0.0) -> None:
        with self._cond:
            heapq.heappush(self._heap, (time.monotonic() + delay, next(self._seq), delivery))
            self._cond.notify()

    @property
    def pending(self) -> int:
        with self._cond:
            return len(self._heap) + self._in_flight

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        for thread in self._threads:
            thread.join(timeout=self.timeout_seconds + 1)
        self._session.close()

    def _next(self) -> Delivery | None:
        with self._cond:
            while not self._stopping:
                if self._heap:
                    due, _, delivery = self._heap[0]
                    wait = due - time.monotonic()
                    if wait <= 0:
                        heapq.heappop(self._heap)
                        self._in_flight += 1
                        return delivery
                    self._cond.wait(wait)
                else:
                    self._cond.wait()
            return None

    def _run(self) -> None:
        while True:
            delivery = self._next()
            if delivery is None:
                return
            try:
                self._attempt(delivery)
            except Exception:  # a bug here must not kill the delivery thread
                logger.exception("sandbox callback delivery crashed: %s", delivery.body)
            finally:
                with self._cond:
                    self._in_flight -= 1

    def _attempt(self, delivery: Delivery) -> None:
        if delivery.attempt == 0 and delivery.on_send is not None:
            delivery.on_send()
        if delivery.attempt == 0 and self.on_due is not None:
            self.on_due(delivery.body)
        if delivery.attempt == 0 and self.drops.drops(delivery.body):
            # Never posted, as if the processor lost it: only the events API still lists it.
            with self._cond:
                self.stats["dropped"] += 1
            self._finish(delivery)
            return
        delivery.attempt += 1
        if not self.url:
            # No callback URL configured: nothing to deliver to, but the chain goes on so the
            # debit still reaches its final status.
            self._finish(delivery)
            return
        raw = json.dumps(delivery.body, separators=(",", ":")).encode()
        headers = {
            "Content-Type": "application/json",
            signing.HEADER: signing.sign(raw, [self.secret]),
        }
        error = self._post(raw, headers)
        with self._cond:
            self.stats["attempts"] += 1
            if error is None:
                self.stats["sent"] += 1
                self.delivered.append({"body": delivery.body, "headers": headers, "raw": raw})
            else:
                self.stats["failed_attempts"] += 1
        if error is None:
            self._finish(delivery)
        else:
            self._retry_or_give_up(delivery, error)

    def _post(self, raw: bytes, headers: dict[str, str]) -> str | None:
        """Deliver one signed body; the error when it was not taken (non-2xx or no answer)."""
        try:
            response = self._session.post(
                self.url, data=raw, headers=headers, timeout=self.timeout_seconds
            )
        except requests.RequestException as exc:
            return f"{type(exc).__name__}: {exc}"
        if 200 <= response.status_code < 300:
            return None
        return f"HTTP {response.status_code}: {response.text[:200]}"

    def _retry_or_give_up(self, delivery: Delivery, error: str) -> None:
        """After a failed attempt: again after an exponential backoff, or give up at the limit
        and go on with the debit's next event."""
        if delivery.attempt >= self.max_attempts:
            logger.warning(
                "sandbox gave up delivering %s %s after %s attempts: %s",
                delivery.body.get("event_type"),
                delivery.body.get("processor_event_id"),
                delivery.attempt,
                error,
            )
            with self._cond:
                self.stats["given_up"] += 1
            self._finish(delivery)
            return
        delay = self.backoff_seconds * 2 ** (delivery.attempt - 1)
        logger.info(
            "sandbox callback %s attempt %s failed (%s); retrying in %.2f s",
            delivery.body.get("processor_event_id"),
            delivery.attempt,
            error,
            delay,
        )
        self.schedule(delivery, delay)

    def _finish(self, delivery: Delivery) -> None:
        if delivery.then is not None:
            delivery.then()
