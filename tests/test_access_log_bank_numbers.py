"""A bank number in a request's path or query never reaches a log line in the clear: not
gunicorn's access log, not runserver's (``django.server``), not the 4xx warning of
``django.request``. Real servers in subprocesses, their whole output read back."""

import contextlib
import json
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
import requests
from django.db import connection

from tests.gunicorn_support import (
    free_port,
    gunicorn_running,
    gunicorn_test_env,
    web_server_running,
)

pytestmark = pytest.mark.subprocess

ACCOUNT_17 = "77668056869313516"
ARABIC_13 = "".join(chr(0x0660 + int(d)) for d in "7766805686931")
PAYMENT_ID = str(uuid.UUID("550e8400-e29b-41d4-a716-446655440000"))

# Each request's path, and what of it the log may show.
REQUESTS = [
    ("/api/merchants/758259572987/balance/", "/api/merchants/****2987/balance/"),
    (f"/api/payments/?merchant={ACCOUNT_17}", "merchant=****3516"),
    ("/api/payments/?merchant=7766805686931&state=pending", "merchant=****6931&state=pending"),
    ("/api/payments/?merchant=7766-8056-8693-1351", "merchant=****1351"),
    ("/api/payments/?merchant=7766+8056+8693+1351", "merchant=****1351"),
    (f"/api/payments/?merchant={quote('776680568693')}", "merchant=****8693"),
    ("/api/payments/?merchant=%37%37%36%36%38%30%35%36%38%36%39%33", "merchant=****8693"),
    (f"/api/merchants/{quote(ARABIC_13)}/balance/", f"/api/merchants/****{quote(ARABIC_13[-4:])}/"),
    ("/api/payments/?merchant=7766805686931%0Afake%22line", "merchant=****6931%0Afake%22line"),
    # Kept: what a bank number's last 4 shows anyway, and the ids a reader needs.
    ("/api/payments/?merchant=m-1234", "merchant=m-1234"),
    (f"/api/payments/{PAYMENT_ID}/", f"/api/payments/{PAYMENT_ID}/"),
    ("/api/payments/?created_gte=2026-11-02T12:00:00Z", "created_gte=2026-11-02T12:00:00Z"),
]
NEVER = [
    ACCOUNT_17,
    "758259572987",
    "7766805686931",
    "7766-8056",
    "7766+8056",
    "%37%37%36%36",
    "776680568693",
    quote(ARABIC_13)[:30],
    ARABIC_13[:6],
    "\\u0667\\u0667\\u0666",  # Django writes a non-ASCII path escaped in its warnings
]


def _send_every_request(base: str) -> None:
    for path, _ in REQUESTS:
        response = requests.get(base + path, timeout=10)
        assert response.status_code in (400, 401, 403, 404), (path, response.status_code)


def _assert_masked(log: str, *, lines_of: str) -> None:
    for path, shown in REQUESTS:
        assert shown in log, (path, log)
    for number in NEVER:
        for text in (log, log.replace("\\\\", "\\")):  # a JSON line's escaped backslash read
            assert number not in text, (number, log)
    assert lines_of in log, log


@contextlib.contextmanager
def _runserver(env: dict, log_path: Path, *, timeout: float = 60) -> Iterator[str]:
    """``manage.py runserver`` (no reloader) on ``GUNICORN_BIND``'s address, as a developer
    starts it; its output goes to ``log_path``."""
    argv = [sys.executable, "manage.py", "runserver", "--noreload", env["GUNICORN_BIND"]]
    with web_server_running(
        argv, env, log_path, name="runserver", ok_only=False, timeout=timeout
    ) as base:
        yield base


def test_gunicorn_access_log_masks_bank_numbers_in_paths_and_queries(module_settings, tmp_path):
    port = free_port()
    log_path = tmp_path / "gunicorn.log"
    with gunicorn_running(gunicorn_test_env(module_settings, port), log_path) as base:
        _send_every_request(base)
        time.sleep(0.5)  # the access lines of the last requests are written
    _assert_masked(log_path.read_text(), lines_of='"GET /api/merchants/****2987/balance/ HTTP/1.1"')


def _readable(log: str) -> str:
    """A JSON-lines log with its escapes read (a non-ASCII digit is written \\u0663)."""
    lines = []
    for line in log.splitlines():
        try:
            lines.append(json.dumps(json.loads(line), ensure_ascii=False))
        except ValueError:
            lines.append(line)
    return "\n".join(lines)


@pytest.mark.parametrize("log_format", ["plain", "json"])
def test_runserver_access_log_and_request_warnings_mask_bank_numbers(
    db, module_settings, tmp_path, log_format
):
    port = free_port()
    log_path = tmp_path / "runserver.log"
    database = connection.settings_dict  # runserver checks the test database's migrations
    env = gunicorn_test_env(
        module_settings,
        port,
        DATABASE_URL=(
            f"postgres://{database['USER']}@{database['HOST']}:{database['PORT']}/"
            f"{database['NAME']}"
        ),
        LOG_FORMAT=log_format,
    )
    with _runserver(env, log_path) as base:
        _send_every_request(base)
        time.sleep(0.5)
    log = _readable(log_path.read_text())
    _assert_masked(log, lines_of="django.server")
    # django.request's warning names the path too, and in JSON lines its request object.
    assert "django.request" in log and ": /api/merchants/****2987/balance/" in log, log
    if log_format == "json":
        assert "<WSGIRequest: GET '/api/merchants/****2987/balance/'>" in log, log
