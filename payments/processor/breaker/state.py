"""The breaker's row and the numbers every part of it reads: its names, its settings, and the
database's clock (every time the breaker keeps is the database's, see the package)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache

from django.db import IntegrityError, connection, transaction
from django.db.models.functions import Now

from payments import conf as payments_conf
from payments.models import BreakerState, CircuitBreaker

PROCESSOR = "processor"
ALERT_KEY = "processor.unavailable"
DEGRADED_ALERT_KEY = "processor.degraded"
# ProcessorAttempt.operation of a submission (a debit) and of a status read.
SUBMISSION = "submit"
STATUS_READ = "status"
# Retryable answers that say nothing about the processor's health: 409 (our own earlier request
# with this key is still running) and 429 (a pause of its own, not a failure).
NOT_COUNTED_STATUSES = (409, 429)
# While a trial is deciding, look again this soon.
PROBE_RECHECK_SECONDS = 1.0
DEFAULT_429_PAUSE_SECONDS = 1.0
# A trial submission is released from the database, queued and received before it calls: its
# lease covers that as well as the call.
TRIAL_LEASE_MARGIN_SECONDS = 10.0
# Degraded (see ``degraded``): among the other payments of the last DEGRADED_WINDOW_CALLS
# submission calls (none older than PROCESSOR_BREAKER_WINDOW_SECONDS, none from before the last
# close), at least DEGRADED_MIN_PAYMENTS were called, at least DEGRADED_FAILURE_SHARE of them
# had a call fail, and at least DEGRADED_MIN_RECOVERED went through on a retry.
DEGRADED_WINDOW_CALLS = 20
DEGRADED_MIN_PAYMENTS = 5
DEGRADED_FAILURE_SHARE = 0.15
DEGRADED_MIN_RECOVERED = 2


class CallOutcome(enum.StrEnum):
    SUCCESS = "success"  # the processor answered as a working processor does (2xx, 4xx)
    FAILURE = "failure"  # counted: the processor is not working
    NEUTRAL = "neutral"  # says nothing either way (409 in progress, 429 handled as a pause)


@dataclass(frozen=True, kw_only=True)
class Admission:
    """May the caller call the processor now? ``trial``: this call is one of the half-open
    trial's, and its outcome counts toward closing or reopening. ``wait_seconds``: how long to
    stay away when not allowed."""

    allowed: bool
    trial: bool = False
    wait_seconds: float = 0.0
    state: str = BreakerState.CLOSED
    reason: str = ""
    incident: bool = False  # an incident is open (maybe closed, within its cool-down)
    degraded: bool = False  # calls were failing for many payments lately (see ``degraded``)
    # The failures in a row the breaker had counted when it admitted the call: a success of a
    # call admitted at none has no count to reset (``processor_breaker_record``).
    failures: int = 0


def processor_breaker_get() -> CircuitBreaker:
    """The processor's breaker row, created closed on first use."""
    breaker = CircuitBreaker.objects.filter(name=PROCESSOR).first()
    if breaker is not None:
        return breaker
    try:
        with transaction.atomic():
            return CircuitBreaker.objects.create(name=PROCESSOR)
    except IntegrityError:
        return CircuitBreaker.objects.get(name=PROCESSOR)


@cache
def _read_sql() -> tuple[str, list[str]]:
    """The breaker's read with the database's clock (``Now()``'s), its text and the fields it
    reads, built once."""
    fields = CircuitBreaker._meta.concrete_fields
    quote = connection.ops.quote_name
    columns = ", ".join(quote(field.column) for field in fields)
    table = quote(CircuitBreaker._meta.db_table)
    sql = f"SELECT {columns}, STATEMENT_TIMESTAMP() FROM {table} WHERE {quote('name')} = %s"
    return sql, [field.attname for field in fields]


def breaker_read() -> tuple[CircuitBreaker | None, datetime | None]:
    """The breaker row and the database's clock, in one query (no row: never used).

    Every submission reads it twice (the worker's gate, the admission right before the call):
    on PostgreSQL it is a statement built once, not the ORM's compiled on every read."""
    if connection.vendor == "postgresql":
        sql, names = _read_sql()
        with connection.cursor() as cursor:
            cursor.execute(sql, [PROCESSOR])
            row = cursor.fetchone()
        if row is None:
            return None, None
        return CircuitBreaker.from_db(connection.alias, names, row[:-1]), row[-1]
    breaker = CircuitBreaker.objects.annotate(db_now=Now()).filter(name=PROCESSOR).first()
    if breaker is None:
        return None, None
    return breaker, breaker.db_now


def db_in(seconds: float):
    """An expression for the database's now plus ``seconds``."""
    return Now() + timedelta(seconds=seconds)


def trial_calls() -> int:
    return max(1, int(payments_conf.PROCESSOR_BREAKER_TRIAL_CALLS))


def trial_lease_seconds() -> float:
    return (
        float(payments_conf.PROCESSOR_CONNECT_TIMEOUT_SECONDS)
        + float(payments_conf.PROCESSOR_TIMEOUT_SECONDS)
        + TRIAL_LEASE_MARGIN_SECONDS
    )


def max_pause_seconds() -> float:
    return float(payments_conf.PROCESSOR_BREAKER_MAX_PAUSE_SECONDS)


def pause_seconds(reopen_count: int) -> float:
    """The open pause after ``reopen_count`` reopenings in one incident: doubling, capped."""
    base = float(payments_conf.PROCESSOR_BREAKER_PAUSE_SECONDS)
    return min(max_pause_seconds(), base * 2 ** min(reopen_count, 30))
