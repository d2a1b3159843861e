"""Bulk triage: "all matching this filter" from the changelist to a background job, and back."""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from django.db import connection, connections
from django.urls import reverse

from callbacks.models import ParkedMessage, PaymentHold
from payments.kernel.locks import _lock_key
from payments.models import PaymentEvent
from tests.factories import DeadLetterFactory, PaymentFactory
from tests.triage.bulk_support import dead_letters_bulk_create, job_for
from tests.triage.deadletters import event_publish, operator, viewer, worker_run
from tests.waiting import wait_for
from triage import bulk, ingestion, services, tasks
from triage.exceptions import BulkSelectionChanged, NotAllowed
from triage.models import (
    BulkItemOutcome,
    BulkJobStatus,
    BulkTriageJob,
    DeadLetter,
    DeadLetterStatus,
    TriageAction,
    TriageActionKind,
)

ROOT = Path(__file__).resolve().parents[2]


def bulk_all_url(action: str, filters: str = "") -> str:
    url = reverse("admin:triage_deadletter_bulk_all", args=[action])
    return f"{url}?_changelist_filters={filters}" if filters else url


def job_url(job) -> str:
    return reverse("admin:triage_bulktriagejob_change", args=[job.pk])


def audit_rows(job, action=None):
    rows = TriageAction.objects.filter(bulk_job=job)
    return rows.filter(action=action or job.action)


# --- Confirmation: the count the operator sees is what the job acts on -------------------------


@pytest.mark.django_db
def test_the_changelist_offers_all_matching_with_its_filter_to_an_operator_only(client):
    DeadLetterFactory(kind="submit_payment")
    changelist = reverse("admin:triage_deadletter_changelist")
    client.force_login(operator())
    page = client.get(f"{changelist}?kind__exact=submit_payment&p=1").content.decode()
    assert "Redrive all matching" in page
    # The page number is not part of the filter.
    assert (
        bulk_all_url("redrive", "kind__exact%3Dsubmit_payment") + '" class="triage-bulk-all"'
        in page
    )

    client.force_login(viewer())
    assert "all matching" not in client.get(changelist).content.decode()


@pytest.mark.django_db
def test_confirming_all_matching_freezes_exactly_the_open_ones_of_the_filter(
    client, django_capture_on_commit_callbacks
):
    submits = dead_letters_bulk_create(5, kind="submit_payment")
    events = dead_letters_bulk_create(3, kind="processor_event")
    closed = DeadLetterFactory(kind="submit_payment", status=DeadLetterStatus.RESOLVED)
    client.force_login(operator())
    url = bulk_all_url("resolve", "kind__exact%3Dsubmit_payment")

    page = client.get(url).content.decode()
    assert "<strong>5</strong> open dead letters match" in page
    assert "1 closed one matching it is left alone" in page

    later = dead_letters_bulk_create(2, kind="submit_payment")  # arrive after the page
    max_id = max(d.pk for d in submits + events + [closed])
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = client.post(
            url,
            {
                "_changelist_filters": "kind__exact=submit_payment",
                "expected": "5",
                "max_id": str(max_id),
                "note": "INC-77 processor outage over",
            },
        )
    job = BulkTriageJob.objects.get()
    assert response.status_code == 302
    assert response["Location"] == job_url(job)
    assert len(callbacks) == 1  # the task is started after the commit
    assert (job.action, job.total, job.status) == ("resolve", 5, BulkJobStatus.PENDING)
    assert job.filters == "kind__exact=submit_payment"
    frozen = list(job.items.order_by("position").values_list("dead_letter_id", flat=True))
    assert frozen == [d.pk for d in submits]

    tasks.bulk_job_run(job.pk)

    statuses = dict(DeadLetter.objects.values_list("pk", "status"))
    assert all(statuses[d.pk] == DeadLetterStatus.RESOLVED for d in submits)
    assert all(statuses[d.pk] == DeadLetterStatus.OPEN for d in events + later)
    assert sorted(audit_rows(job).values_list("dead_letter_id", flat=True)) == sorted(
        d.pk for d in submits
    )
    assert set(audit_rows(job).values_list("note", "user_id")) == {
        ("INC-77 processor outage over", job.user_id)
    }


