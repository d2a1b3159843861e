"""Helpers for the bulk triage tests: many dead letters at once, and a job built from a filter."""

import uuid

from django.utils import timezone

from triage import bulk
from triage.models import DeadLetter, DeadLetterSource


def dead_letters_bulk_create(count: int, **fields) -> list[DeadLetter]:
    """``count`` open dead letters as ingestion stores them, in one bulk insert per 2,000."""
    now = timezone.now()
    rows = []
    for _ in range(count):
        group = str(uuid.uuid4())
        event_id = f"evt_{uuid.uuid4().hex}"
        body = {
            "kind": "processor_event",
            "payment_id": group,
            "event_type": "settled",
            "processor_event_id": event_id,
            "amount": "125.00",
            "timestamp": "2026-11-02T12:00:00+00:00",
        }
        values = {
            "original_message_id": str(uuid.uuid4()),
            "dlq_message_id": str(uuid.uuid4()),
            "payment_id": uuid.UUID(group),
            "kind": "processor_event",
            "group_id": group,
            "deduplication_id": event_id,
            "processor_event_id": event_id,
            "body": body,
            "source": DeadLetterSource.WORKER,
            "attempts": 6,
            "first_failed_at": now,
            "last_failed_at": now,
            "last_error_class": "payments.exceptions.ProcessorUnavailable",
            "last_error_message": "processor answered 503",
        }
        values.update(fields)
        rows.append(DeadLetter(**values))
    return DeadLetter.objects.bulk_create(rows, batch_size=2000)


def job_for(queryset, *, action: str, user, note: str = "INC-77 processor outage over"):
    """A bulk job on ``queryset`` as the confirmation page creates it (count, then freeze)."""
    selection = bulk.bulk_selection(queryset=queryset)
    return bulk.bulk_job_create(
        action=action,
        queryset=queryset,
        filters="",
        note=note,
        user=user,
        expected_total=selection.open_count,
        max_id=selection.max_id or 0,
    )
