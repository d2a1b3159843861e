"""The circuit breaker around the processor: one shared state for every worker process.

A failing *message* spends its own retry budget and is dead-lettered; a failing *dependency*
must not make every message do that. The breaker tells them apart:

- closed: calls flow. Counted failures (5xx, 408, timeouts, connection errors, 401/403, a 2xx
  with an unusable body) raise ``consecutive_failures``; an answer of a working processor to a
  *submission* (2xx, a message-specific 4xx) resets it: a status read can succeed while debits
  fail, so it resets nothing. It opens after ``PROCESSOR_BREAKER_FAILURES`` in a row, or when
  ``PROCESSOR_BREAKER_FAILURE_RATE`` of the last ``PROCESSOR_BREAKER_WINDOW_CALLS`` first
  submissions of payments failed (none older than ``PROCESSOR_BREAKER_WINDOW_SECONDS``, none
  from before the last close; retries over-sample payments that fail on their own). A window
  of calls, not of time: a flapping processor (every other debit failing) opens it within a
  few failures however busy the healthy period before it was.
- open: nobody calls until ``open_until``. Callers get ``ProcessorCircuitOpen`` before any
  HTTP call; the queue layer takes such a submission off the queue until calls may flow.
- half-open: after the pause, ``PROCESSOR_BREAKER_TRIAL_CALLS`` real submissions are admitted
  (a conditional UPDATE hands out the slots, so across processes no more are). It closes once
  that many succeeded; one failure reopens it. The trial tests what failed, a debit, not a
  status read. A lease (the client's timeouts plus the time a released submission needs to
  come round) bounds a trial whose callers died: after it, a new one starts.
- one incident: closing does not end it. A reopening within
  ``PROCESSOR_BREAKER_INCIDENT_COOLDOWN_SECONDS`` of the close belongs to the same incident: the
  pause keeps doubling (up to ``PROCESSOR_BREAKER_MAX_PAUSE_SECONDS``) and the high alert
  ``processor.unavailable``, raised once, stays firing. Only a close that lasts the cool-down
  resolves the incident and the alert.

- degraded: a closed breaker's failed submission whose failure is spread over other payments
  too (``degraded``: per payment, retries included, some of them through on a retry) is the
  processor's, not the payment's: it spends no retry, and the high alert
  ``processor.degraded`` is raised even if the breaker never opens. A failure pinned to one
  payment or one connection by a round-robin balancer (``failure_interleaved``) is made again
  at once on a new connection; going through then is the processor's failure too.

Independently of the state, a 429 pauses every caller for its ``Retry-After`` (1 s without
one; at most the maximum pause) through ``paused_until``; it is not a failure.

Every time the breaker keeps (``opened_at``, ``open_until``, ``probe_until``, ``paused_until``,
``closed_at``, its transitions' ``created_at``) is the database's clock, and every comparison
with them is made by the database: a worker whose own clock is wrong can neither stretch a
pause past its cap nor ignore another worker's. Every change of state is a conditional UPDATE
(or runs under the row's lock) and writes a ``CircuitBreakerTransition`` row in the same
transaction; alerts are raised and cleared after commit.

Its parts: ``state`` (the row, the database's clock, the numbers from the settings),
``admission`` (may a call go now; the trial's slots), ``record`` (what a call's outcome does),
``transitions`` (open, reopen, close, the incident's end, the 429 pause, the alert) and
``degraded`` (is a failure the processor's, the degradation and its alert). Every name is
importable from here, and callers import it from here.
"""

from payments.processor.breaker.admission import (
    processor_breaker_admit,
    processor_breaker_admit_read,
    processor_breaker_trial_start,
    processor_breaker_wait,
)
from payments.processor.breaker.degraded import (
    alert_degraded_summary,
    failure_interleaved,
    processor_breaker_degraded,
    processor_breaker_degraded_end,
    processor_degraded_reason,
)
from payments.processor.breaker.record import call_outcome, processor_breaker_record
from payments.processor.breaker.state import (
    ALERT_KEY,
    DEFAULT_429_PAUSE_SECONDS,
    DEGRADED_ALERT_KEY,
    NOT_COUNTED_STATUSES,
    PROBE_RECHECK_SECONDS,
    PROCESSOR,
    STATUS_READ,
    SUBMISSION,
    TRIAL_LEASE_MARGIN_SECONDS,
    Admission,
    CallOutcome,
    max_pause_seconds,
    pause_seconds,
    processor_breaker_get,
    trial_calls,
    trial_lease_seconds,
)
from payments.processor.breaker.transitions import (
    alert_unavailable_summary,
    payments_waiting_count,
    processor_breaker_close_when_trials_done,
    processor_breaker_incident_end,
    processor_breaker_pause,
)

__all__ = [
    "ALERT_KEY",
    "DEFAULT_429_PAUSE_SECONDS",
    "DEGRADED_ALERT_KEY",
    "NOT_COUNTED_STATUSES",
    "PROBE_RECHECK_SECONDS",
    "PROCESSOR",
    "STATUS_READ",
    "SUBMISSION",
    "TRIAL_LEASE_MARGIN_SECONDS",
    "Admission",
    "CallOutcome",
    "alert_degraded_summary",
    "alert_unavailable_summary",
    "call_outcome",
    "failure_interleaved",
    "max_pause_seconds",
    "pause_seconds",
    "payments_waiting_count",
    "processor_breaker_admit",
    "processor_breaker_admit_read",
    "processor_breaker_close_when_trials_done",
    "processor_breaker_degraded",
    "processor_breaker_degraded_end",
    "processor_breaker_get",
    "processor_breaker_incident_end",
    "processor_breaker_pause",
    "processor_breaker_record",
    "processor_breaker_trial_start",
    "processor_breaker_wait",
    "processor_degraded_reason",
    "trial_calls",
    "trial_lease_seconds",
]