@pytest.mark.django_db
def test_a_selection_that_shrank_since_the_page_starts_nothing_and_shows_the_new_count(client):
    rows = dead_letters_bulk_create(4)
    client.force_login(operator())
    url = bulk_all_url("discard")
    services.dead_letter_resolve(dead_letter=rows[0], user=operator(), note="fixed by hand")

    response = client.post(
        url,
        {"expected": "4", "max_id": str(max(d.pk for d in rows)), "note": "INC-78"},
    )
    page = response.content.decode()
    assert response.status_code == 200
    assert "4 open dead letter(s) were confirmed, 3 match now" in page
    assert "<strong>3</strong> open dead letters match" in page
    assert not BulkTriageJob.objects.exists()
    assert DeadLetter.objects.filter(status=DeadLetterStatus.DISCARDED).count() == 0


@pytest.mark.django_db
def test_the_service_refuses_a_count_nobody_saw():
    dead_letters_bulk_create(3)
    with pytest.raises(BulkSelectionChanged, match="3 match now"):
        bulk.bulk_job_create(
            action="resolve",
            queryset=DeadLetter.objects.all(),
            filters="",
            note="x",
            user=operator(),
            expected_total=2,
            max_id=10**12,
        )
    assert not BulkTriageJob.objects.exists()


@pytest.mark.django_db
def test_all_matching_confirmation_needs_a_note(client):
    rows = dead_letters_bulk_create(2)
    client.force_login(operator())
    response = client.post(
        bulk_all_url("discard"), {"expected": "2", "max_id": str(rows[-1].pk), "note": " "}
    )
    assert response.status_code == 200
    assert "A note is required" in response.content.decode()
    assert not BulkTriageJob.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    "filters",
    ["nonexistent_field%3D1", "attempts__gt%3Dabc", "status__exact%3Dopen%26payment_id%3Dzz"],
)
def test_a_malformed_filter_answers_400_naming_it(client, filters):
    dead_letters_bulk_create(1)
    client.force_login(operator())
    response = client.get(bulk_all_url("resolve", filters))
    assert response.status_code == 400
    assert "filter" in response.content.decode()
    assert not BulkTriageJob.objects.exists()


@pytest.mark.django_db
def test_a_filter_matching_no_open_dead_letter_goes_back_with_a_message(client):
    DeadLetterFactory(status=DeadLetterStatus.RESOLVED)
    client.force_login(operator())
    response = client.get(bulk_all_url("redrive"), follow=True)
    assert "No open dead letter matches this filter" in response.content.decode()


# --- Permission ----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_without_the_act_permission_every_bulk_page_and_control_is_403(client):
    rows = dead_letters_bulk_create(2)
    job = job_for(DeadLetter.objects.all(), action="resolve", user=operator())
    client.force_login(viewer())
    assert client.get(bulk_all_url("resolve")).status_code == 403
    post = {"expected": "2", "max_id": str(rows[-1].pk), "note": "no"}
    assert client.post(bulk_all_url("resolve"), post).status_code == 403
    for name in ("cancel", "resume"):
        url = reverse(f"admin:triage_bulktriagejob_{name}", args=[job.pk])
        assert client.post(url).status_code == 403
    # Viewing the progress is allowed, without the buttons.
    page = client.get(job_url(job)).content.decode()
    assert "0 of 2 handled" in page
    assert "Cancel this job" not in page
    job.refresh_from_db()
    assert job.status == BulkJobStatus.PENDING
    with pytest.raises(NotAllowed):
        job_for(DeadLetter.objects.all(), action="resolve", user=viewer())


@pytest.mark.django_db
def test_a_job_whose_user_lost_the_permission_stops_and_acts_on_nothing_more():
    dead_letters_bulk_create(3)
    user = operator()
    job = job_for(DeadLetter.objects.all(), action="discard", user=user)
    user.user_permissions.clear()

    job = bulk.bulk_job_run(job_id=job.pk, rate_per_second=1000)

    assert job.status == BulkJobStatus.INTERRUPTED
    assert "lacks the permission triage.act_on_deadletter" in job.last_error
    assert DeadLetter.objects.filter(status=DeadLetterStatus.OPEN).count() == 3
    assert job.items.filter(outcome=BulkItemOutcome.PENDING).count() == 3


# --- Running: outcomes, pacing, failures ----------------------------------------------------------


