"""Bulk triage: one action on every open dead letter that matched a changelist filter.

``bulk_job_create`` freezes the matched set when the operator confirms: the open dead letters of
the filter's queryset with an id up to the highest one the confirmation page counted, copied
into ``BulkTriageJobItem`` rows by one ``INSERT … SELECT``. Dead letters that arrive later, or
that leave the filter (someone closed them), are not added; the job acts on what was shown.

``bulk_job_run`` (run by the Celery task ``triage.tasks.bulk_job_run``, which holds a lock per
job so two copies never run the same job) works through the pending items in position order
(oldest ingested first, so a payment's dead letters are handled in the order they died and its
hold is released by the last one, as one by one), in batches, paced to a rate. Each dead letter
goes through the same service as the one-by-one action (``triage.services.ACTIONS``), which
writes its own audit row, linked to the job. Progress is persisted per item: a re-run after a
crash takes the items still pending, and a dead letter the crashed run had already closed (its
service committed, the item's outcome not yet) is recognised by its own status and this job's
audit row, and is counted, never acted on twice.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from celery import current_app
from django.db import connection, transaction
from django.db.models import F, Max, QuerySet
from django.db.models.functions import Coalesce
from django.utils import timezone

from triage import conf as triage_conf
from triage import services
from triage.exceptions import (
    BulkJobNotRunnable,
    BulkSelectionChanged,
    DeadLetterNotOpen,
    NotAllowed,
    RedrivePublishFailed,
    TriageError,
)
from triage.models import (
    UNFINISHED_JOB_STATUSES,
    BulkItemOutcome,
    BulkJobStatus,
    BulkTriageJob,
    BulkTriageJobItem,
    DeadLetter,
    DeadLetterStatus,
    TriageAction,
)

logger = logging.getLogger(__name__)


def bulk_rate_per_second() -> float:
    rate = float(triage_conf.TRIAGE_BULK_RATE_PER_SECOND)
    if rate <= 0:
        raise ValueError(f"TRIAGE_BULK_RATE_PER_SECOND must be above 0, got {rate}")
    return rate


def bulk_stale_seconds() -> int:
    seconds = int(triage_conf.TRIAGE_BULK_STALE_SECONDS)
    if seconds < 1:
        raise ValueError(f"TRIAGE_BULK_STALE_SECONDS must be at least 1, got {seconds}")
    return seconds


def bulk_batch_size() -> int:
    size = int(triage_conf.TRIAGE_BULK_BATCH_SIZE)
    if size < 1:
        raise ValueError(f"TRIAGE_BULK_BATCH_SIZE must be at least 1, got {size}")
    return size


# --- Selection ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Selection:
    """What a filter matches now: its open dead letters up to ``max_id``, and its closed ones."""

    open_count: int
    closed_count: int
    max_id: int | None


def bulk_selection(*, queryset: QuerySet[DeadLetter], max_id: int | None = None) -> Selection:
    """Count what a bulk job on this queryset would act on (open) and leave alone (closed)."""
    queryset = queryset.order_by()
    if max_id is not None:
        queryset = queryset.filter(pk__lte=max_id)
    open_rows = queryset.filter(status=DeadLetterStatus.OPEN)
    found = open_rows.aggregate(top=Max("pk"))
    return Selection(
        open_count=open_rows.count(),
        closed_count=queryset.exclude(status=DeadLetterStatus.OPEN).count(),
        max_id=found["top"] if max_id is None else max_id,
    )


def bulk_job_create(
    *,
    action: str,
    queryset: QuerySet[DeadLetter],
    filters: str,
    note: str,
    user,
    expected_total: int,
    max_id: int,
) -> BulkTriageJob:
    """Freeze the open dead letters of ``queryset`` with an id up to ``max_id`` into a new job
    and start it after the commit.

    ``expected_total`` is the count the operator confirmed; if the set changed since (someone
    closed some of them), ``BulkSelectionChanged`` says so and nothing is created, so a job never
    acts on a number nobody saw.
    """
    if action not in services.ACTIONS:
        raise ValueError(
            f"unknown triage action {action!r}; use one of {', '.join(services.ACTIONS)}"
        )
    note = services.note_clean(note)
    services.operator_check(user)
    open_rows = queryset.order_by().filter(status=DeadLetterStatus.OPEN, pk__lte=max_id)
    ids_sql, params = open_rows.values("pk").query.sql_with_params()
    items = BulkTriageJobItem._meta.db_table
    dead_letters = DeadLetter._meta.db_table
    with transaction.atomic():
        job = BulkTriageJob.objects.create(action=action, filters=filters, note=note, user=user)
        with connection.cursor() as cursor:
            # One statement, whatever the size: the position follows the order the dead letters
            # were ingested, which is the order their payments' messages died in.
            cursor.execute(
                f"INSERT INTO {items} (job_id, dead_letter_id, position, outcome, reason) "
                f"SELECT %s, d.id, ROW_NUMBER() OVER (ORDER BY d.ingested_at, d.id), %s, '' "
                f"FROM {dead_letters} d WHERE d.id IN ({ids_sql})",
                [job.pk, BulkItemOutcome.PENDING, *params],
            )
            total = cursor.rowcount
        if total != expected_total:
            raise BulkSelectionChanged(expected=expected_total, found=total)
        job.total = total
        job.save(update_fields=["total"])
        transaction.on_commit(lambda: _job_start(job.pk))
    logger.warning(
        "bulk %s job %s created by %s for %s dead letter(s): %s",
        action,
        job.pk,
        user,
        total,
        note,
        extra={"bulk_job_id": job.pk},
    )
    return job


# The Celery task that runs a job (``triage.tasks.bulk_job_run``), sent by name: the tasks
# module sits above this one.
BULK_JOB_RUN_TASK = "triage.tasks.bulk_job_run"


def _job_start(job_id: int) -> bool:
    """Enqueue the job's task. The job is committed whatever the broker says: a task that could
    not be enqueued is started by the stale-job sweep (``bulk_jobs_resume_stale``) later."""
    try:
        current_app.send_task(BULK_JOB_RUN_TASK, args=(job_id,))
    except Exception:  # noqa: BLE001 - any broker failure; the sweep retries, nothing is lost
        logger.exception(
            "bulk job %s could not be enqueued; the stale-job sweep will start it",
            job_id,
            extra={"bulk_job_id": job_id},
        )
        return False
    return True


def bulk_jobs_resume_stale(*, now: datetime | None = None) -> list[int]:
    """Enqueue again the jobs nobody is working on: pending or running, with no progress for
    ``TRIAGE_BULK_STALE_SECONDS`` (a lost task message, a worker that died mid-job). A job whose
    task is only slow keeps its lock, and the extra copy steps aside. Interrupted jobs wait for
    an operator's resume: what stopped them (the queue refusing) needs a look first."""
    now = now or timezone.now()
    stale = timedelta(seconds=bulk_stale_seconds())
    ids = list(
        BulkTriageJob.objects.filter(
            status__in=[BulkJobStatus.PENDING, BulkJobStatus.RUNNING],
            updated_at__lt=now - stale,
        )
        .order_by("pk")
        .values_list("pk", flat=True)
    )
    for job_id in ids:
        logger.warning("bulk job %s made no progress for %s: started again", job_id, stale)
        _job_start(job_id)
    return ids


