"""Triage's retention purges: error history only once its dead letter is closed, resolved alerts,
items of finished bulk jobs; audit rows and everything still in use stay."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from callbacks.models import ProcessingError, QueueMessage, QueueMessageStatus
from tests.factories import (
    AlertFactory,
    AlertNotificationFactory,
    BulkTriageJobFactory,
    BulkTriageJobItemFactory,
    DeadLetterFactory,
    ProcessingErrorFactory,
    QueueMessageFactory,
)
from triage import retention, tasks
from triage.models import (
    Alert,
    AlertNotification,
    AlertStatus,
    BulkJobStatus,
    BulkTriageJob,
    BulkTriageJobItem,
    DeadLetterStatus,
)

pytestmark = pytest.mark.django_db

OLD = 100  # days


def _ago(days: float):
    return timezone.now() - timedelta(days=days)


def _dead_lettered_message(dead_letter) -> QueueMessage:
    row = QueueMessageFactory(
        message_id=dead_letter.original_message_id,
        group_id=dead_letter.group_id,
        first_started_at=_ago(OLD),
        status=QueueMessageStatus.DEAD_LETTERED,
        finished_at=_ago(OLD),
    )
    ProcessingErrorFactory(queue_message=row, retryable=False)
    return row


def test_error_history_of_an_open_dead_letter_is_never_purged(module_settings):
    module_settings.QUEUE_ERROR_RETENTION = timedelta(days=90)
    still_open = DeadLetterFactory()
    resolved = DeadLetterFactory(status=DeadLetterStatus.RESOLVED)
    discarded = DeadLetterFactory(status=DeadLetterStatus.DISCARDED)
    for dead_letter in (still_open, resolved, discarded):
        _dead_lettered_message(dead_letter)
    # Dead-lettered, but not ingested yet: nobody has decided anything about it.
    not_ingested = QueueMessageFactory(
        message_id="in-the-dlq",
        group_id="g",
        first_started_at=_ago(OLD),
        status=QueueMessageStatus.DEAD_LETTERED,
        finished_at=_ago(OLD),
    )

    assert tasks.error_history_purge() == 2

    kept = set(QueueMessage.objects.values_list("message_id", flat=True))
    assert kept == {still_open.original_message_id, not_ingested.message_id}
    assert list(ProcessingError.objects.values_list("message_id", flat=True)) == [
        still_open.original_message_id
    ]


def test_error_history_of_a_closed_dead_letter_is_kept_for_its_retention(module_settings):
    module_settings.QUEUE_ERROR_RETENTION = timedelta(days=365)
    _dead_lettered_message(DeadLetterFactory(status=DeadLetterStatus.REDRIVEN))

    assert retention.error_history_purge() == 0
    assert retention.error_history_purge(older_than=timedelta(days=30)) == 1


def _alert(key: str, *, resolved_days_ago: float | None, notifications: int = 2) -> Alert:
    alert = AlertFactory(key=key)
    if resolved_days_ago is not None:
        Alert.objects.filter(pk=alert.pk).update(
            status=AlertStatus.RESOLVED, resolved_at=_ago(resolved_days_ago)
        )
    for _ in range(notifications):
        AlertNotificationFactory(alert=alert)
    return alert


def test_alerts_purge_deletes_resolved_alerts_with_their_notifications_in_batches(module_settings):
    module_settings.ALERT_RETENTION = timedelta(days=90)
    for i in range(3):
        _alert(f"old-{i}", resolved_days_ago=OLD)
    _alert("recent", resolved_days_ago=5)
    _alert("firing", resolved_days_ago=None)

    with CaptureQueriesContext(connection) as queries:
        assert retention.alerts_purge(batch_size=2) == 3

    assert set(Alert.objects.values_list("key", flat=True)) == {"recent", "firing"}
    assert AlertNotification.objects.count() == 4
    deletes = [
        q for q in queries.captured_queries if q["sql"].startswith('DELETE FROM "triage_alert"')
    ]
    assert len(deletes) == 2


def _job(status: str, finished_days_ago: float | None, items: int) -> BulkTriageJob:
    job = BulkTriageJobFactory(status=status, total=items)
    if finished_days_ago is not None:
        BulkTriageJob.objects.filter(pk=job.pk).update(finished_at=_ago(finished_days_ago))
    for position in range(items):
        BulkTriageJobItemFactory(job=job, position=position)
    return job


def test_bulk_job_items_purge_deletes_items_of_finished_jobs_and_keeps_the_jobs(module_settings):
    module_settings.BULK_JOB_RETENTION = timedelta(days=30)
    completed = _job(BulkJobStatus.COMPLETED, finished_days_ago=OLD, items=3)
    cancelled = _job(BulkJobStatus.CANCELLED, finished_days_ago=OLD, items=1)
    recent = _job(BulkJobStatus.COMPLETED, finished_days_ago=1, items=1)
    interrupted = _job(BulkJobStatus.INTERRUPTED, finished_days_ago=None, items=2)

    with CaptureQueriesContext(connection) as queries:
        assert tasks.bulk_job_items_purge() == 4

    assert BulkTriageJob.objects.count() == 4
    assert not BulkTriageJobItem.objects.filter(job__in=[completed, cancelled]).exists()
    assert BulkTriageJobItem.objects.filter(job=recent).count() == 1
    assert BulkTriageJobItem.objects.filter(job=interrupted).count() == 2
    assert sum(q["sql"].startswith("DELETE") for q in queries.captured_queries) == 1
