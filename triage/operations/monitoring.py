"""Prometheus metrics: the counters and histograms of every process, plus shared-state gauges.

Two kinds of metrics:

- Counters and histograms (``payments/metrics.py``, ``callbacks/metrics.py``) are incremented
  by the process that does the work: gunicorn workers (callbacks received), ``run_sqs_worker``
  and Celery workers (messages, transitions, processor latency).
- Gauges that describe shared state (queue depth of the main queue and the DLQ from SQS
  attributes, age of the oldest unfinished message from the ``QueueMessage`` records, open dead
  letters, payments on hold, payments by state, the breaker; the return rates of
  ``return_rates``) are computed by ``OperationsCollector`` and ``ReturnRateCollector``,
  registered once per process. They are never multiprocess gauges: every process would report
  the same database value, and summing them would be wrong.

The shared-state gauges cost SQS calls and queries, and every web pod serves them, so each
process computes them at most once per ``TRIAGE["METRICS_SNAPSHOT_SECONDS"]`` (15) and serves
that snapshot to the scrapes in between (``SnapshotCollector``): a fleet of pods scraped every
few seconds costs one set of reads per pod per interval, not one per scrape.
``payments_ops_snapshot_timestamp_seconds`` says when the snapshot served was taken. The alert
evaluation and the beat's queue sample read ``operations_snapshot()`` fresh.

Several processes on one host (gunicorn workers, worker processes): set
``PROMETHEUS_MULTIPROC_DIR`` to an empty directory writable by all of them, the same for every
process, before any of them starts (the gunicorn configuration in ``config/gunicorn.py`` empties
it when the master starts and calls ``mark_process_dead`` when a worker exits; Celery pool
processes do the same on shutdown, see ``triage/tasks.py``). Each process then writes its
counters to its own files, and ``GET /metrics`` in any gunicorn worker adds them all up with
``MultiProcessCollector``. Without the variable, each process serves its own counters only,
which is right for a single process (``runserver``, one worker) but wrong behind a
multi-worker gunicorn. A worker or relay on another host serves its own counters on
``--metrics-port`` (``callbacks.metrics_server``).

``/metrics``, ``/healthz`` and ``/readyz`` carry no authentication: expose them only to the
monitoring network (a security group, or the load balancer not routing ``/metrics``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import TypeVar

from django.core.signals import setting_changed
from django.db import DatabaseError
from django.db.models import Count
from django.utils import timezone
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from callbacks.metrics_server import counters_registry
from triage import conf as triage_conf

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class OperationsSnapshot:
    """What the operations gauges and the alert policy read; ``None`` = could not be read."""

    main_visible: int | None
    main_in_flight: int | None
    main_delayed: int | None
    dlq_visible: int | None
    dlq_in_flight: int | None
    queue_error: str
    oldest_unfinished_age: float | None  # seconds; None when nothing is unfinished
    unfinished_messages: int | None
    open_dead_letters: int | None
    payments_on_hold: int | None
    payments_by_state: dict[str, int]
    errors: dict[str, str]


def operations_snapshot(*, now: datetime | None = None) -> OperationsSnapshot:
    """Read queue depths from SQS and the rest from the database; each source fails alone."""
    from triage import selectors

    now = now or timezone.now()
    errors: dict[str, str] = {}
    main, dlq = selectors.queue_depths()
    queue_error = "; ".join(depth.error for depth in (main, dlq) if depth.error)
    if queue_error:
        errors["sqs"] = queue_error
    unfinished, oldest_age = _read(
        errors, "queue_messages", lambda: _unfinished_messages(now), (None, None)
    )
    return OperationsSnapshot(
        main_visible=main.visible,
        main_in_flight=main.in_flight,
        main_delayed=main.delayed,
        dlq_visible=dlq.visible,
        dlq_in_flight=dlq.in_flight,
        queue_error=queue_error,
        oldest_unfinished_age=oldest_age,
        unfinished_messages=unfinished,
        open_dead_letters=_read(
            errors,
            "dead_letters",
            lambda: selectors.dead_letters_open_summary(now=now).count,
            None,
        ),
        payments_on_hold=_read(errors, "holds", _payments_on_hold_count, None),
        payments_by_state=_read(errors, "payments", _payments_by_state, _no_payments_by_state()),
        errors=errors,
    )


T = TypeVar("T")


def _read(errors: dict[str, str], source: str, read: Callable[[], T], default: T) -> T:
    """``read()``, or ``default`` with the database's error noted under ``source``."""
    try:
        return read()
    except DatabaseError as exc:
        errors[source] = str(exc)
        return default


def _unfinished_messages(now: datetime) -> tuple[int, float | None]:
    """How many messages the workers started and have not finished, and the oldest one's age
    in seconds."""
    from triage import selectors

    summary = selectors.unfinished_messages(now=now)
    oldest_age = summary.oldest_age.total_seconds() if summary.oldest_age is not None else None
    return summary.count, oldest_age