@pytest.mark.django_db
def test_closed_in_the_meantime_is_skipped_and_a_refused_one_is_failed_with_its_reason(
    sqs_queues,
):
    ok = dead_letters_bulk_create(2)
    unredrivable = DeadLetterFactory(body={"raw_body": "not json"}, kind="")
    job = job_for(DeadLetter.objects.all(), action="redrive", user=operator())
    services.dead_letter_discard(dead_letter=ok[1], user=operator(), note="by hand")

    job = bulk.bulk_job_run(job_id=job.pk, rate_per_second=1000)

    assert (job.status, job.done, job.failed, job.skipped) == (BulkJobStatus.COMPLETED, 1, 1, 1)
    outcomes = dict(job.items.values_list("dead_letter_id", "outcome"))
    assert outcomes == {ok[0].pk: "done", ok[1].pk: "skipped", unredrivable.pk: "failed"}
    failed = job.items.get(outcome="failed")
    assert "cannot be redriven" in failed.reason
    assert list(audit_rows(job).values_list("dead_letter_id", flat=True)) == [ok[0].pk]


@pytest.mark.django_db
def test_the_job_is_paced_to_the_configured_rate():
    dead_letters_bulk_create(12)
    job = job_for(DeadLetter.objects.all(), action="resolve", user=operator())
    started = time.monotonic()
    job = bulk.bulk_job_run(job_id=job.pk, rate_per_second=40, batch_size=5)
    elapsed = time.monotonic() - started
    assert job.done == 12
    assert elapsed >= 11 / 40  # 12 actions at 40/s: the last one no sooner than 0.275 s


@pytest.mark.django_db
def test_the_rate_and_batch_settings_are_validated(module_settings):
    module_settings.TRIAGE_BULK_RATE_PER_SECOND = 0
    with pytest.raises(ValueError, match="TRIAGE_BULK_RATE_PER_SECOND must be above 0"):
        bulk.bulk_rate_per_second()
    module_settings.TRIAGE_BULK_BATCH_SIZE = 0
    with pytest.raises(ValueError, match="TRIAGE_BULK_BATCH_SIZE must be at least 1"):
        bulk.bulk_batch_size()


@pytest.mark.django_db(transaction=True)
def test_a_queue_outage_interrupts_the_job_and_a_resume_finishes_it(sqs_queues, module_settings):
    rows = dead_letters_bulk_create(4)
    job = job_for(DeadLetter.objects.all(), action="redrive", user=operator())
    from callbacks import sqs

    real_endpoint = module_settings.SQS_ENDPOINT_URL
    module_settings.SQS_ENDPOINT_URL = "http://127.0.0.1:9"  # nothing listens there
    sqs.reset()

    job = bulk.bulk_job_run(job_id=job.pk, rate_per_second=1000)

    assert job.status == BulkJobStatus.INTERRUPTED
    assert "did not accept the redrive" in job.last_error
    assert DeadLetter.objects.filter(status=DeadLetterStatus.OPEN).count() == 4
    first = job.items.order_by("position").first()
    assert first.outcome == BulkItemOutcome.PENDING
    assert audit_rows(job).get().details["outcome"] == "publish_failed"

    module_settings.SQS_ENDPOINT_URL = real_endpoint
    sqs.reset()
    job = bulk.bulk_job_run(job_id=job.pk, rate_per_second=1000)

    assert (job.status, job.done) == (BulkJobStatus.COMPLETED, 4)
    assert DeadLetter.objects.filter(status=DeadLetterStatus.REDRIVEN).count() == 4
    published = audit_rows(job).filter(status_after=DeadLetterStatus.REDRIVEN)
    assert sorted(published.values_list("dead_letter_id", flat=True)) == [d.pk for d in rows]


