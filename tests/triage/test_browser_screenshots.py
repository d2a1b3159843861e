"""The documentation's pictures of the admin, taken in Debian's chromium from a real dead letter:
the dead-letter page, the error history of its payment's message, and the triage dashboard.

Each run writes them to test-artifacts/; with ``DOCS_SCREENSHOTS=1`` (``make docs-screenshots``)
also to docs/img/, where they are committed, so the site builds without a browser
(docs/tutorial/admin-tour.md shows them).
"""

import os
import shutil
from pathlib import Path

import pytest
from django.conf import settings as django_settings

from tests.triage.deadletters import operator
from tests.triage.test_browser import (  # noqa: F401 - fixtures
    ARTIFACTS,
    browser_page,
    dead_submitted_event,
)

DOCS_IMAGES = Path(django_settings.BASE_DIR) / "docs" / "img"
SCREENSHOTS = ("dead-letter.png", "error-history.png", "triage-dashboard.png")

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_docs_screenshots_show_a_dead_letter_its_errors_and_the_dashboard(
    live_server,
    browser_page,  # noqa: F811 - the fixtures imported above
    dead_submitted_event,  # noqa: F811
):
    page = browser_page
    page.set_viewport_size({"width": 1280, "height": 900})
    dead_letter = dead_submitted_event["dead_letter"]
    user = operator(username="night-operator")
    shots = ARTIFACTS / "docs"
    shots.mkdir(parents=True, exist_ok=True)
    detail = f"/admin/triage/deadletter/{dead_letter.pk}/change/"

    page.goto(f"{live_server.url}/admin/login/?next={detail}")
    page.fill("#id_username", user.username)
    page.fill("#id_password", "password")
    page.click("input[type=submit]")
    page.wait_for_url(f"{live_server.url}{detail}")
    assert "on hold" in page.locator("#triage-summary").inner_text()
    page.screenshot(path=str(shots / "dead-letter.png"))

    errors = page.locator("#triage-errors")
    assert "Processing errors of this message (6)" in errors.inner_text()
    errors.locator("details").first.evaluate("element => { element.open = true; }")
    errors.screenshot(path=str(shots / "error-history.png"))

    page.goto(f"{live_server.url}/admin/triage/triagedashboard/")
    assert "open dead letters" in page.locator("#tile-open").inner_text()
    page.screenshot(path=str(shots / "triage-dashboard.png"))

    for name in SCREENSHOTS:
        assert (shots / name).read_bytes().startswith(b"\x89PNG")
        assert (shots / name).stat().st_size > 10_000
    if os.environ.get("DOCS_SCREENSHOTS") == "1":
        DOCS_IMAGES.mkdir(parents=True, exist_ok=True)
        for name in SCREENSHOTS:
            shutil.copyfile(shots / name, DOCS_IMAGES / name)
