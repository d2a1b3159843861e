"""Periodic operations work (scheduled by beat, see CELERY_BEAT_SCHEDULE)."""

import logging
import os

from celery import shared_task
from celery.signals import worker_process_shutdown

from payments.kernel.locks import single_flight

logger = logging.getLogger(__name__)


@shared_task(name="triage.tasks.dead_letters_ingest", ignore_result=True)
def dead_letters_ingest() -> int:
    """Move dead letters from the DLQ into the database (idempotent on the message id)."""
    from triage import ingestion

    with single_flight("triage.dead_letters_ingest") as acquired:
        if not acquired:
            return 0
        return ingestion.dead_letters_ingest()


@shared_task(name="triage.tasks.queue_metrics_sample", ignore_result=True)
def queue_metrics_sample() -> dict:
    """Log queue depth, oldest unfinished age, dead letters and holds (read-only)."""
    from triage.operations.monitoring import queue_metrics_sample as sample

    return sample()


@shared_task(name="triage.tasks.alerts_evaluate", ignore_result=True)
def alerts_evaluate() -> dict:
    """Fire the alert conditions that hold and resolve the ones that cleared."""
    from triage.operations.alert_conditions import alerts_evaluate as evaluate

    with single_flight("triage.alerts_evaluate") as acquired:
        if not acquired:
            return {}
        result = evaluate()
    return {"fired": result.fired, "resolved": result.resolved}


@shared_task(name="triage.tasks.beat_heartbeat", ignore_result=True)
def beat_heartbeat() -> str:
    """Record that beat (and a worker taking its tasks) ran; its age is what alerts when beat
    stops (``triage.operations.heartbeat``). No lock: the upsert is one statement."""
    from triage.operations.heartbeat import beat_heartbeat_record

    return beat_heartbeat_record().isoformat()


@shared_task(name="triage.tasks.bulk_job_run", ignore_result=True, acks_late=True)
def bulk_job_run(job_id: int) -> dict:
    """Run one bulk triage job to its end (or its cancel). A redelivered task message (the
    broker's visibility timeout is shorter than a large job) finds the job's lock held by the
    copy still running and steps aside; after a crash the lock is gone and it resumes the job."""
    from triage import bulk

    with single_flight(f"triage.bulk_job:{job_id}") as acquired:
        if not acquired:
            return {"job_id": job_id, "ran": False}
        job = bulk.bulk_job_run(job_id=job_id)
    return {"job_id": job.pk, "ran": True, "status": job.status, "done": job.done}


@shared_task(name="triage.tasks.bulk_jobs_resume_stale", ignore_result=True)
def bulk_jobs_resume_stale() -> list[int]:
    """Start again the bulk jobs that stopped making progress without being interrupted."""
    from triage import bulk

    with single_flight("triage.bulk_jobs_resume_stale") as acquired:
        if not acquired:
            return []
        return bulk.bulk_jobs_resume_stale()


@worker_process_shutdown.connect
def _prometheus_mark_process_dead(pid=None, **kwargs) -> None:
    """In multiprocess metrics mode, drop an exiting pool process's live gauge files."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid or os.getpid())


def _purge(name: str, purge, what: str) -> int:
    with single_flight(name) as acquired:
        if not acquired:
            return 0
        deleted = purge()
    logger.info("purged %s %s past retention", deleted, what)
    return deleted


@shared_task(name="triage.tasks.error_history_purge", ignore_result=True)
def error_history_purge() -> int:
    """Delete error history past QUEUE_ERROR_RETENTION unless its dead letter is still open."""
    from triage import retention

    return _purge("triage.error_history_purge", retention.error_history_purge, "message records")


@shared_task(name="triage.tasks.alerts_purge", ignore_result=True)
def alerts_purge() -> int:
    """Delete resolved alerts past ALERT_RETENTION with their notifications (idempotent)."""
    from triage import retention

    return _purge("triage.alerts_purge", retention.alerts_purge, "resolved alerts")


@shared_task(name="triage.tasks.bulk_job_items_purge", ignore_result=True)
def bulk_job_items_purge() -> int:
    """Delete items of bulk jobs finished before BULK_JOB_RETENTION (idempotent)."""
    from triage import retention

    return _purge("triage.bulk_job_items_purge", retention.bulk_job_items_purge, "bulk job items")
