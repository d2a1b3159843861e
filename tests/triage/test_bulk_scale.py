"""Triage at incident scale: a changelist over 100,000 dead letters, and a bulk redrive of
10,000 through the real task, the real SQS server and PostgreSQL."""

import logging
import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from tests.triage.bulk_support import dead_letters_bulk_create
from tests.triage.deadletters import operator
from triage import tasks
from triage.models import (
    BulkJobStatus,
    BulkTriageJob,
    DeadLetter,
    DeadLetterStatus,
    TriageAction,
    TriageActionKind,
)

pytestmark = pytest.mark.scale

logger = logging.getLogger(__name__)

PAGES = [
    "",
    "?p=900",
    "?status__exact=open",
    "?status__exact=open&p=700",
    "?kind__exact=submit_payment",
    "?error_class=payments.exceptions.InvalidTransition&status__exact=open",
    "?age=lt_1h&source__exact=worker",
    "?q=g123",
]


def dead_letters_fill(count: int, *, first: int = 1) -> None:
    """``count`` dead letters, in one statement (a mix of kinds, error classes and statuses,
    ingested a second apart), and fresh planner statistics as a live table has them."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO triage_deadletter (original_message_id, dlq_message_id, payment_id, kind,
              group_id, deduplication_id, processor_event_id, body, attributes, source, attempts,
              first_failed_at, last_failed_at, last_error_class, last_error_message, status,
              ingested_at, status_changed_at, redrive_message_id)
            SELECT 'm' || g, 'd' || g, gen_random_uuid(),
              CASE WHEN g %% 3 = 0 THEN 'submit_payment' ELSE 'processor_event' END,
              'g' || g, 'e' || g, 'e' || g, '{"kind": "processor_event"}'::jsonb, '{}'::jsonb,
              'worker', 6, now(), now(),
              CASE WHEN g %% 5 = 0 THEN 'payments.exceptions.InvalidTransition'
                   ELSE 'payments.exceptions.ProcessorUnavailable' END,
              'processor answered 503', CASE WHEN g %% 4 = 0 THEN 'resolved' ELSE 'open' END,
              now() - (g || ' seconds')::interval, now(), ''
            FROM generate_series(%s::integer, %s::integer) g
            """,
            [first, first + count - 1],
        )
        cursor.execute("ANALYZE triage_deadletter")


def page_queries(client, query: str) -> list[dict]:
    url = reverse("admin:triage_deadletter_changelist") + query
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    assert response.status_code == 200
    return captured.captured_queries


def plan(sql: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN {sql}")
        return "\n".join(row[0] for row in cursor.fetchall())


@pytest.mark.django_db
def test_the_changelist_over_100000_dead_letters_takes_as_many_queries_as_over_10(client):
    client.force_login(operator())
    dead_letters_fill(10)
    small = {query: len(page_queries(client, query)) for query in PAGES}

    dead_letters_fill(100_000 - 10, first=11)
    assert DeadLetter.objects.count() == 100_000
    for query in PAGES:
        started = time.monotonic()
        queries = page_queries(client, query)
        elapsed = time.monotonic() - started
        logger.warning("changelist%s at 100,000 rows: %.0f ms", query or " page 1", elapsed * 1000)
        assert len(queries) == small[query], query

    # The page's rows come from an index in the list's order, never from sorting the table.
    for query in ["?p=900", "?status__exact=open&p=700", "?status__exact=resolved&p=400"]:
        rows_sql = next(
            q["sql"] for q in page_queries(client, query) if "LIMIT 50 OFFSET" in q["sql"]
        )
        shown = plan(rows_sql)
        nodes = [line.strip().removeprefix("->").strip() for line in shown.splitlines()]
        assert "Seq Scan" not in shown, shown
        # An incremental sort only orders rows of equal ingested_at, read in index order.
        assert not any(node.startswith("Sort  (") for node in nodes), shown


@pytest.mark.django_db(transaction=True)
def test_redrive_all_matching_of_10000_runs_in_the_background_with_one_audit_row_each(
    client, sqs_queues, module_settings
):
    module_settings.TRIAGE_BULK_RATE_PER_SECOND = (
        100_000  # pacing has its own test; this one is size
    )
    module_settings.TRIAGE_BULK_BATCH_SIZE = 500
    client.force_login(operator())
    dead_letters_bulk_create(5)
    queries_small = len(page_queries(client, "?status__exact=open&p=1"))

    started = time.monotonic()
    matching = dead_letters_bulk_create(10_000 - 5)
    outside = dead_letters_bulk_create(50, last_error_class="payments.exceptions.InvalidTransition")
    logger.warning("10,045 dead letters bulk-created in %.1f s", time.monotonic() - started)
    filters = "error_class=payments.exceptions.ProcessorUnavailable&status__exact=open"
    url = reverse("admin:triage_deadletter_bulk_all", args=["redrive"])

    page = client.get(url, {"_changelist_filters": filters}).content.decode()
    assert "<strong>10000</strong> open dead letters match" in page
    started = time.monotonic()
    response = client.post(
        url,
        {
            "_changelist_filters": filters,
            "expected": "10000",
            "max_id": str(max(d.pk for d in matching + outside)),
            "note": "INC-90 processor back after the outage",
        },
    )
    logger.warning("job of 10,000 confirmed and frozen in %.2f s", time.monotonic() - started)
    job = BulkTriageJob.objects.get()
    assert response.status_code == 302 and job.total == 10_000

    started = time.monotonic()
    result = tasks.bulk_job_run(job.pk)
    elapsed = time.monotonic() - started
    logger.warning("10,000 redrives by the bulk task in %.1f s (%.0f/s)", elapsed, 10_000 / elapsed)

    job.refresh_from_db()
    assert result["ran"] is True
    assert (job.status, job.done, job.failed, job.skipped) == (
        BulkJobStatus.COMPLETED,
        10_000,
        0,
        0,
    )
    redrives = TriageAction.objects.filter(bulk_job=job, action=TriageActionKind.REDRIVE)
    per_letter = list(redrives.values_list("dead_letter_id", flat=True))
    assert len(per_letter) == len(set(per_letter)) == 10_000
    assert DeadLetter.objects.filter(status=DeadLetterStatus.REDRIVEN).count() == 10_000
    assert set(
        DeadLetter.objects.filter(pk__in=[d.pk for d in outside]).values_list("status", flat=True)
    ) == {DeadLetterStatus.OPEN}
    attributes = sqs_queues.client.get_queue_attributes(
        QueueUrl=sqs_queues.url, AttributeNames=["ApproximateNumberOfMessages"]
    )["Attributes"]
    assert int(attributes["ApproximateNumberOfMessages"]) == 10_000

    for query in ["?status__exact=open&p=1", "?status__exact=redriven&p=150"]:
        assert len(page_queries(client, query)) == queries_small, query
    progress = client.get(reverse("admin:triage_bulktriagejob_change", args=[job.pk]))
    assert "10000 of 10000 handled: 10000 done" in progress.content.decode()
