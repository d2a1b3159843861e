"""run_sqs_worker and run_outbox_relay serve their own /metrics on --metrics-port: a worker on
a host of its own is scraped there, over real HTTP."""

import io
import signal
import socket
import subprocess
import sys
import time

import pytest
import requests
from django.core.management import CommandError, call_command
from prometheus_client.parser import text_string_to_metric_families

from payments.models import OutboxMessage
from tests.callbacks.worker_support import ROOT, WorkerProcess, send_event, worker_env
from tests.factories import PaymentFactory
from tests.gunicorn_support import free_port

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.subprocess]


def sample(port: int, name: str, **labels) -> float | None:
    """One sample of ``name`` from http://127.0.0.1:port/metrics; None when not served."""
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return s.value
    return None


def scraped(port: int, name: str, timeout: float = 30, **labels) -> float:
    """Scrape until ``name{labels}`` is served (the process may still be starting)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = sample(port, name, **labels)
        except requests.ConnectionError:
            value = None
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"{name}{labels} not served on port {port}")


def test_a_worker_serves_its_message_counts_on_its_metrics_port(sqs_queues, tmp_path):
    payment = PaymentFactory(state="submitted")
    send_event(sqs_queues.client, sqs_queues.url, payment, "settled")
    port = free_port()
    worker = WorkerProcess(
        "--wait-time=1", "--no-relay", f"--metrics-port={port}", log_dir=tmp_path
    )
    try:
        applied = scraped(
            port, "payments_worker_messages_total", kind="processor_event", outcome="applied"
        )
        assert applied == 1
        confirmed = {"from_state": "submitted", "to_state": "confirmed"}
        assert sample(port, "payments_transitions_total", **confirmed) == 1
        # The worker serves its own counters only: no gauge read from SQS or the database.
        assert sample(port, "payments_queue_messages", queue="main", state="visible") is None
    finally:
        worker.signal(signal.SIGTERM)
        assert worker.wait(30) == 0
    assert f"serving metrics on http://127.0.0.1:{port}/metrics" in worker.output


def test_the_outbox_relay_serves_what_it_published_on_its_metrics_port(sqs_queues, tmp_path):
    payment = PaymentFactory()
    OutboxMessage.objects.create(
        kind="submit_payment",
        group_id=str(payment.id),
        body={"kind": "submit_payment", "payment_id": str(payment.id)},
    )
    port = free_port()
    relay = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "run_outbox_relay", f"--metrics-port={port}"],
        cwd=ROOT,
        env=worker_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert scraped(port, "payments_outbox_published_total", path="relay") == 1
    finally:
        relay.send_signal(signal.SIGTERM)
        output, _ = relay.communicate(timeout=30)
    assert relay.returncode == 0, output


def test_the_metrics_port_is_off_by_default_and_a_taken_port_stops_the_command(sqs_queues):
    out = io.StringIO()
    call_command("run_outbox_relay", once=True, stdout=out)
    assert "published 0 outbox rows" in out.getvalue()

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(CommandError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            call_command("run_outbox_relay", once=True, metrics_port=port, stdout=io.StringIO())
