"""Celery on the SQS broker: a real worker process against the local SQS server."""

import io
import os
import socket
import subprocess
import sys
import uuid
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
import requests
from celery import Celery
from django.conf import settings as django_settings
from django.core.management import CommandError, call_command
from django.db import connection
from django.utils import timezone
from kombu import Connection
from prometheus_client.parser import text_string_to_metric_families

from payments.kernel.locks import _lock_key, single_flight
from payments.models import ProcessedEvent
from payments.tasks import processed_events_purge
from tests.factories import PaymentFactory, ProcessedEventFactory
from tests.gunicorn_support import free_port
from tests.history import history_rewritten
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parent.parent


def celery_queue_setup(module_settings, local_sqs) -> tuple[str, str]:
    module_settings.SQS_ENDPOINT_URL = local_sqs.endpoint_url
    module_settings.CELERY_SQS_QUEUE_NAME = f"payments-celery-{uuid.uuid4().hex[:10]}"
    from callbacks import sqs

    sqs.reset()
    out = io.StringIO()
    call_command("setup_celery_queue", stdout=out)
    line = out.getvalue().strip()
    assert line.startswith("CELERY_SQS_QUEUE_URL=")
    return module_settings.CELERY_SQS_QUEUE_NAME, line.split("=", 1)[1]


def broker_environment(local_sqs, queue_name: str, queue_url: str) -> dict[str, str]:
    db = connection.settings_dict
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings.test",
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "SQS_ENDPOINT_URL": local_sqs.endpoint_url,
        "CELERY_BROKER_URL": f"sqs://127.0.0.1:{local_sqs.port}",
        "CELERY_SQS_QUEUE_NAME": queue_name,
        "CELERY_SQS_QUEUE_URL": queue_url,
        "CELERY_SQS_WAIT_TIME_SECONDS": "1",
    }


def sqs_url_from_getqueueurl(local_sqs, name: str) -> str:
    import boto3

    client = boto3.client("sqs", endpoint_url=local_sqs.endpoint_url, region_name="us-east-1")
    return client.get_queue_url(QueueName=name)["QueueUrl"]


