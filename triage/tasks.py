"""Periodic operations work (scheduled by beat, see CELERY_BEAT_SCHEDULE)."""

import logging
import os

from celery import shared_task
from celery.signals import worker_process_shutdown

from payments.locks import single_flight

logger = logging.getLogger(__name__)


@shared_task(name="triage.tasks.dead_letters_ingest", ignore_result=True)
def dead_letters_ingest() -> int:
    """Move dead letters from the DLQ into the database (idempotent on the message id)."""
    from triage import services

    with single_flight("triage.dead_letters_ingest") as acquired:
        if not acquired:
            return 0
        return services.dead_letters_ingest()


@shared_task(name="triage.tasks.queue_metrics_sample", ignore_result=True)
def queue_metrics_sample() -> dict:
    """Log queue depth, oldest unfinished age, dead letters and holds (read-only)."""
    from triage.monitoring import queue_metrics_sample as sample

    return sample()


@shared_task(name="triage.tasks.alerts_evaluate", ignore_result=True)
def alerts_evaluate() -> dict:
    """Fire the alert conditions that hold and resolve the ones that cleared."""
    from triage.alerting import alerts_evaluate as evaluate

    with single_flight("triage.alerts_evaluate") as acquired:
        if not acquired:
            return {}
        result = evaluate()
    return {"fired": result.fired, "resolved": result.resolved}


@worker_process_shutdown.connect
def _prometheus_mark_process_dead(pid=None, **kwargs) -> None:
    """In multiprocess metrics mode, drop an exiting pool process's live gauge files."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid or os.getpid())
