"""Fault injection for the sandbox processor: random faults from a seed, and source-token rules.

Random faults (each a probability in 0..1, drawn from ``random.Random(seed)`` so a run can be
replayed): 5xx answers, 4xx answers, timeouts (the sandbox sleeps past the client's timeout,
then still records the charge, as a real processor does), duplicate callbacks, delayed
callbacks, returns instead of settlements, returns some seconds after settlement, callbacks
dropped (never delivered; drawn from a generator of their own, so a seed replays the other
faults as before). Latency:
lognormal around a median, so it has the heavy tail real processors have.

Source-token rules make tests deterministic. The count N is per source token, over the sandbox's
life (or since ``POST /_sandbox/reset``):

==========================  ===================================================================
``tok_fail5xx_<N>...``      the first N debit calls answer 503, then normal
``tok_timeout_<N>...``      the first N debit calls time out (charge recorded after the sleep)
``tok_429_<N>...``          the first N debit calls answer 429 with ``Retry-After``
``tok_reject...``           every debit call answers 400 (account closed)
``tok_return...``           accepted, then ``returned`` (R01) instead of ``settled``
``tok_nsf...``              accepted, ``settled``, then ``returned`` R01 (NSF) after
                            ``return_after_seconds``: a return after settlement
``tok_unauth...``           accepted, ``settled``, then ``returned`` R10 (unauthorized) after
                            ``return_after_seconds``
``tok_questionable...``     accepted, ``settled``, then ``returned`` R17 whose message says
                            ``QUESTIONABLE`` (the account was opened under false pretenses)
                            after ``return_after_seconds``; no random 4xx or early return
                            takes it another way (a demo counts on the R17)
``tok_steady...``           accepted and ``settled``, always: no random fault (5xx, 4xx,
                            timeout) nor random return takes it another way, for a call the
                            module does not retry (the micro-entries' sends a demo counts on)
``tok_nsfonce...``          as ``tok_nsf`` for the token's first debit only; later debits on it
                            (a reinitiation) settle
``tok_noc...``              accepted, ``settled``, then a ``notification_of_change`` C01
                            after ``return_after_seconds``; ``tok_noc_<Cnn>...`` sends that
                            change code (C01-C14, C61-C69, or any other: an unknown code)
``tok_dupcb...``            every callback is delivered twice
``..._contest...``          (anywhere in a returning token, e.g. ``tok_nsf_contest1``) a
                            dishonor request is answered ``return_dishonored``, then
                            ``dishonor_contested`` (R73 against an R68, else R76); without it,
                            ``return_dishonored`` alone
``..._contestfirst...``     the same, with the contest sent before the dishonor
``...R03...`` (a credit)    a credit (``/v1/ach/credits``) whose destination token names R02,
                            R03, R04 or R23 anywhere (``tok_payout_R03``): ``settled``, then
                            ``returned`` with that code after ``return_after_seconds``
==========================  ===================================================================

A credit's destination token takes the call rules above too (``tok_fail5xx_<N>``,
``tok_timeout_<N>``, ``tok_429_<N>``, ``tok_reject``, ``tok_dupcb``), counted per token with
the debits'; the settlement rules (``tok_return``, ``tok_nsf``, ``tok_noc`` ...) and the random
returns are a debit's only.
"""

from __future__ import annotations

import enum
import os
import random
import re
import threading
from dataclasses import dataclass, fields

_COUNTED_RULE = re.compile(r"^tok_(fail5xx|timeout|429)_(\d+)")
_NOC_RULE = re.compile(r"^tok_noc(?:_(C[0-9]{2}))?")


@dataclass(frozen=True)
class FaultConfig:
    p_5xx: float = 0.0
    p_4xx: float = 0.0
    p_timeout: float = 0.0
    timeout_seconds: float = 12.0  # how long a "timeout" sleeps: past the client's read timeout
    latency_median_ms: float = 0.0  # 0: answer at once
    latency_sigma: float = 1.0  # lognormal shape: 1.0 puts P99 near 10x the median
    latency_max_ms: float = 60_000.0
    p_duplicate_callback: float = 0.0
    p_delayed_callback: float = 0.0
    callback_delay_seconds: float = 5.0
    p_return: float = 0.0
    settle_after_seconds: float = 0.5  # between the submitted and the settled/returned callback
    # Settled debits that come back afterwards: R01 (NSF) mostly, one in four R10 (unauthorized).
    p_settled_return: float = 0.0
    return_after_seconds: float = 2.0  # between the settled and the returned callback
    retry_after_seconds: int = 2  # Retry-After sent with 429
    # Callbacks never delivered, on purpose (sandbox.callbacks.DropPlan): only the events API
    # (GET /v1/events) tells of them.
    p_dropped_callback: float = 0.0

    def __post_init__(self) -> None:
        for name in (
            "p_5xx",
            "p_4xx",
            "p_timeout",
            "p_duplicate_callback",
            "p_delayed_callback",
            "p_return",
            "p_settled_return",
            "p_dropped_callback",
        ):
            _check_probability(name, getattr(self, name))
        if self.p_5xx + self.p_4xx + self.p_timeout > 1:
            raise ValueError("p_5xx + p_4xx + p_timeout must not exceed 1")
        for name in (
            "timeout_seconds",
            "latency_median_ms",
            "latency_max_ms",
            "callback_delay_seconds",
            "settle_after_seconds",
            "return_after_seconds",
            "retry_after_seconds",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be zero or more, got {getattr(self, name)}")
        if self.latency_sigma <= 0:
            raise ValueError(f"latency_sigma must be above zero, got {self.latency_sigma}")

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, **overrides) -> FaultConfig:
        """Read ``SANDBOX_<FIELD>`` variables (e.g. ``SANDBOX_P_5XX=0.1``); overrides win."""
        environ = os.environ if environ is None else environ
        values: dict = {}
        for f in fields(cls):
            raw = environ.get(f"SANDBOX_{f.name.upper()}")
            if raw is not None and raw != "":
                cast = int if f.type in ("int", int) else float
                try:
                    values[f.name] = cast(raw)
                except ValueError:
                    raise ValueError(
                        f"SANDBOX_{f.name.upper()}={raw!r} is not a valid {cast.__name__}"
                    ) from None
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


