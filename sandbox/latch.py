"""A latch that holds debit requests open at the sandbox, so a test can act mid-call.

A real processor call is in flight for as long as the processor takes; a test that wants to
kill a worker, or let a second worker try the same payment, *while* that call is in flight
needs the call to stay open until it has done so. ``DebitLatch(holds=1)`` holds the first
debit request that reaches it, after the charge is recorded and before the answer is sent (a
processor that charged but whose answer never arrived), until ``release()``.
"""

from __future__ import annotations

import threading


class DebitLatch:
    def __init__(self, *, holds: int = 1, max_hold_seconds: float = 60.0) -> None:
        if holds < 1:
            raise ValueError(f"holds must be at least 1, got {holds}")
        self._remaining = holds
        # A test that fails before releasing must not leave server threads blocked forever.
        self.max_hold_seconds = max_hold_seconds
        self._lock = threading.Lock()
        self._held = threading.Condition(self._lock)
        self._released = threading.Event()
        self.held_keys: list[str] = []
        self.arrivals = 0  # every debit request that reached the latch, held or not

    def hold(self, idempotency_key: str) -> None:
        """Called by the sandbox for each debit request: hold it if holds remain."""
        with self._lock:
            self.arrivals += 1
            self._held.notify_all()
            if self._remaining == 0 or self._released.is_set():
                return
            self._remaining -= 1
            self.held_keys.append(idempotency_key)
            self._held.notify_all()
        self._released.wait(self.max_hold_seconds)

    def wait_held(self, count: int = 1, timeout: float = 30.0) -> list[str]:
        """Wait until ``count`` requests are held; return their idempotency keys."""
        with self._held:
            if not self._held.wait_for(lambda: len(self.held_keys) >= count, timeout):
                raise TimeoutError(f"{count} debit request(s) not held within {timeout} s")
            return list(self.held_keys)

    def wait_arrivals(self, count: int, timeout: float = 30.0) -> None:
        """Wait until ``count`` debit requests reached the latch (held or passed through)."""
        with self._held:
            if not self._held.wait_for(lambda: self.arrivals >= count, timeout):
                raise TimeoutError(
                    f"{count} debit request(s) expected within {timeout} s, got {self.arrivals}"
                )

    def release(self) -> None:
        self._released.set()