def _payments_on_hold_count() -> int:
    """Payments on hold for a person; those whose submission waits for the processor (an
    outage hold) are the breaker's story, and leave by themselves."""
    from callbacks.models import HoldKind, PaymentHold

    return (
        PaymentHold.objects.filter(released_at__isnull=True, kind=HoldKind.TRIAGE)
        .values("payment_id")
        .distinct()
        .count()
    )


def _no_payments_by_state() -> dict[str, int]:
    from payments.models import PaymentState

    return {state: 0 for state in PaymentState.values}


def _payments_by_state() -> dict[str, int]:
    from payments.models import Payment

    by_state = _no_payments_by_state()
    for row in Payment.objects.values("state").annotate(n=Count("pk")).order_by():
        by_state[row["state"]] = row["n"]
    return by_state


class OperationsCollector(Collector):
    """Gauges computed from SQS and the database (served through ``SnapshotCollector``).

    A source that cannot be read is left out of the output (no stale or made-up value) and
    ``payments_ops_scrape_error{source}`` says which one failed.
    """

    def describe(self):
        # Names only, so registering the collector does not read SQS and the database.
        for name, labels in (
            ("payments_queue_messages", ["queue", "state"]),
            ("payments_oldest_unfinished_message_age_seconds", None),
            ("payments_unfinished_messages", None),
            ("payments_dead_letters_open", None),
            ("payments_on_hold", None),
            ("payments_by_state", ["state"]),
            ("payments_processor_breaker_state", ["state"]),
            ("payments_processor_breaker_open_seconds", None),
            ("payments_ops_scrape_error", ["source"]),
            ("payments_ops_snapshot_timestamp_seconds", None),
        ):
            yield GaugeMetricFamily(name, "", labels=labels)

    def collect(self):
        snapshot = operations_snapshot()
        yield _queue_depth_gauge(snapshot)
        yield from _database_gauges(snapshot)
        breaker_error = ""
        try:
            yield from _breaker_gauges()
        except DatabaseError as exc:
            breaker_error = str(exc)
        yield _scrape_error_gauge(snapshot, breaker_error=breaker_error)
        yield GaugeMetricFamily(
            "payments_ops_snapshot_timestamp_seconds",
            "Unix time at which the operations gauges served were read (they are read at most "
            "once per METRICS_SNAPSHOT_SECONDS per process).",
            value=time.time(),
        )


def _queue_depth_gauge(snapshot: OperationsSnapshot) -> GaugeMetricFamily:
    depth = GaugeMetricFamily(
        "payments_queue_messages",
        "Approximate number of messages in SQS, by queue (main, dlq) and state "
        "(visible, in_flight, delayed).",
        labels=["queue", "state"],
    )
    for queue, state, value in (
        ("main", "visible", snapshot.main_visible),
        ("main", "in_flight", snapshot.main_in_flight),
        ("main", "delayed", snapshot.main_delayed),
        ("dlq", "visible", snapshot.dlq_visible),
        ("dlq", "in_flight", snapshot.dlq_in_flight),
    ):
        if value is not None:
            depth.add_metric([queue, state], value)
    return depth


def _database_gauges(snapshot: OperationsSnapshot):
    """The gauges read from the database; one whose source failed is left out."""
    if snapshot.unfinished_messages is not None:
        yield GaugeMetricFamily(
            "payments_oldest_unfinished_message_age_seconds",
            "Age (from enqueue) of the oldest message the workers started and have not "
            "finished (in progress or retrying); 0 when there is none.",
            value=snapshot.oldest_unfinished_age or 0.0,
        )
        yield GaugeMetricFamily(
            "payments_unfinished_messages",
            "Messages the workers started and have not finished (in progress or retrying).",
            value=snapshot.unfinished_messages,
        )
    if snapshot.open_dead_letters is not None:
        yield GaugeMetricFamily(
            "payments_dead_letters_open",
            "Dead letters waiting in triage for a human decision.",
            value=snapshot.open_dead_letters,
        )
    if snapshot.payments_on_hold is not None:
        yield GaugeMetricFamily(
            "payments_on_hold",
            "Payments whose later messages are held behind a dead letter.",
            value=snapshot.payments_on_hold,
        )
    by_state = GaugeMetricFamily(
        "payments_by_state", "Payments by current state.", labels=["state"]
    )
    for state, count in sorted(snapshot.payments_by_state.items()):
        by_state.add_metric([state], count)
    yield by_state


def _scrape_error_gauge(snapshot: OperationsSnapshot, *, breaker_error: str) -> GaugeMetricFamily:
    scrape_error = GaugeMetricFamily(
        "payments_ops_scrape_error",
        "1 when a source of the operations gauges could not be read for the snapshot served.",
        labels=["source"],
    )
    for source in ("sqs", "queue_messages", "dead_letters", "holds", "payments"):
        scrape_error.add_metric([source], 1 if source in snapshot.errors else 0)
    scrape_error.add_metric(["breaker"], 1 if breaker_error else 0)
    return scrape_error


