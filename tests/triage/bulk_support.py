"""Helpers for the bulk triage tests: many dead letters at once, and a job built from a filter."""

from tests.factories import DeadLetterFactory
from triage import bulk
from triage.models import DeadLetter


def dead_letters_bulk_create(count: int, **fields) -> list[DeadLetter]:
    """``count`` open dead letters as ingestion stores them (the last error a 503 from the
    processor), in one bulk insert per 2,000."""
    fields = {
        "last_error_class": "payments.exceptions.ProcessorUnavailable",
        "last_error_message": "processor answered 503",
        **fields,
    }
    return DeadLetterFactory.bulk(count, **fields)


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
