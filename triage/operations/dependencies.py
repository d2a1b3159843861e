"""The state of what every replica shares: the database, the main queue, the processor.

For dashboards and alerts (``GET /dependencies``, the gauge ``payments_dependency_up``), never
for readiness: an SQS blip or a processor outage is the same for every replica, so taking them
all out of the load balancer would take the host site down and cure nothing (``/readyz``
checks only what this replica itself lacks, see ``health``).

A probe must not become the load. Each check runs in a thread of its own and is waited for at
most ``CHECK_TIMEOUT_SECONDS``: a hung endpoint answers "no answer" instead of holding the
request, and a check still running from an earlier probe is waited on again rather than started
a second time, so a hung endpoint holds one thread, not one per probe. The results are kept for
``CACHE_SECONDS`` per process, so a storm of probes and scrapes costs one SQS call and two
trivial queries per process per interval. The processor is never called: its state is the
breaker's row, which every worker keeps up to date.

The answers name a dependency and what is wrong with it, never where it lives (hosts, ports,
queue names): those go to the log. Like ``/metrics``, the endpoint has no authentication;
expose it to the monitoring network only.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from datetime import datetime

from django.db import DatabaseError, connection, connections
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

logger = logging.getLogger(__name__)

CHECK_TIMEOUT_SECONDS = 2.0
CACHE_SECONDS = 5.0


@dataclass(frozen=True)
class DependencyState:
    ok: bool
    detail: str
    checked_at: datetime

    def as_dict(self) -> dict:
        return {"ok": self.ok, "detail": self.detail, "checked_at": self.checked_at.isoformat()}


def database_error() -> str:
    """'' when this thread's database connection answers a trivial query, else the error (for
    the log: it may name the host)."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except DatabaseError as exc:
        return f"{type(exc).__name__}: {exc}".strip()
    return ""


def _database_check() -> tuple[bool, str]:
    error = database_error()
    if error:
        logger.warning("dependency database: %s", error)
        return False, f"unreachable ({error.split(':')[0]})"
    return True, "answers"


def _sqs_check() -> tuple[bool, str]:
    from callbacks import sqs

    try:
        sqs.queue_attributes(sqs.main_queue_url(), ["QueueArn"])
    except sqs.QueueRefused as exc:
        logger.warning("dependency sqs: %s", exc)
        return False, f"main queue refused the call ({exc.code or 'no code'})"
    except sqs.QueueUnavailable as exc:
        logger.warning("dependency sqs: %s", exc)
        return False, "main queue unreachable"
    return True, "main queue answers"


def _processor_check() -> tuple[bool, str]:
    """The breaker's state, read from its row: the processor itself is never called."""
    from payments.models import BreakerState, CircuitBreaker
    from payments.processor.breaker import PROCESSOR

    try:
        breaker = CircuitBreaker.objects.filter(name=PROCESSOR).first()
    except DatabaseError as exc:
        logger.warning("dependency processor: breaker unreadable: %s", exc)
        return False, "breaker state unreadable (database unreachable)"
    if breaker is None or breaker.state == BreakerState.CLOSED:
        return True, "breaker closed"
    since = f" since {breaker.opened_at.isoformat()}" if breaker.opened_at else ""
    return False, f"breaker {breaker.state}{since}"


# One entry per dependency: its name in the answer and the gauge's label, and its check.
CHECKS: dict[str, Callable[[], tuple[bool, str]]] = {
    "database": _database_check,
    "sqs": _sqs_check,
    "processor": _processor_check,
}

_executor = ThreadPoolExecutor(max_workers=len(CHECKS), thread_name_prefix="dependency-check")
_lock = threading.Lock()
_running: dict[str, Future] = {}
_cache: tuple[float, dict[str, DependencyState]] | None = None


def _run(check: Callable[[], tuple[bool, str]]) -> tuple[bool, str]:
    try:
        return check()
    finally:
        # The check's thread keeps no connection: one per process every CACHE_SECONDS at most.
        connections.close_all()


def _check_all() -> dict[str, DependencyState]:
    checked_at = timezone.now()
    futures: dict[str, Future] = {}
    for name, check in CHECKS.items():
        future = _running.get(name)
        if future is None or future.done():
            future = _running[name] = _executor.submit(_run, check)
        futures[name] = future
    deadline = time.monotonic() + CHECK_TIMEOUT_SECONDS
    states = {}
    for name, future in futures.items():
        try:
            ok, detail = future.result(timeout=max(0.0, deadline - time.monotonic()))
        except FutureTimeout:
            logger.warning("dependency %s: no answer within %s s", name, CHECK_TIMEOUT_SECONDS)
            ok, detail = False, f"no answer within {CHECK_TIMEOUT_SECONDS:g} s"
        except Exception as exc:
            # A check that broke says nothing about its dependency; it is reported, not raised,
            # so the other dependencies are still reported.
            logger.exception("dependency %s: the check failed", name)
            ok, detail = False, f"check failed ({type(exc).__name__})"
        states[name] = DependencyState(ok=ok, detail=detail, checked_at=checked_at)
    return states


def dependencies_status() -> dict[str, DependencyState]:
    """Each dependency's state, checked at most once per ``CACHE_SECONDS`` in this process.

    Concurrent callers wait for the one check in progress (at most ``CHECK_TIMEOUT_SECONDS``)
    and share its result."""
    global _cache
    with _lock:
        if _cache is None or time.monotonic() - _cache[0] >= CACHE_SECONDS:
            _cache = (time.monotonic(), _check_all())
        return _cache[1]


def dependencies_reset() -> None:
    """Forget the cached results (tests, or an operator who wants an answer now)."""
    global _cache
    with _lock:
        _cache = None


class DependencyCollector(Collector):
    """``payments_dependency_up{dependency}`` from the cached results: 1 up, 0 down."""

    def describe(self):
        # The name only, so registering the collector checks nothing.
        yield GaugeMetricFamily("payments_dependency_up", "", labels=["dependency"])

    def collect(self):
        gauge = GaugeMetricFamily(
            "payments_dependency_up",
            "1 when the dependency (database, sqs: the main queue, processor: its breaker is "
            "closed) answered its last check, else 0; checked at most every "
            f"{CACHE_SECONDS:g} s per process.",
            labels=["dependency"],
        )
        for name, state in dependencies_status().items():
            gauge.add_metric([name], 1 if state.ok else 0)
        yield gauge
