"""An operator at the admin in Debian's chromium: filters the dead letters to one incident,
confirms "redrive all matching", and follows the job to its end. Screenshots go to
test-artifacts/."""

import pytest

from tests.triage.bulk_support import dead_letters_bulk_create
from tests.triage.deadletters import operator
from tests.triage.test_browser import ARTIFACTS, browser_page  # noqa: F401 - the fixture
from triage import tasks
from triage.models import BulkJobStatus, BulkTriageJob, DeadLetter, DeadLetterStatus

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_operator_redrives_all_dead_letters_of_an_incident_and_follows_the_job(
    live_server,
    browser_page,  # noqa: F811 - the fixture imported above
    sqs_queues,
):
    page = browser_page
    incident = dead_letters_bulk_create(30)
    other = dead_letters_bulk_create(4, last_error_class="payments.exceptions.InvalidTransition")
    user = operator(username="incident-operator")
    ARTIFACTS.mkdir(exist_ok=True)
    changelist = f"{live_server.url}/admin/triage/deadletter/"

    page.goto(f"{live_server.url}/admin/login/?next=/admin/triage/deadletter/")
    page.fill("#id_username", user.username)
    page.fill("#id_password", "password")
    page.click("input[type=submit]")
    page.wait_for_url(changelist)
    page.goto(f"{changelist}?error_class=payments.exceptions.ProcessorUnavailable")

    page.click("text=Redrive all matching…")
    page.wait_for_url("**/deadletter/bulk-all/redrive/**")
    assert "30 open dead letters match this filter" in page.locator(
        ".triage-bulk-count"
    ).inner_text().replace("\n", " ")
    page.fill("#id_note", "INC-512: processor outage over, redriving everything it killed.")
    page.screenshot(path=str(ARTIFACTS / "bulk-confirmation.png"), full_page=True)
    page.click("#triage-confirm-form input[type=submit]")
    page.wait_for_url("**/triage/bulktriagejob/*/change/")
    assert "Bulk job" in page.locator("ul.messagelist").inner_text()
    job = BulkTriageJob.objects.get()
    assert "0 of 30 handled" in page.locator(".triage-job-progress").inner_text()

    tasks.bulk_job_run(job.pk)

    page.reload()
    progress = page.locator(".triage-job-progress").inner_text()
    assert "30 of 30 handled: 30 done, 0 failed, 0 skipped" in progress
    assert "Completed" in progress
    assert page.locator(".triage-job-cancel").count() == 0
    page.screenshot(path=str(ARTIFACTS / "bulk-job.png"), full_page=True)
    page.goto(f"{live_server.url}/admin/triage/bulktriagejob/")
    page.screenshot(path=str(ARTIFACTS / "bulk-jobs.png"), full_page=True)

    statuses = dict(DeadLetter.objects.values_list("pk", "status"))
    assert {statuses[d.pk] for d in incident} == {DeadLetterStatus.REDRIVEN}
    assert {statuses[d.pk] for d in other} == {DeadLetterStatus.OPEN}
    job.refresh_from_db()
    assert job.status == BulkJobStatus.COMPLETED
    for name in ("bulk-confirmation.png", "bulk-job.png"):
        assert (ARTIFACTS / name).stat().st_size > 10_000
