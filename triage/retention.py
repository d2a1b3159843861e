"""Retention purges of triage's growing tables, and of the queue layer's error history (which
only triage can judge: a dead letter still open keeps its messages' errors whatever their age).

Dead letters and triage actions are the audit trail of human decisions: kept by design.
"""

from datetime import timedelta

from django.db.models import Exists, OuterRef
from django.utils import timezone

from callbacks.retention import queue_message_history_purge
from payments.retention import batched_delete
from triage import conf
from triage.models import (
    Alert,
    AlertNotification,
    AlertStatus,
    BulkJobStatus,
    BulkTriageJob,
    BulkTriageJobItem,
    DeadLetter,
    DeadLetterStatus,
)


def error_history_purge(
    *, older_than: timedelta | None = None, batch_size: int | None = None
) -> int:
    """Purge the queue layer's error history past QUEUE_ERROR_RETENTION, dead-lettered
    messages included once their dead letter is closed (redriven, resolved or discarded) —
    never while it is open, nor before it was ingested."""
    closed = DeadLetter.objects.exclude(status=DeadLetterStatus.OPEN).values("original_message_id")
    return queue_message_history_purge(
        closed_message_ids=closed, older_than=older_than, batch_size=batch_size
    )


def alerts_purge(*, older_than: timedelta | None = None, batch_size: int | None = None) -> int:
    """Delete alerts resolved before ALERT_RETENTION with their notifications; a firing alert
    is never touched. Returns how many alerts went."""
    cutoff = timezone.now() - (older_than or conf.ALERT_RETENTION)
    resolved = Alert.objects.filter(status=AlertStatus.RESOLVED, resolved_at__lt=cutoff)

    def notifications_first(ids: list) -> None:
        AlertNotification.objects.filter(alert_id__in=ids).delete()

    return batched_delete(resolved, batch_size=batch_size, before_each=notifications_first)


def bulk_job_items_purge(
    *, older_than: timedelta | None = None, batch_size: int | None = None
) -> int:
    """Delete the per-dead-letter items of bulk jobs that finished (completed or cancelled)
    before BULK_JOB_RETENTION. The job row stays: triage actions (the audit trail) point to it,
    and it keeps the counts. Returns how many items went."""
    cutoff = timezone.now() - (older_than or conf.BULK_JOB_RETENTION)
    finished = BulkTriageJob.objects.filter(
        pk=OuterRef("job_id"),
        status__in=[BulkJobStatus.COMPLETED, BulkJobStatus.CANCELLED],
        finished_at__lt=cutoff,
    )
    return batched_delete(BulkTriageJobItem.objects.filter(Exists(finished)), batch_size=batch_size)