def settings_in(env: dict[str, str], *names: str) -> dict:
    """Evaluate the settings module in a fresh interpreter with ``env`` (what a worker sees)."""
    code = (
        "import json, django; from django.conf import settings; django.setup(); "
        f"print(json.dumps({{n: getattr(settings, n) for n in {list(names)!r}}}, default=str))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    import json

    return json.loads(result.stdout)


def test_beat_schedule_covers_the_operations_work():
    tasks = {entry["task"] for entry in django_settings.CELERY_BEAT_SCHEDULE.values()}
    assert tasks == {
        "triage.tasks.dead_letters_ingest",
        "triage.tasks.queue_metrics_sample",
        "triage.tasks.alerts_evaluate",
        "triage.tasks.beat_heartbeat",
        "triage.tasks.bulk_jobs_resume_stale",
        "callbacks.tasks.payments_reconcile",
        "callbacks.tasks.processor_events_pull",
        "callbacks.tasks.outbox_relay_publish",
        "payments.tasks.refunds_release",
        "payments.tasks.review_holds_check",
        "payments.tasks.available_totals_fold",
        "payments.tasks.account_validations_advance",
        "payments.tasks.webhooks_dispatch",
        "payments.tasks.events_purge",
        "payments.tasks.processed_events_purge",
        "payments.tasks.idempotency_keys_purge",
        "callbacks.tasks.queue_messages_purge",
        "payments.tasks.outbox_messages_purge",
        "payments.tasks.breaker_transitions_purge",
        "callbacks.tasks.holds_purge",
        "triage.tasks.error_history_purge",
        "triage.tasks.alerts_purge",
        "triage.tasks.bulk_job_items_purge",
    }
    from config.celery import app

    app.loader.import_default_modules()
    assert tasks <= set(app.tasks)
    for entry in django_settings.CELERY_BEAT_SCHEDULE.values():
        # A tick missed while workers were down expires instead of piling up.
        assert entry["options"]["expires"] == entry["schedule"]


@pytest.mark.subprocess
@pytest.mark.django_db
def test_sqs_transport_options_carry_the_queue_url_getqueueurl_returns(module_settings, local_sqs):
    name, url = celery_queue_setup(module_settings, local_sqs)
    env = broker_environment(local_sqs, name, url)
    seen = settings_in(env, "CELERY_BROKER_TRANSPORT_OPTIONS", "CELERY_TASK_DEFAULT_QUEUE")
    assert url == sqs_url_from_getqueueurl(local_sqs, name)
    assert seen["CELERY_TASK_DEFAULT_QUEUE"] == name
    options = seen["CELERY_BROKER_TRANSPORT_OPTIONS"]
    assert options["is_secure"] is False
    assert options["region"] == "us-east-1"
    assert options["predefined_queues"] == {name: {"url": url}}
    # After each task a worker (prefetch 1, acks late) waits the polling interval before it
    # receives again: kombu's 1 s would hold it to a task a second.
    assert options["polling_interval"] == 0.05


def test_the_polling_interval_comes_from_the_environment(module_settings, local_sqs):
    name, url = celery_queue_setup(module_settings, local_sqs)
    env = {**broker_environment(local_sqs, name, url), "CELERY_SQS_POLLING_INTERVAL": "0.5"}
    seen = settings_in(env, "CELERY_BROKER_TRANSPORT_OPTIONS")
    assert seen["CELERY_BROKER_TRANSPORT_OPTIONS"]["polling_interval"] == 0.5


CONFIGURED_OPTIONS = (
    "import json, django; django.setup(); from config.celery import app; "
    "print(json.dumps(app.conf.broker_transport_options['predefined_queues']))"
)


@pytest.mark.subprocess
@pytest.mark.django_db
def test_without_queue_url_the_app_looks_it_up_and_creates_the_queue(settings, local_sqs):
    name = f"payments-celery-{uuid.uuid4().hex[:10]}"
    env = broker_environment(local_sqs, name, "")
    del env["CELERY_SQS_QUEUE_URL"]
    result = subprocess.run(
        [sys.executable, "-c", CONFIGURED_OPTIONS],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    import json

    assert json.loads(result.stdout) == {name: {"url": sqs_url_from_getqueueurl(local_sqs, name)}}


@pytest.mark.subprocess
def test_unreachable_sqs_without_queue_url_is_logged_naming_the_setting():
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings.test",
        "SQS_ENDPOINT_URL": "http://127.0.0.1:9",
        "CELERY_BROKER_URL": "sqs://127.0.0.1:9",
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
    }
    env.pop("CELERY_SQS_QUEUE_URL", None)
    result = subprocess.run(
        [sys.executable, "-c", CONFIGURED_OPTIONS],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "Celery's SQS queue URL is unknown: set CELERY_SQS_QUEUE_URL" in result.stderr
    assert "cannot reach SQS" in result.stderr
    # No guessed URL: kombu is left to look the queue up itself once SQS answers.
    assert result.stdout.strip() == "{}"


@pytest.mark.django_db
def test_setup_celery_queue_refuses_a_fifo_name(module_settings, local_sqs):
    module_settings.SQS_ENDPOINT_URL = local_sqs.endpoint_url
    module_settings.CELERY_SQS_QUEUE_NAME = "celery.fifo"
    with pytest.raises(CommandError, match="standard queue"):
        call_command("setup_celery_queue")


@pytest.mark.django_db
def test_setup_celery_queue_reports_an_unreachable_endpoint(module_settings):
    from callbacks import sqs

    module_settings.SQS_ENDPOINT_URL = "http://127.0.0.1:9"
    sqs.reset()
    with pytest.raises(CommandError, match="cannot reach SQS"):
        call_command("setup_celery_queue")
    sqs.reset()


def _processed_event(payment, event_id: str, age: timedelta) -> ProcessedEvent:
    record = ProcessedEventFactory(processor_event_id=event_id, payment=payment)
    with history_rewritten():  # a record of that age
        ProcessedEvent.objects.filter(pk=event_id).update(processed_at=timezone.now() - age)
    return record


@pytest.mark.subprocess
@pytest.mark.parametrize("queue_url_given", [True, False], ids=["url-given", "url-looked-up"])
@pytest.mark.django_db(transaction=True)
def test_real_worker_on_the_sqs_broker_runs_a_beat_task(
    module_settings, local_sqs, tmp_path, queue_url_given
):
    name, url = celery_queue_setup(module_settings, local_sqs)
    payment = PaymentFactory(state="submitted")
    _processed_event(payment, "evt_old", timedelta(days=40))
    _processed_event(payment, "evt_recent", timedelta(days=1))

    env = broker_environment(local_sqs, name, url)
    if not queue_url_given:
        del env["CELERY_SQS_QUEUE_URL"]
    log = tmp_path / "worker.log"
    with open(log, "w") as log_file:
        worker = subprocess.Popen(
            [
                str(ROOT / ".venv" / "bin" / "celery"),
                "-A",
                "config",
                "worker",
                "--pool=solo",
                "--without-heartbeat",
                "--without-gossip",
                "--without-mingle",
                "--loglevel=INFO",
                "-Q",
                name,
            ],
            cwd=ROOT,
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    try:
        entry = django_settings.CELERY_BEAT_SCHEDULE["processed-events-purge"]
        # Not the current app: it would stay so for the tests after this one in the process,
        # and the product sends its tasks through the current app.
        sender = Celery("sender", set_as_current=False)
        transport = {
            "region": "us-east-1",
            "is_secure": False,
            "predefined_queues": {name: {"url": url}},
        }
        with Connection(f"sqs://127.0.0.1:{local_sqs.port}", transport_options=transport) as broker:
            sender.send_task(entry["task"], connection=broker, queue=name)

        old = ProcessedEvent.objects.filter(pk="evt_old")
        wait_for(lambda: not old.exists(), 60, "the task run", watch=[worker], logs=[log])
        assert ProcessedEvent.objects.filter(pk="evt_recent").exists()
        wait_for(lambda: "succeeded" in log.read_text(), 10, "its success", logs=[log])
        assert f"Task {entry['task']}" in log.read_text()
        assert "succeeded" in log.read_text()
    finally:
        worker.terminate()
        try:
            worker.wait(20)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()


@pytest.mark.django_db(transaction=True)
def test_overlapping_tick_skips_while_the_lock_is_held():
    payment = PaymentFactory(state="submitted")
    _processed_event(payment, "evt_old", timedelta(days=40))
    db = connection.settings_dict
    with psycopg.connect(
        host=db["HOST"], port=db["PORT"], user=db["USER"], dbname=db["NAME"], autocommit=True
    ) as other:
        other.execute("SELECT pg_advisory_lock(%s)", [_lock_key("payments.processed_events_purge")])
        assert processed_events_purge() == 0
        assert ProcessedEvent.objects.filter(pk="evt_old").exists()
        other.execute(
            "SELECT pg_advisory_unlock(%s)", [_lock_key("payments.processed_events_purge")]
        )
    assert processed_events_purge() == 1
    assert not ProcessedEvent.objects.filter(pk="evt_old").exists()


@pytest.mark.django_db(transaction=True)
def test_single_flight_releases_its_lock_when_the_block_raises():
    with pytest.raises(RuntimeError), single_flight("t"):
        raise RuntimeError("boom")
    with single_flight("t") as first:
        assert first is True
        db = connection.settings_dict
        with psycopg.connect(
            host=db["HOST"], port=db["PORT"], user=db["USER"], dbname=db["NAME"]
        ) as other:
            taken = other.execute("SELECT pg_try_advisory_lock(%s)", [_lock_key("t")]).fetchone()
            assert taken == (False,)


def metric_families(port: int) -> dict[str, str]:
    """The families http://127.0.0.1:port/metrics serves, each with its samples' text."""
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return {
        family.name: " ".join(f"{sample.labels} {sample.value}" for sample in family.samples)
        for family in text_string_to_metric_families(text)
    }


@pytest.mark.subprocess
def test_a_metrics_port_that_cannot_be_bound_stops_beat_naming_it(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        beat = _start(
            ["beat", "--schedule", str(tmp_path / "schedule"), "--metrics-port", str(port)],
            {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings.test"},
            tmp_path / "beat.log",
        )
        try:
            beat.wait(60)
        finally:
            _stop(beat)
    assert beat.returncode != 0
    assert f"cannot serve metrics on 127.0.0.1:{port}" in (tmp_path / "beat.log").read_text()


def _start(args: list[str], env: dict, log: Path) -> subprocess.Popen:
    with open(log, "w") as log_file:
        return subprocess.Popen(
            [str(ROOT / ".venv" / "bin" / "celery"), "-A", "config", *args],
            cwd=ROOT,
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )


def _stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.mark.subprocess
@pytest.mark.django_db(transaction=True)
def test_beat_and_worker_ingest_a_dead_letter_on_schedule(
    module_settings, sqs_queues, local_sqs, tmp_path
):
    from triage.models import Alert, DeadLetter

    name, url = celery_queue_setup(module_settings, local_sqs)
    sqs_queues.client.send_message(
        QueueUrl=sqs_queues.dlq_url,
        MessageBody='{"kind": "processor_event", "payment_id": "not-a-payment"}',
        MessageGroupId="g-1",
        MessageDeduplicationId="d-1",
    )
    env = broker_environment(local_sqs, name, url)
    env.update(
        {
            "SQS_QUEUE_NAME": module_settings.SQS_QUEUE_NAME,
            "SQS_DLQ_NAME": module_settings.SQS_DLQ_NAME,
            "DLQ_INGEST_INTERVAL_SECONDS": "1",
        }
    )
    worker_port, beat_port = free_port(), free_port()
    worker = _start(
        ["worker", "--pool=solo", "--without-heartbeat", "--without-gossip", "--without-mingle",
         "-Q", name, "--loglevel=INFO", "--metrics-port", str(worker_port)],
        env,
        tmp_path / "worker.log",
    )  # fmt: skip
    beat = _start(
        ["beat", "--loglevel=INFO", "--schedule", str(tmp_path / "beat-schedule"),
         "--metrics-port", str(beat_port)],
        env,
        tmp_path / "beat.log",
    )  # fmt: skip
    logs = [tmp_path / "beat.log", tmp_path / "worker.log"]
    try:
        wait_for(
            DeadLetter.objects.exists,
            60,
            "a dead letter ingested",
            watch=[worker, beat],
            logs=logs,
        )
        # Each process serves its own counters on its own port (a host of its own is scraped
        # there): the worker's show the task it ran.
        for port in (worker_port, beat_port):
            families = metric_families(port)
            assert "payments_transitions" in families, families
        wait_for(
            lambda: "'succeeded'" in metric_families(worker_port)["payments_celery_tasks"],
            30,
            "the worker's task counted on its port",
            watch=[worker],
            logs=logs,
        )
    finally:
        _stop(beat)
        _stop(worker)
    # SIGTERM stopped each, the metrics server with it (beat's hung there until killed).
    assert (beat.returncode, worker.returncode) == (0, 0), logs[0].read_text()[-3000:]
    dead_letter = DeadLetter.objects.get()
    assert dead_letter.source == "redrive_policy"
    assert "Sending due task dead-letters-ingest" in (tmp_path / "beat.log").read_text()
    assert Alert.objects.filter(key=f"dead_letter:{dead_letter.pk}", severity="high").exists()