def bulk_job_resume(*, job: BulkTriageJob, user) -> None:
    """Start the job's task again (after a crash, an interruption, or a lost task message); a
    copy still running keeps the job's lock and the new one steps aside."""
    services.operator_check(user)
    if job.status not in UNFINISHED_JOB_STATUSES:
        raise BulkJobNotRunnable(job)
    transaction.on_commit(lambda: _job_start(job.pk))


def bulk_job_cancel(*, job: BulkTriageJob, user) -> BulkTriageJob:
    """Stop the job: the running task stops before its next batch; what it did stays done."""
    services.operator_check(user)
    changed = BulkTriageJob.objects.filter(pk=job.pk, status__in=UNFINISHED_JOB_STATUSES).update(
        status=BulkJobStatus.CANCELLED,
        cancelled_by=user,
        finished_at=timezone.now(),
        updated_at=timezone.now(),
    )
    job.refresh_from_db()
    if not changed:
        raise BulkJobNotRunnable(job)
    logger.warning("bulk job %s cancelled by %s", job.pk, user, extra={"bulk_job_id": job.pk})
    return job


# --- Running -----------------------------------------------------------------------------------


class _JobStop(Exception):
    """Nothing more can be done now (the queue refuses, the user lost the right): the job is
    interrupted, its pending items stay pending for a resume."""


class _Pacer:
    """At most ``rate`` calls of ``wait()`` per second, without bursts to catch up."""

    def __init__(self, rate: float, sleep: Callable[[float], None]) -> None:
        self.interval = 1.0 / rate
        self.sleep = sleep
        self.next_at = time.monotonic()

    def wait(self) -> None:
        now = time.monotonic()
        if now < self.next_at:
            self.sleep(self.next_at - now)
            now = self.next_at
        self.next_at = now + self.interval


