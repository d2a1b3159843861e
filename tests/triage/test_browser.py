"""An operator at the admin in Debian's chromium: reads a dead letter's story, redrives it with a
note, and after the worker runs sees the payment reach its final state, the parked message
applied after the redriven one. Screenshots go to test-artifacts/.

Playwright's own browser download cannot work here: it drives ``/usr/bin/chromium``.
"""

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.db import connections

from callbacks.models import ParkedMessage
from payments.models import Payment, PaymentEvent, PaymentState
from tests.factories import PaymentFactory
from tests.triage.deadletters import event_publish, operator, worker_run
from triage import ingestion
from triage.models import DeadLetter, DeadLetterStatus

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(django_settings.BASE_DIR) / "test-artifacts"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def browser_page(monkeypatch):
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    # Playwright's sync API runs an event loop in this thread; the ORM calls the test makes
    # meanwhile are ordinary synchronous ones.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    profile = tempfile.mkdtemp(prefix="triage-chromium-")
    # Playwright's greenlets give the test code its own context, so Django opens another
    # database connection inside it: close the ones on each side of the switch, or the test
    # database cannot be dropped at the end.
    connections.close_all()
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            profile,
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 1000},
        )
        try:
            page = context.new_page()
            page.set_default_timeout(15_000)
            yield page
        finally:
            context.close()
            shutil.rmtree(profile, ignore_errors=True)
            connections.close_all()


@pytest.fixture
def dead_submitted_event(sqs_queues, module_settings):
    """A "submitted" event that arrived before its payment existed (PaymentNotFound, six
    attempts, dead-lettered) and the "settled" event parked behind it."""
    module_settings.WORKER_BACKOFF_BASE_SECONDS = 0
    module_settings.WORKER_BACKOFF_CAP_SECONDS = 0
    payment = PaymentFactory.build()
    submitted, _ = event_publish(payment, "submitted")
    settled, _ = event_publish(payment, "settled")
    worker_run()
    assert ingestion.dead_letters_ingest() == 1
    assert ParkedMessage.objects.filter(payment_id=str(payment.id)).count() == 1
    # The fix made elsewhere: the payment row now exists.
    payment.save()
    return {
        "payment": payment,
        "dead_letter": DeadLetter.objects.get(group_id=str(payment.id)),
        "submitted": submitted,
        "settled": settled,
    }


def test_operator_redrives_a_dead_letter_and_sees_the_payment_complete_in_order(
    live_server, browser_page, dead_submitted_event
):
    page = browser_page
    payment = dead_submitted_event["payment"]
    dead_letter = dead_submitted_event["dead_letter"]
    user = operator(username="night-operator")
    ARTIFACTS.mkdir(exist_ok=True)
    detail = f"{live_server.url}/admin/triage/deadletter/{dead_letter.pk}/change/"

    page.goto(
        f"{live_server.url}/admin/login/?next=/admin/triage/deadletter/{dead_letter.pk}/change/"
    )
    page.fill("#id_username", user.username)
    page.fill("#id_password", "password")
    page.click("input[type=submit]")
    page.wait_for_url(detail)

    errors = page.locator("#triage-errors")
    assert "Processing errors of this message (6)" in errors.inner_text()
    assert "PaymentNotFound" in errors.inner_text()
    assert errors.locator("details").count() == 6  # one traceback per attempt
    assert "on hold" in page.locator("#triage-summary").inner_text()
    page.screenshot(path=str(ARTIFACTS / "dead-letter.png"), full_page=True)

    page.click("#triage-redrive")
    page.wait_for_url(f"**/deadletter/{dead_letter.pk}/act/redrive/")
    page.fill("#id_note", "Payment row restored after the import fix (INC-314); redriving.")
    page.screenshot(path=str(ARTIFACTS / "redrive-confirmation.png"), full_page=True)
    page.click("#triage-confirm-form input[type=submit]")
    page.wait_for_url(detail)
    messages = page.locator("ul.messagelist").inner_text()
    assert f"Dead letter {dead_letter.pk} redriven." in messages
    assert "1 parked message(s) republished in their original order" in messages

    worker_run()

    page.goto(detail)
    assert page.locator("#triage-payment-state").inner_text() == PaymentState.CONFIRMED
    rows = page.locator("#triage-events tbody tr").all_inner_texts()
    ids = [
        dead_submitted_event["submitted"].processor_event_id,
        dead_submitted_event["settled"].processor_event_id,
    ]
    positions = [next(i for i, row in enumerate(rows) if event_id in row) for event_id in ids]
    assert positions == sorted(positions)  # the redriven event first, the parked one after
    assert all("applied" in rows[i] for i in positions)
    assert "night-operator" in page.locator("#triage-actions").inner_text()
    page.screenshot(path=str(ARTIFACTS / "dead-letter-after-redrive.png"), full_page=True)

    page.goto(f"{live_server.url}/admin/triage/triagedashboard/")
    assert "open dead letters" in page.locator("#tile-open").inner_text()
    assert page.locator("svg.triage-chart").count() >= 1
    page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)

    dead_letter.refresh_from_db()
    assert dead_letter.status == DeadLetterStatus.REDRIVEN
    assert Payment.objects.get(pk=payment.pk).state == PaymentState.CONFIRMED
    applied = list(
        PaymentEvent.objects.filter(
            payment_id=payment.pk, outcome="applied", kind="processor_event"
        )
        .order_by("created_at", "id")
        .values_list("processor_event_id", flat=True)
    )
    assert applied == ids
    for name in ("dead-letter.png", "dead-letter-after-redrive.png", "dashboard.png"):
        assert (ARTIFACTS / name).stat().st_size > 10_000