@pytest.mark.django_db(transaction=True)
def test_holds_are_released_in_each_payments_order_by_its_last_dead_letter(
    sqs_queues, module_settings
):
    module_settings.WORKER_BACKOFF_BASE_SECONDS = 0
    module_settings.WORKER_BACKOFF_CAP_SECONDS = 0
    payment = PaymentFactory()
    event_publish(payment, "settled")  # dies: no transition from pending
    submitted, _ = event_publish(payment, "submitted")
    settled, _ = event_publish(payment, "settled")
    worker_run()
    assert ingestion.dead_letters_ingest() == 1
    other = DeadLetterFactory()
    job = job_for(DeadLetter.objects.all(), action="resolve", user=operator())

    job = bulk.bulk_job_run(job_id=job.pk, rate_per_second=1000)

    assert (job.status, job.done) == (BulkJobStatus.COMPLETED, 2)
    assert not PaymentHold.objects.filter(payment_id=str(payment.id), released_at=None).exists()
    release = audit_rows(job, TriageActionKind.RELEASE_HOLD).get()
    assert release.details["republished"] == 2
    assert other.pk in audit_rows(job).values_list("dead_letter_id", flat=True)
    assert not ParkedMessage.objects.filter(payment_id=str(payment.id), released_at=None).exists()
    worker_run()
    applied = list(
        PaymentEvent.objects.filter(payment=payment, kind="processor_event")
        .order_by("created_at", "id")
        .values_list("processor_event_id", flat=True)
    )
    assert applied[:2] == [submitted.processor_event_id, settled.processor_event_id]


# --- Cancel, resume after a crash, one copy at a time ----------------------------------------


@pytest.mark.django_db(transaction=True)
def test_cancel_from_the_admin_stops_a_running_job_before_its_next_batch(client):
    dead_letters_bulk_create(60)
    job = job_for(DeadLetter.objects.all(), action="discard", user=operator())
    errors = []

    def run():
        try:
            bulk.bulk_job_run(job_id=job.pk, rate_per_second=50, batch_size=5)
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)
        finally:
            connections.close_all()

    runner = threading.Thread(target=run)
    runner.start()
    wait_for(lambda: BulkTriageJob.objects.get(pk=job.pk).done >= 10, 60, "ten letters done")
    client.force_login(operator())
    response = client.post(reverse("admin:triage_bulktriagejob_cancel", args=[job.pk]))
    runner.join(timeout=60)

    assert not runner.is_alive() and not errors
    assert response.status_code == 302
    job.refresh_from_db()
    assert job.status == BulkJobStatus.CANCELLED
    assert job.cancelled_by is not None and job.finished_at is not None
    discarded = DeadLetter.objects.filter(status=DeadLetterStatus.DISCARDED).count()
    # At most the batch under way when the cancel landed runs after it.
    assert 10 <= discarded <= 20 < 60
    assert job.done == discarded == audit_rows(job).count()
    assert job.items.filter(outcome=BulkItemOutcome.PENDING).count() == 60 - discarded
    page = client.get(job_url(job)).content.decode()
    assert "Cancel this job" not in page
    assert f"{discarded} of 60 handled" in page
    # A cancelled job stays cancelled: neither a resume nor a late task copy runs it.
    client.post(reverse("admin:triage_bulktriagejob_resume", args=[job.pk]), follow=True)
    assert bulk.bulk_job_run(job_id=job.pk).status == BulkJobStatus.CANCELLED
    assert DeadLetter.objects.filter(status=DeadLetterStatus.DISCARDED).count() == discarded


def lock_released(job_id: int) -> bool:
    key = _lock_key(f"triage.bulk_job:{job_id}")
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [key])
        if not cursor.fetchone()[0]:
            return False
        cursor.execute("SELECT pg_advisory_unlock(%s)", [key])
    return True


CRASH_RUN = (
    "import sys, django; django.setup(); from triage.tasks import bulk_job_run; "
    "bulk_job_run(int(sys.argv[1]))"
)