def _breaker_gauges():
    """The processor breaker's shared state: one database row, the same for every process."""
    from payments.models import BreakerState, CircuitBreaker
    from payments.processor.breaker import PROCESSOR

    breaker = CircuitBreaker.objects.filter(name=PROCESSOR).first()
    current = breaker.state if breaker is not None else BreakerState.CLOSED
    state = GaugeMetricFamily(
        "payments_processor_breaker_state",
        "The processor's circuit breaker: 1 for its current state (closed, open, half_open).",
        labels=["state"],
    )
    for value in BreakerState.values:
        state.add_metric([value], 1 if value == current else 0)
    yield state
    # A closed breaker in its incident's cool-down is not open: 0 then, as when closed.
    opened_at = (
        breaker.opened_at if breaker is not None and current != BreakerState.CLOSED else None
    )
    yield GaugeMetricFamily(
        "payments_processor_breaker_open_seconds",
        "Seconds since the processor's breaker opened in the current incident (0 when closed).",
        value=max(0.0, (timezone.now() - opened_at).total_seconds()) if opened_at else 0.0,
    )


# The clock the snapshots age by; monotonic, so a clock step never serves a snapshot for hours.
_clock = time.monotonic
# Bumped when a setting the gauges read changes (tests, ``override_settings``): a snapshot taken
# under the old settings (another queue, other thresholds) is not served under the new ones.
_settings_generation = 0


def _settings_changed(*, setting: str, **kwargs) -> None:
    global _settings_generation
    if setting in ("PAYMENTS", "CALLBACKS", "TRIAGE"):
        _settings_generation += 1


setting_changed.connect(_settings_changed)


class SnapshotCollector(Collector):
    """``collector``'s metrics, computed at most once per ``METRICS_SNAPSHOT_SECONDS``.

    The lock makes scrapes that arrive while a snapshot is being read wait for it instead of
    reading their own: at most one set of SQS calls and queries per interval in this process.
    """

    def __init__(self, collector: Collector) -> None:
        self._collector = collector
        self._lock = threading.Lock()
        self._families: list = []
        self._taken_at: float | None = None
        self._generation = -1

    def describe(self):
        return self._collector.describe()

    def collect(self):
        interval = triage_conf.METRICS_SNAPSHOT_SECONDS
        with self._lock:
            now = _clock()
            if (
                self._taken_at is None
                or self._generation != _settings_generation
                or now - self._taken_at >= interval
            ):
                generation = _settings_generation
                self._families = list(self._collector.collect())
                self._taken_at, self._generation = now, generation
            return list(self._families)


_lock = threading.Lock()
_registries: dict[str, CollectorRegistry] = {}


def metrics_registry() -> CollectorRegistry:
    """The registry ``/metrics`` serves, built once per process (and per multiprocess dir):
    the counters (``counters_registry``) plus the shared-state gauges, through snapshots."""
    multiproc_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR", "")
    with _lock:
        registry = _registries.get(multiproc_dir)
        if registry is None:
            from bank.books.monitoring import BooksCollector
            from callbacks.events_pull import ProcessorEventsPullCollector
            from triage.operations.dependencies import DependencyCollector
            from triage.operations.heartbeat import HeartbeatCollector
            from triage.operations.return_rates import ReturnRateCollector

            registry = counters_registry()
            registry.register(SnapshotCollector(OperationsCollector()))
            registry.register(SnapshotCollector(ReturnRateCollector()))
            registry.register(SnapshotCollector(HeartbeatCollector()))
            registry.register(SnapshotCollector(DependencyCollector()))
            registry.register(SnapshotCollector(ProcessorEventsPullCollector()))
            registry.register(SnapshotCollector(BooksCollector()))
            _registries[multiproc_dir] = registry
        return registry


def metrics_text() -> bytes:
    return generate_latest(metrics_registry())


def queue_metrics_sample() -> dict:
    """Read the operations gauges once and log them as one structured line (the beat task):
    a record of queue depth over time even where nobody scrapes ``/metrics``."""
    snapshot = operations_snapshot()
    data = asdict(snapshot)
    logger.info(
        "queue metrics: main visible=%s in_flight=%s dlq=%s oldest_unfinished=%s s "
        "open_dead_letters=%s on_hold=%s errors=%s",
        snapshot.main_visible,
        snapshot.main_in_flight,
        snapshot.dlq_visible,
        None if snapshot.oldest_unfinished_age is None else round(snapshot.oldest_unfinished_age),
        snapshot.open_dead_letters,
        snapshot.payments_on_hold,
        snapshot.errors or "none",
        extra={"queue_metrics": data},
    )
    return data