def bulk_job_run(
    *,
    job_id: int,
    rate_per_second: float | None = None,
    batch_size: int | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> BulkTriageJob:
    """Work through the job's pending items until none is left, it is cancelled, or it must stop.

    The caller holds the job's lock (``triage.tasks.bulk_job_run``). Never inside a transaction:
    each dead letter's service owns its own, and a redrive publishes outside any.
    """
    rate = bulk_rate_per_second() if rate_per_second is None else rate_per_second
    size = bulk_batch_size() if batch_size is None else batch_size
    started = BulkTriageJob.objects.filter(pk=job_id, status__in=UNFINISHED_JOB_STATUSES).update(
        status=BulkJobStatus.RUNNING,
        started_at=Coalesce(F("started_at"), timezone.now()),
        last_error="",
        updated_at=timezone.now(),
    )
    job = BulkTriageJob.objects.select_related("user").get(pk=job_id)
    if not started:
        logger.info("bulk job %s is %s: nothing to run", job.pk, job.status)
        return job
    service = services.ACTIONS[job.action]
    pacer = _Pacer(rate, sleep)
    try:
        _batches_work(job, service, pacer=pacer, size=size)
    except _JobStop as exc:
        _job_interrupt(job, str(exc))
    except Exception as exc:
        _job_interrupt(job, f"{type(exc).__name__}: {exc}")
        raise
    job.refresh_from_db()
    logger.warning(
        "bulk job %s %s: %s done, %s failed, %s skipped of %s",
        job.pk,
        job.status,
        job.done,
        job.failed,
        job.skipped,
        job.total,
        extra={"bulk_job_id": job.pk},
    )
    return job


def _batches_work(job: BulkTriageJob, service, *, pacer: _Pacer, size: int) -> None:
    """Act on the pending items, a batch at a time, until none is left (the job completes) or
    the job is no longer running (cancelled)."""
    while True:
        # A cancel is seen here, between batches: at most one batch runs after it.
        status = BulkTriageJob.objects.values_list("status", flat=True).get(pk=job.pk)
        if status != BulkJobStatus.RUNNING:
            return
        items = list(
            BulkTriageJobItem.objects.filter(job=job, outcome=BulkItemOutcome.PENDING)
            .select_related("dead_letter")
            .order_by("position")[:size]
        )
        if not items:
            BulkTriageJob.objects.filter(pk=job.pk, status=BulkJobStatus.RUNNING).update(
                status=BulkJobStatus.COMPLETED,
                finished_at=timezone.now(),
                updated_at=timezone.now(),
            )
            return
        for item in items:
            pacer.wait()
            outcome, reason = _item_act(job, item, service)
            _item_record(job, item, outcome, reason)


def _closed_by_this_job(job: BulkTriageJob, dead_letter_id: int) -> bool:
    """Did this job's service call already close it (a run that died before recording it)?"""
    return TriageAction.objects.filter(
        bulk_job=job,
        dead_letter_id=dead_letter_id,
        action=job.action,
        status_before=DeadLetterStatus.OPEN,
    ).exists()


def _item_act(job: BulkTriageJob, item: BulkTriageJobItem, service) -> tuple[BulkItemOutcome, str]:
    dead_letter = item.dead_letter
    if dead_letter.status != DeadLetterStatus.OPEN:
        if _closed_by_this_job(job, dead_letter.pk):
            return BulkItemOutcome.DONE, "closed by this job before a restart"
        return BulkItemOutcome.SKIPPED, f"it was already {dead_letter.status}"
    try:
        result = service(dead_letter=dead_letter, user=job.user, note=job.note, bulk_job=job)
    except DeadLetterNotOpen as exc:
        # Closed by someone else since the batch was read (a redrive that raced records its
        # own audit row, linked to this job, saying what was sent).
        return BulkItemOutcome.SKIPPED, str(exc)
    except NotAllowed as exc:
        raise _JobStop(str(exc)) from exc
    except RedrivePublishFailed as exc:
        # The queue refuses: every next redrive would fail too. The item stays pending (the
        # dead letter is still open, the failed attempt is on its audit trail) for a resume.
        raise _JobStop(str(exc)) from exc
    except TriageError as exc:
        return BulkItemOutcome.FAILED, str(exc)
    if result.release_failed:
        return BulkItemOutcome.DONE, result.release_note
    return BulkItemOutcome.DONE, ""


def _item_record(
    job: BulkTriageJob, item: BulkTriageJobItem, outcome: BulkItemOutcome, reason: str
) -> None:
    counter = {
        BulkItemOutcome.DONE: "done",
        BulkItemOutcome.FAILED: "failed",
        BulkItemOutcome.SKIPPED: "skipped",
    }[outcome]
    with transaction.atomic():
        recorded = BulkTriageJobItem.objects.filter(
            pk=item.pk, outcome=BulkItemOutcome.PENDING
        ).update(outcome=outcome, reason=reason[:2000])
        if recorded:
            BulkTriageJob.objects.filter(pk=job.pk).update(
                **{counter: F(counter) + 1}, updated_at=timezone.now()
            )


def _job_interrupt(job: BulkTriageJob, reason: str) -> None:
    logger.error("bulk job %s interrupted: %s", job.pk, reason, extra={"bulk_job_id": job.pk})
    BulkTriageJob.objects.filter(pk=job.pk, status=BulkJobStatus.RUNNING).update(
        status=BulkJobStatus.INTERRUPTED, last_error=reason[:4000], updated_at=timezone.now()
    )