@pytest.mark.subprocess
@pytest.mark.django_db(transaction=True)
def test_a_job_killed_mid_run_resumes_where_it_stopped_and_acts_once_on_each(module_settings):
    dead_letters_bulk_create(120)
    job = job_for(DeadLetter.objects.all(), action="resolve", user=operator())
    db = connection.settings_dict
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings.test",
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "TRIAGE_BULK_RATE_PER_SECOND": "40",
        "TRIAGE_BULK_BATCH_SIZE": "7",
    }
    process = subprocess.Popen([sys.executable, "-c", CRASH_RUN, str(job.pk)], cwd=ROOT, env=env)
    try:
        wait_for(lambda: BulkTriageJob.objects.get(pk=job.pk).done >= 20, 60, "twenty letters done")
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    job.refresh_from_db()
    assert job.status == BulkJobStatus.RUNNING  # as the crash left it
    resolved_at_crash = DeadLetter.objects.filter(status=DeadLetterStatus.RESOLVED).count()
    assert 20 <= resolved_at_crash < 120
    # The server drops the dead session's lock; a second copy cannot start before that.
    wait_for(lambda: lock_released(job.pk), 30, "the job's lock to be released")

    module_settings.TRIAGE_BULK_RATE_PER_SECOND = 1000
    result = tasks.bulk_job_run(job.pk)

    job.refresh_from_db()
    assert result["ran"] is True
    assert (job.status, job.done, job.failed, job.skipped) == (
        BulkJobStatus.COMPLETED,
        120,
        0,
        0,
    )
    assert DeadLetter.objects.filter(status=DeadLetterStatus.RESOLVED).count() == 120
    per_letter = audit_rows(job).values_list("dead_letter_id", flat=True)
    assert len(per_letter) == len(set(per_letter)) == 120


@pytest.mark.django_db
def test_a_dead_letter_closed_just_before_a_crash_is_counted_not_acted_on_again():
    rows = dead_letters_bulk_create(3)
    user = operator()
    job = job_for(DeadLetter.objects.all(), action="discard", user=user)
    # What a crash between the service's commit and the item's record leaves behind.
    services.dead_letter_discard(dead_letter=rows[0], user=user, note=job.note, bulk_job=job)
    BulkTriageJob.objects.filter(pk=job.pk).update(status=BulkJobStatus.RUNNING)

    job = bulk.bulk_job_run(job_id=job.pk, rate_per_second=1000)

    assert (job.status, job.done, job.skipped) == (BulkJobStatus.COMPLETED, 3, 0)
    assert audit_rows(job).filter(dead_letter=rows[0]).count() == 1
    item = job.items.get(dead_letter=rows[0])
    assert (item.outcome, item.reason) == ("done", "closed by this job before a restart")


@pytest.mark.django_db(transaction=True)
def test_two_copies_of_the_task_at_once_run_the_job_once(module_settings):
    module_settings.TRIAGE_BULK_RATE_PER_SECOND = 200
    dead_letters_bulk_create(80)
    job = job_for(DeadLetter.objects.all(), action="resolve", user=operator())
    results = []
    barrier = threading.Barrier(2)

    def run():
        try:
            barrier.wait()
            results.append(tasks.bulk_job_run(job.pk))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)

    assert sorted(r["ran"] for r in results) == [False, True]
    job.refresh_from_db()
    assert (job.status, job.done) == (BulkJobStatus.COMPLETED, 80)
    per_letter = audit_rows(job).values_list("dead_letter_id", flat=True)
    assert len(per_letter) == len(set(per_letter)) == 80


@pytest.mark.django_db
def test_the_job_page_links_to_exactly_its_audit_rows(client):
    rows = dead_letters_bulk_create(3)
    user = operator()
    services.dead_letter_resolve(dead_letter=rows[0], user=user, note="one by one")
    job = job_for(DeadLetter.objects.all(), action="discard", user=user)
    bulk.bulk_job_run(job_id=job.pk, rate_per_second=1000)
    client.force_login(user)
    page = client.get(job_url(job)).content.decode()
    audit_url = reverse("admin:triage_triageaction_changelist") + f"?bulk_job__id__exact={job.pk}"
    assert audit_url.replace("&", "&amp;") in page or audit_url in page
    listing = client.get(audit_url)
    assert listing.status_code == 200
    assert listing.context["cl"].result_count == 2


# --- The progress page ----------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_progress_pages_show_counts_rate_and_failures(client):
    dead_letters_bulk_create(3)
    DeadLetterFactory(body={"raw_body": "x"}, kind="")
    job = job_for(DeadLetter.objects.all(), action="redrive", user=operator())
    # The first redrive cannot publish (no queue listens at the test settings' endpoint),
    # which interrupts the job before anything changed.
    bulk.bulk_job_run(job_id=job.pk, rate_per_second=1000)
    client.force_login(operator())

    listing = client.get(reverse("admin:triage_bulktriagejob_changelist")).content.decode()
    assert "Interrupted (resume it)" in listing
    page = client.get(job_url(job)).content.decode()
    assert "0 of 4 handled" in page
    assert "Cancel this job" in page and "Resume" in page
    assert "did not accept the redrive" in page


