"""The worker's retry policy: which failures are retried, how long a message hides meanwhile.

Pure functions and constants, no I/O: ``classify`` decides whether a failure is worth another
attempt, ``backoff_delay`` how long to wait before it.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from callbacks.handlers import InvalidBody, UnknownMessageKind
from callbacks.schema import InvalidMessage
from payments.exceptions import PaymentError

MAX_VISIBILITY_SECONDS = 12 * 60 * 60  # SQS's limit for ChangeMessageVisibility


def backoff_delay(
    attempt: int,
    *,
    base: float,
    cap: float,
    retry_after: float | None = None,
    uniform: Callable[[float, float], float] = random.uniform,
) -> float:
    """Seconds to hide a message after its ``attempt``-th failure (1-based).

    Exponential backoff with full jitter: uniform(0, min(cap, base * 2 ** (attempt - 1))); a
    ``retry_after`` the failure carries (e.g. a processor's Retry-After) is a floor.
    """
    if attempt < 1:
        raise ValueError(f"attempt numbers start at 1, got {attempt}")
    ceiling = min(cap, base * 2 ** min(attempt - 1, 62))
    delay = uniform(0, ceiling) if ceiling > 0 else 0.0
    if retry_after is not None and retry_after > delay:
        delay = retry_after
    return min(delay, MAX_VISIBILITY_SECONDS)


def classify(exc: BaseException) -> tuple[bool, float | None]:
    """The worker's one decision on a failure: (retryable, retry_after seconds or None)."""
    if isinstance(exc, InvalidMessage | InvalidBody | UnknownMessageKind):
        return False, None
    if isinstance(exc, PaymentError):
        return bool(exc.retryable), exc.retry_after
    # Database and queue outages, and anything unexpected: retrying may help, and a message
    # that keeps failing is dead-lettered after the attempt limit anyway.
    return True, None
