"""No value from outside can start a log record of its own: read the log the configured
handler writes, in this process and in a real one."""

import contextlib
import io
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from payments.kernel.logformat import SingleLineFormatter
from tests.callbacks.worker_support import run_worker, send_body
from tests.factories import DeadLetterFactory, PaymentFactory
from tests.triage.deadletters import operator
from triage.services import dead_letter_resolve

ROOT = Path(__file__).resolve().parents[1]
FORGED = "\n2026-01-01 00:00:00,000 INFO fake.logger forged record"
# Where a record starts: the configured format begins with the time.
RECORD_START = re.compile(r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2},\d{3} [A-Z]+ ")


@contextlib.contextmanager
def configured_log():
    """The console handler LOGGING configured, writing to a StringIO for the test."""
    [handler] = [
        h for h in logging.getLogger().handlers if isinstance(h.formatter, SingleLineFormatter)
    ]
    stream = io.StringIO()
    # Not setStream(): it flushes the stream it replaces, which may be an earlier test's
    # captured stderr, closed by now.
    with handler.lock:
        previous, handler.stream = handler.stream, stream
    try:
        yield stream
    finally:
        with handler.lock:
            handler.stream = previous


def records(text: str) -> list[str]:
    return [line for line in text.splitlines() if RECORD_START.match(line)]


def test_the_settings_configure_the_single_line_formatter():
    with configured_log() as log:
        logging.getLogger("payments.test").warning(
            "note %s", "a\rb\x00c\x85d\u2028e\u2029f" + FORGED
        )
    [line] = log.getvalue().splitlines()
    assert line.endswith(
        r"note a\rb\x00c\x85d\u2028e\u2029f\n2026-01-01 00:00:00,000 INFO "
        "fake.logger forged record"
    )


def test_a_traceback_keeps_its_lines_but_none_starts_a_record():
    with configured_log() as log:
        try:
            raise ValueError("bad value" + FORGED)
        except ValueError:
            logging.getLogger("payments.test").exception("failed for %s", "x" + FORGED)
    text = log.getvalue()
    assert len(records(text)) == 1
    lines = text.splitlines()
    assert lines[1] == "  | Traceback (most recent call last):"
    assert all(line.startswith("  | ") for line in lines[1:])
    assert "  | 2026-01-01 00:00:00,000 INFO fake.logger forged record" in lines


@pytest.mark.django_db
def test_an_operators_note_cannot_forge_a_line_in_the_web_log():
    dead_letter = DeadLetterFactory()

    with configured_log() as log:
        dead_letter_resolve(dead_letter=dead_letter, user=operator(), note="fixed" + FORGED)

    text = log.getvalue()
    assert "forged record" in text
    assert not any("fake.logger" in line[:60] for line in records(text))
    assert all(RECORD_START.match(line) for line in text.splitlines())


@pytest.mark.django_db(transaction=True)
def test_a_queue_messages_kind_cannot_forge_a_line_in_the_worker_log(sqs_queues):
    payment = PaymentFactory()
    body = {"kind": "refund" + FORGED, "payment_id": str(payment.id)}
    send_body(sqs_queues.client, sqs_queues.url, payment.id, body)

    with configured_log() as log:
        run_worker()

    text = log.getvalue()
    kind_lines = [line for line in text.splitlines() if "kind=refund" in line]
    assert kind_lines, text
    assert all(r"kind=refund\n2026-01-01" in line for line in kind_lines)
    assert all(RECORD_START.match(line) or line.startswith("  | ") for line in text.splitlines())
    assert not any(
        line.startswith("2026-01-01 00:00:00,000 INFO fake") for line in text.splitlines()
    )


@pytest.mark.subprocess
def test_a_real_process_writes_the_forged_note_on_one_line():
    code = (
        "import logging; "
        f"logging.getLogger('triage.services').warning('dead letter 1 resolved by ops: %s', "
        f"{('fixed' + FORGED)!r})"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings.test"}
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    lines = [
        line for line in done.stderr.splitlines() if "resolved by ops" in line or "forged" in line
    ]
    assert len(lines) == 1 and RECORD_START.match(lines[0]), done.stderr
    assert lines[0].endswith(r"fixed\n2026-01-01 00:00:00,000 INFO fake.logger forged record")
