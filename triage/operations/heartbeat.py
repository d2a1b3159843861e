"""Beat's heartbeat: a tick beat schedules every minute, and the two ways its silence alerts.

Beat runs dead-letter ingestion and alert evaluation, so a stopped beat stops the very alerts
that would say so. The heartbeat is therefore read in two places:

- ``/metrics`` serves ``payments_beat_heartbeat_timestamp_seconds`` (``HeartbeatCollector``),
  read by the web process (at most once per ``METRICS_SNAPSHOT_SECONDS``, as the other
  shared-state gauges): an SRE's own Prometheus alerts when it grows old
  (``deploy/prometheus/payments-rules.yml``), whether beat, the workers or the evaluation
  itself stopped. This is the alert for a beat that is down.
- The in-app condition (``heartbeat_age``, checked by ``alerts_evaluate``) only runs while beat
  does, so it catches the other case: beat ticks and the evaluation runs, but the heartbeat task
  fails or sits in a queue no worker reads.

The time is the database's (``Now()``), as is the age the in-app condition reads, so a worker's
clock that is off does not make a fresh heartbeat look stale.
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.db import DatabaseError
from django.db.models import F
from django.db.models.functions import Now
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from triage.models import BeatHeartbeat

logger = logging.getLogger(__name__)


def beat_heartbeat_record() -> datetime:
    """Record that beat ran now (database time) in the one heartbeat row, and return that time.

    One statement either way: an ``INSERT ... ON CONFLICT DO UPDATE``, so two ticks racing (two
    beats by mistake) both succeed and the row stays one.
    """
    (row,) = BeatHeartbeat.objects.bulk_create(
        [BeatHeartbeat(id=1, beat_at=Now())],
        update_conflicts=True,
        unique_fields=["id"],
        update_fields=["beat_at"],
    )
    return BeatHeartbeat.objects.values_list("beat_at", flat=True).get(pk=row.pk)


def heartbeat_age() -> float | None:
    """Seconds since beat's heartbeat last ran, in database time; ``None`` if it never ran."""
    age = (
        BeatHeartbeat.objects.annotate(age=Now() - F("beat_at"))
        .values_list("age", flat=True)
        .first()
    )
    return None if age is None else age.total_seconds()


class HeartbeatCollector(Collector):
    """``payments_beat_heartbeat_timestamp_seconds``, read from the database (one query; the
    registry serves it through a snapshot, ``monitoring.SnapshotCollector``).

    0 when beat never ran, so ``time() - payments_beat_heartbeat_timestamp_seconds`` alerts on a
    beat that was never started too. Left out when the database cannot be read (the operations
    gauges' ``payments_ops_scrape_error`` says the database is down then): no made-up value.
    """

    def describe(self):
        yield GaugeMetricFamily("payments_beat_heartbeat_timestamp_seconds", "")

    def collect(self):
        try:
            beat_at = BeatHeartbeat.objects.values_list("beat_at", flat=True).first()
        except DatabaseError as exc:
            logger.warning("cannot read beat's heartbeat: %s", exc)
            return
        yield GaugeMetricFamily(
            "payments_beat_heartbeat_timestamp_seconds",
            "Unix time (database clock) of beat's last heartbeat; 0 when beat never ran.",
            value=beat_at.timestamp() if beat_at is not None else 0.0,
        )