def _check_probability(name: str, value: float) -> None:
    if not 0 <= value <= 1:
        raise ValueError(f"{name} must be a probability within 0..1, got {value}")


class FaultKind(enum.StrEnum):
    """What goes wrong with one debit call."""

    NONE = "none"
    SERVER_ERROR = "5xx"  # 503, nothing charged
    REJECTED = "4xx"  # 400 account closed (R02), nothing charged
    TIMEOUT = "timeout"  # answered after the client's read timeout; the charge is made
    RATE_LIMITED = "429"  # 429 with Retry-After, nothing charged


@dataclass(frozen=True)
class DebitFault:
    kind: FaultKind
    latency_seconds: float = 0.0


# The fault a ``tok_<rule>_<n>`` token gets on its first n calls.
_COUNTED_FAULTS = {
    "fail5xx": FaultKind.SERVER_ERROR,
    "timeout": FaultKind.TIMEOUT,
    "429": FaultKind.RATE_LIMITED,
}


class FaultPlan:
    """Decides, call by call, what goes wrong. Thread-safe: the server handles calls in threads."""

    def __init__(self, config: FaultConfig, seed: int | None = None) -> None:
        self.config = config
        self.seed = seed
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self._token_calls: dict[str, int] = {}

    def reset(self) -> None:
        with self._lock:
            self._random = random.Random(self.seed)
            self._token_calls.clear()

    def calls_for(self, source_token: str) -> int:
        """How many debit calls named this token so far (counted as they arrive)."""
        with self._lock:
            return self._token_calls.get(source_token, 0)

    def debit_fault(self, source_token: str) -> DebitFault:
        config = self.config
        with self._lock:
            calls = self._token_calls.get(source_token, 0) + 1
            self._token_calls[source_token] = calls
            latency = 0.0
            if config.latency_median_ms > 0:
                sample = config.latency_median_ms * self._random.lognormvariate(
                    0.0, config.latency_sigma
                )
                latency = min(sample, config.latency_max_ms) / 1000
            draw = self._random.random()
        rule = _COUNTED_RULE.match(source_token)
        if rule and calls <= int(rule.group(2)):
            return DebitFault(_COUNTED_FAULTS[rule[1]])
        if source_token.startswith("tok_reject"):
            return DebitFault(FaultKind.REJECTED)
        if source_token.startswith(("tok_questionable", "tok_steady")):
            return DebitFault(FaultKind.NONE, latency)
        if draw < config.p_5xx:
            return DebitFault(FaultKind.SERVER_ERROR, latency)
        if draw < config.p_5xx + config.p_4xx:
            return DebitFault(FaultKind.REJECTED, latency)
        if draw < config.p_5xx + config.p_4xx + config.p_timeout:
            return DebitFault(FaultKind.TIMEOUT, latency)
        return DebitFault(FaultKind.NONE, latency)

    def returns(self, source_token: str) -> bool:
        if source_token.startswith("tok_return"):
            return True
        if source_token.startswith(("tok_questionable", "tok_steady")):
            return False
        return self._chance(self.config.p_return)

    def settled_return_code(self, source_token: str, *, first_debit: bool = True) -> str | None:
        """The reason code of a return that follows this debit's settlement, or ``None``.
        ``first_debit``: no earlier debit named the token (``tok_nsfonce`` returns only that)."""
        if source_token.startswith("tok_nsfonce"):
            return "R01" if first_debit else None
        if source_token.startswith("tok_nsf"):
            return "R01"
        if source_token.startswith("tok_unauth"):
            return "R10"
        if source_token.startswith("tok_questionable"):
            return "R17"
        if source_token.startswith("tok_steady"):
            return None
        if self._chance(self.config.p_settled_return):
            return "R10" if self._chance(0.25) else "R01"
        return None

    def settled_change_code(self, source_token: str) -> str | None:
        """The change code of a notification of change that follows settlement, or ``None``."""
        rule = _NOC_RULE.match(source_token)
        if rule is None:
            return None
        return rule.group(1) or "C01"

    def duplicates(self, source_token: str) -> bool:
        if source_token.startswith("tok_dupcb"):
            return True
        return self._chance(self.config.p_duplicate_callback)

    def callback_delay(self) -> float:
        return (
            self.config.callback_delay_seconds
            if self._chance(self.config.p_delayed_callback)
            else 0.0
        )

    def chance(self, probability: float) -> bool:
        """True with ``probability``, from the plan's seeded random (a run can be replayed)."""
        return self._chance(probability)

    def _chance(self, probability: float) -> bool:
        if probability <= 0:
            return False
        with self._lock:
            return self._random.random() < probability