@pytest.mark.django_db
@pytest.mark.parametrize("raw", ["²", "-1", "1e3", "9" * 30, "%00", "x"])
def test_malformed_job_ids_in_control_urls_are_404(client, raw):
    client.force_login(operator())
    url = reverse("admin:triage_bulktriagejob_cancel", args=["0"]).replace("/0/", f"/{raw}/")
    assert client.post(url).status_code == 404


@pytest.mark.django_db
@pytest.mark.parametrize(
    "field, value", [("max_id", "²"), ("max_id", "9" * 30), ("expected", "-1"), ("expected", "")]
)
def test_tampered_hidden_fields_start_nothing(client, field, value):
    rows = dead_letters_bulk_create(2)
    client.force_login(operator())
    data = {"expected": "2", "max_id": str(rows[-1].pk), "note": "INC-79", field: value}
    response = client.post(bulk_all_url("resolve"), data)
    assert response.status_code == 200
    assert "<strong>2</strong> open dead letters match" in response.content.decode()
    assert not BulkTriageJob.objects.exists()


@pytest.mark.django_db
def test_the_filters_search_narrows_the_selection(client):
    rows = dead_letters_bulk_create(3)
    client.force_login(operator())
    page = client.get(bulk_all_url("resolve", f"q%3D{rows[1].group_id}")).content.decode()
    assert "<strong>1</strong> open dead letter matches" in page


# --- Jobs nobody works on are started again ----------------------------------------------------


def enqueued_job_ids() -> list[int]:
    """The job ids of the bulk tasks waiting on the test broker (in memory), taken off it."""
    from config.celery import app

    found = []
    with app.connection_for_read() as conn:
        queue = conn.SimpleQueue(app.conf.task_default_queue)
        while True:
            try:
                message = queue.get(timeout=0.2)
            except queue.Empty:
                break
            message.ack()
            if message.headers.get("task") == "triage.tasks.bulk_job_run":
                found.append(message.payload[0][0])
        queue.close()
    return found


@pytest.mark.django_db
def test_the_sweep_starts_again_only_jobs_without_progress(module_settings):
    from datetime import timedelta

    from django.utils import timezone

    module_settings.TRIAGE_BULK_STALE_SECONDS = 120
    dead_letters_bulk_create(1)
    user = operator()
    jobs = {}
    for status in BulkJobStatus.values:
        jobs[status] = job_for(DeadLetter.objects.all(), action="resolve", user=user)
    fresh = job_for(DeadLetter.objects.all(), action="resolve", user=user)
    enqueued_job_ids()  # what the creations enqueued
    for status, job in jobs.items():
        BulkTriageJob.objects.filter(pk=job.pk).update(
            status=status, updated_at=timezone.now() - timedelta(seconds=121)
        )

    resumed = tasks.bulk_jobs_resume_stale()

    expected = sorted([jobs[BulkJobStatus.PENDING].pk, jobs[BulkJobStatus.RUNNING].pk])
    assert resumed == expected
    assert sorted(enqueued_job_ids()) == expected
    assert fresh.pk not in resumed


@pytest.mark.django_db
def test_a_job_whose_task_cannot_be_enqueued_is_kept_for_the_sweep(
    client, monkeypatch, django_capture_on_commit_callbacks, caplog
):
    from kombu.exceptions import OperationalError

    def broker_down(*args, **kwargs):
        raise OperationalError("broker unreachable")

    from config.celery import app

    monkeypatch.setattr(app, "send_task", broker_down)
    rows = dead_letters_bulk_create(2)
    client.force_login(operator())
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(
            bulk_all_url("resolve"),
            {"expected": "2", "max_id": str(rows[-1].pk), "note": "INC-80"},
        )
    job = BulkTriageJob.objects.get()
    assert response.status_code == 302 and response["Location"] == job_url(job)
    assert job.status == BulkJobStatus.PENDING and job.total == 2
    assert "could not be enqueued; the stale-job sweep will start it" in caplog.text


def test_a_job_is_started_by_the_name_of_its_task():
    assert bulk.BULK_JOB_RUN_TASK == tasks.bulk_job_run.name
