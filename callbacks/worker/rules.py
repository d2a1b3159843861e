"""What the worker's runners go by: the handler of each kind, the attempts and the backoff.

Read once from the settings when the worker is built (``Rules.from_settings``) and handed, with
the messages in hand (``callbacks.worker.hand``), to the batch and per-message runners.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from callbacks import conf as callbacks_conf
from callbacks.handlers import Handler
from callbacks.retry import backoff_delay


@dataclass(frozen=True, kw_only=True)
class Rules:
    """``handlers``: the handler of each message kind; ``max_attempts``: attempts before a
    dead letter (WORKER_MAX_ATTEMPTS); ``max_failed_starts``: starts that did no work before
    one (WORKER_MAX_FAILED_STARTS); the backoff's base and cap, in seconds."""

    handlers: Mapping[str, Handler]
    max_attempts: int
    max_failed_starts: int
    backoff_base: float
    backoff_cap: float

    @classmethod
    def from_settings(cls, handlers: Mapping[str, Handler]) -> Rules:
        return cls(
            handlers=dict(handlers),
            max_attempts=int(callbacks_conf.WORKER_MAX_ATTEMPTS),
            max_failed_starts=int(callbacks_conf.WORKER_MAX_FAILED_STARTS),
            backoff_base=float(callbacks_conf.WORKER_BACKOFF_BASE_SECONDS),
            backoff_cap=float(callbacks_conf.WORKER_BACKOFF_CAP_SECONDS),
        )

    def backoff(self, attempt: int, *, retry_after: float | None = None) -> float:
        """The wait before try ``attempt + 1`` (``callbacks.retry.backoff_delay``)."""
        return backoff_delay(
            attempt, base=self.backoff_base, cap=self.backoff_cap, retry_after=retry_after
        )
