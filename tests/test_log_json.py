"""The JSON log format: one parseable record per line whatever a value holds, the module's
fields as keys, and LOG_FORMAT choosing it."""

import io
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from payments.kernel import logcontext
from payments.kernel.logcontext import LogContextFilter
from payments.kernel.logformat import JsonLineFormatter

ROOT = Path(__file__).resolve().parent.parent
HOSTILE = {
    "nul": "before\x00after",
    "newline": 'note\n{"level": "INFO", "message": "forged"}',
    "lone_surrogate": "half \ud800 a pair",
    "quote": 'say "hi"\\',
}


@pytest.fixture
def json_log():
    """A logger whose one handler is the configured JSON one (formatter and filter)."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonLineFormatter())
    handler.addFilter(LogContextFilter())
    # A logger of its own, outside logging's tree: nothing else (pytest's log capture included)
    # sees its records, so a lone surrogate never reaches a report pytest-xdist must encode.
    log = logging.Logger("tests.json_log", logging.INFO)
    log.addHandler(handler)
    log.propagate = False
    yield log, stream


def records(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_value_gives_one_parseable_line_in_message_and_field(json_log, name):
    log, stream = json_log
    value = HOSTILE[name]

    log.info("note %s", value, extra={"note": value, "payment_id": "p-1"})

    [line] = stream.getvalue().splitlines()
    [record] = records(stream)
    assert record["message"] == f"note {value}"
    assert record["note"] == value
    assert record["payment_id"] == "p-1"
    assert record["level"] == "INFO" and record["logger"] == "tests.json_log"
    assert "time" in record
    assert line.isascii()


def test_a_traceback_is_one_key_of_its_record(json_log):
    log, stream = json_log
    try:
        raise ValueError("bad\nvalue")
    except ValueError:
        log.exception("failed")

    [record] = records(stream)
    assert "ValueError: bad\nvalue" in record["exc_info"]


def test_bound_fields_reach_every_record_and_a_calls_own_value_wins(json_log):
    log, stream = json_log
    with logcontext.bound(request_id="req_1", trace_id=None):
        log.info("bound")
        log.info("own", extra={"request_id": "req_own"})
        with logcontext.bound(message_id="m-1"):
            log.info("nested")
    log.info("after")

    bound, own, nested, after = records(stream)
    assert bound["request_id"] == "req_1" and "trace_id" not in bound
    assert own["request_id"] == "req_own"
    assert nested["request_id"] == "req_1" and nested["message_id"] == "m-1"
    assert "request_id" not in after


def settings_value(module: str, code: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k != "LOG_FORMAT"}
    return subprocess.run(
        [sys.executable, "-c", f"import {module} as s; {code}"],
        cwd=ROOT,
        env={
            **clean,
            "SECRET_KEY": "x",
            "DATABASE_URL": "sqlite:///:memory:",
            "PROCESSOR_BASE_URL": "http://127.0.0.1:9",
            "PROCESSOR_API_KEY": "k",
            "CALLBACK_SIGNING_SECRETS": "s",
            **env,
        },
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("module", "env", "expected"),
    [
        ("config.settings.base", {}, "plain"),
        ("config.settings.base", {"LOG_FORMAT": "json"}, "json"),
        ("config.settings.production", {}, "json"),
        ("config.settings.production", {"LOG_FORMAT": "plain"}, "plain"),
    ],
)
@pytest.mark.subprocess
def test_log_format_chooses_the_console_handlers_formatter(module, env, expected):
    result = settings_value(
        module, "h = s.LOGGING['handlers']['console']; print(h['formatter'], h['filters'])", **env
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [expected, "['log_context']"]


@pytest.mark.subprocess
def test_an_unknown_log_format_stops_start_up_naming_it():
    result = settings_value("config.settings.base", "", LOG_FORMAT="xml")

    assert result.returncode != 0
    assert "LOG_FORMAT must be plain or json" in result.stderr


@pytest.mark.subprocess
def test_the_configured_handler_formats_json_with_the_bound_fields():
    """dictConfig builds the formatter and the filter from the names in LOGGING."""
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "import django, logging; django.setup(); from payments import logcontext\n"
            "with logcontext.bound(request_id='req_x'):\n"
            "    logging.getLogger('payments').warning('hi', extra={'payment_id': 'p'})",
        ],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings.test", "LOG_FORMAT": "json"},
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert result.returncode == 0, result.stderr
    [record] = [json.loads(line) for line in result.stderr.splitlines()]
    assert record["message"] == "hi"
    assert record["payment_id"] == "p" and record["request_id"] == "req_x"
