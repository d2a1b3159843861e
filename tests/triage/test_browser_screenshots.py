"""The documentation's pictures of the admin, taken in Debian's chromium from a real dead letter:
the dead-letter page, the error history of its payment's message, and the triage dashboard.

Each run writes them to test-artifacts/; with ``DOCS_SCREENSHOTS=1`` (``make docs-screenshots``)
also to docs/img/, where they are committed, so the site builds without a browser
(docs/tutorial/admin-tour.md shows them). Without it, each fresh picture is compared with the
committed one and the test fails when they differ by more than a small margin (the dead
letter's id and times are the run's own): the docs show today's admin, not an old one.
"""

import os
import shutil
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from PIL import Image, ImageChops

from callbacks.models import ProcessingError
from tests.triage.deadletters import operator
from tests.triage.test_browser import (  # noqa: F401 - fixtures
    ARTIFACTS,
    browser_page,
    dead_submitted_event,
)

# Where the docs' pictures say the module's files are (an install's path, not a checkout's).
INSTALLED_AT = "/srv/app"
DOCS_IMAGES = Path(django_settings.BASE_DIR) / "docs" / "img"
SCREENSHOTS = ("dead-letter.png", "error-history.png", "triage-dashboard.png")
# A pixel differs when a channel moves by more than this (anti-aliasing does not count) ...
CHANNEL_TOLERANCE = 24
# ... and a picture differs when more than this share of its pixels do: a run's own ids and
# times fit inside it (two runs of today's admin: 0.1%, 1.3% and 2.9% of the error history's
# many timestamps), a changed layout, colour or section does not.
PIXELS_MARGIN = 0.06


def picture_difference(fresh: Path, committed: Path) -> str | None:
    """Why ``fresh`` is not ``committed`` within the margin, or None."""
    with Image.open(fresh) as new, Image.open(committed) as old:
        if new.size != old.size:
            return f"{fresh.name}: {new.size} now, {old.size} committed"
        delta = ImageChops.difference(new.convert("RGB"), old.convert("RGB"))
        moved = delta.convert("L").point(lambda level: 255 if level > CHANNEL_TOLERANCE else 0)
        share = moved.histogram()[255] / (new.size[0] * new.size[1])
    if share > PIXELS_MARGIN:
        return f"{fresh.name}: {share:.1%} of its pixels differ (margin {PIXELS_MARGIN:.0%})"
    return None


def test_a_picture_differs_from_itself_by_nothing_and_from_another_beyond_the_margin(tmp_path):
    first, second = tmp_path / "a.png", tmp_path / "b.png"
    Image.new("RGB", (100, 100), "white").save(first)
    changed = Image.new("RGB", (100, 100), "white")
    changed.paste((0, 0, 0), (0, 0, 100, 7))  # 7% of the pixels
    changed.save(second)
    nudged = Image.new("RGB", (100, 100), (250, 250, 250))  # within the channel tolerance
    nudged.save(tmp_path / "c.png")
    Image.new("RGB", (100, 90), "white").save(tmp_path / "d.png")

    assert picture_difference(first, first) is None
    assert picture_difference(tmp_path / "c.png", first) is None
    assert "7.0% of its pixels differ" in picture_difference(second, first)
    assert "(100, 90) now, (100, 100) committed" in picture_difference(tmp_path / "d.png", first)


pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def tracebacks_from_the_checkout_made_alike() -> None:
    """The error history's tracebacks name the checkout's files, whose path wraps the column at
    a different place in every clone: shown as one install's path, the picture is the same in
    any checkout (and the docs show no developer's directory)."""
    for error in ProcessingError.objects.all():
        error.traceback = error.traceback.replace(str(django_settings.BASE_DIR), INSTALLED_AT)
        error.save(update_fields=["traceback"])


def test_the_docs_screenshots_show_a_dead_letter_its_errors_and_the_dashboard(
    live_server,
    browser_page,  # noqa: F811 - the fixtures imported above
    dead_submitted_event,  # noqa: F811
):
    page = browser_page
    page.set_viewport_size({"width": 1280, "height": 900})
    dead_letter = dead_submitted_event["dead_letter"]
    tracebacks_from_the_checkout_made_alike()
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
        return
    differences = [
        problem
        for name in SCREENSHOTS
        if (problem := picture_difference(shots / name, DOCS_IMAGES / name)) is not None
    ]
    assert not differences, (
        "the committed screenshots are not today's admin; run make docs-screenshots: "
        + "; ".join(differences)
    )
