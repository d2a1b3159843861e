"""No event is lost to a crash: a Celery worker SIGKILLed mid-delivery (its task message comes
back from the broker, the next worker sends it again under the same webhook-id), a process that
dies between the commit of an event and any send (the dispatcher sweeps committed events up),
and receivers that answer slowly."""

import signal
import subprocess
import sys
import textwrap
import time

import pytest
from celery import Celery
from django.utils import timezone
from kombu import Connection

from payments.webhooks.delivery import deliveries_run
from payments.webhooks.models import DeliveryStatus, Event, WebhookAttempt, WebhookDelivery
from tests.localsqs import LocalSqs
from tests.payments.webhook_support import endpoint_for, settle
from tests.test_celery import ROOT, broker_environment
from tests.triage.test_bulk_celery import celery_queue_setup, worker_start
from tests.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

WEBHOOKS_TO_LOOPBACK = {"WEBHOOK_ALLOW_HTTP": "true", "WEBHOOK_ALLOW_PRIVATE_ADDRESSES": "true"}


@pytest.mark.subprocess
def test_a_celery_worker_killed_mid_delivery_loses_no_event(
    receiver, module_settings, local_sqs, tmp_path
):
    """The dispatch task hands each delivery to its own task (acknowledged late); the worker
    is SIGKILLed while the receiver holds the first request. The broker hands the unacknowledged
    task to the next worker, which sends both: the first again under its webhook-id."""
    name, url = celery_queue_setup(module_settings, local_sqs, visibility_timeout=5)
    env = {**broker_environment(local_sqs, name, url), **WEBHOOKS_TO_LOOPBACK}
    env["CELERY_SQS_VISIBILITY_TIMEOUT"] = "5"
    endpoint_for(receiver)
    settle()
    receiver.hang_seconds = 60
    transport = {
        "region": "us-east-1",
        "is_secure": False,
        "predefined_queues": {name: {"url": url}},
    }
    with Connection(f"sqs://127.0.0.1:{local_sqs.port}", transport_options=transport) as broker:
        Celery("sender", set_as_current=False).send_task(
            "payments.tasks.webhooks_dispatch", connection=broker, queue=name
        )

    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    first = worker_start(env, name, first_log)
    try:
        wait_for(
            lambda: receiver.requests >= 1, 60, "the first request", watch=[first], logs=[first_log]
        )
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(30)
    receiver.hang_seconds = 0
    assert not WebhookAttempt.objects.exists()  # it died before recording anything

    second = worker_start(env, name, second_log)
    try:
        wait_for(
            lambda: WebhookDelivery.objects.filter(status=DeliveryStatus.SUCCEEDED).count() == 2,
            90,
            "both deliveries",
            watch=[second],
            logs=[second_log],
        )
    finally:
        second.terminate()
        second.wait(30)

    assert len(receiver.verified) == 2 and receiver.refused == 0
    first_id = receiver.headers[0]["webhook-id"]
    assert receiver.ids[first_id] == 2 and receiver.repeats == 1  # one repeat, same id
    assert "payments.tasks.webhook_deliver" in second_log.read_text()


@pytest.mark.subprocess
def test_a_process_killed_right_after_committing_an_event_loses_nothing(receiver):
    """The event commits with its cause; the process dies before any dispatch or send. The
    events table is the outbox: the next dispatch, in any process, numbers and sends it."""
    endpoint_for(receiver)
    from tests.callbacks.worker_support import worker_env

    code = textwrap.dedent(
        """
        import os, signal, django
        django.setup()
        from tests.payments.webhook_support import settle
        settle()
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    died = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=worker_env(), capture_output=True, timeout=60
    )
    assert died.returncode == -signal.SIGKILL, died.stderr.decode()[-2000:]
    assert Event.objects.filter(position__isnull=True).count() == 2  # committed, not sent

    assert deliveries_run() == 2
    assert sorted(body["type"] for body in receiver.verified) == [
        "payment.confirmed",
        "payment.submitted",
    ]


def test_a_slow_receiver_within_the_timeout_is_delivered_and_its_latency_recorded(
    receiver, module_settings
):
    module_settings.WEBHOOK_TIMEOUT_SECONDS = 2
    endpoint_for(receiver)
    receiver.hang_seconds = 0.6
    settle()
    started = time.monotonic()
    deliveries_run()
    assert time.monotonic() - started >= 1.2
    assert WebhookDelivery.objects.filter(status=DeliveryStatus.SUCCEEDED).count() == 2
    assert all(
        latency >= 600 for latency in WebhookAttempt.objects.values_list("latency_ms", flat=True)
    )


@pytest.mark.subprocess
def test_the_sender_process_outlives_a_database_it_cannot_reach(tmp_path):
    """Run as a process of its own (the demo's, the chaos run's), the sender reports a round
    the database fails and tries again, rather than exit and leave its deliveries to no one."""
    from tests.callbacks.worker_support import worker_env
    from tests.gunicorn_support import free_port

    env = worker_env(DATABASE_URL=f"postgres://postgres@127.0.0.1:{free_port()}/nowhere")
    log = tmp_path / "sender.log"
    with open(log, "w") as out:
        sender = subprocess.Popen(
            [sys.executable, "manage.py", "webhooks_deliver", "--interval", "0.2"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(lambda: log.read_text().count("trying again") >= 2, 30, "two failed rounds")
        assert sender.poll() is None, log.read_text()
    finally:
        sender.kill()
        sender.wait(10)


@pytest.mark.subprocess
def test_the_broker_down_loses_no_event_and_its_return_sends_each_once(
    receiver, module_settings, tmp_path, local_sqs
):
    """The Celery broker (an SQS server of the test's own) goes down after two events commit.
    The dispatch fails to hand over its deliveries and says so; they stay pending and due, with
    no attempt made. The broker comes back empty (as after an outage); the next dispatch sends
    each event once, under its own webhook-id, without waiting out a lease."""
    broker = LocalSqs().start()  # not the session's server (local_sqs): this one goes down
    try:
        name, url = celery_queue_setup(module_settings, broker, visibility_timeout=30)
        env = {**broker_environment(broker, name, url), **WEBHOOKS_TO_LOOPBACK}
        endpoint_for(receiver)
        settle()
        broker.stop()

        dispatch = subprocess.run(
            [sys.executable, "-c", DISPATCH_IN_PROCESS],
            cwd=ROOT,
            env=env,
            capture_output=True,
            timeout=180,
        )
        output = dispatch.stderr.decode()
        assert dispatch.returncode != 0, output[-2000:]
        assert "made due again" in output, output[-2000:]
        pending = WebhookDelivery.objects.filter(status=DeliveryStatus.PENDING)
        assert pending.count() == 2
        assert all(
            due <= timezone.now() for due in pending.values_list("next_attempt_at", flat=True)
        )
        assert receiver.requests == 0 and not WebhookAttempt.objects.exists()

        broker.start(broker.port)
        celery_queue_setup(module_settings, broker, visibility_timeout=30, name=name)
        worker = worker_start(env, name, tmp_path / "worker.log")
        try:
            dispatch_send(broker, name, url)
            wait_for(
                lambda: (
                    WebhookDelivery.objects.filter(status=DeliveryStatus.SUCCEEDED).count() == 2
                ),
                60,
                "both deliveries after the broker came back",
                watch=[worker],
                logs=[tmp_path / "worker.log"],
            )
        finally:
            worker.terminate()
            worker.wait(30)
    finally:
        broker.stop()

    assert len(receiver.verified) == 2 and receiver.refused == 0
    assert receiver.repeats == 0
    assert len(set(receiver.ids)) == 2


DISPATCH_IN_PROCESS = textwrap.dedent(
    """
    import django
    django.setup()
    from payments.tasks import webhooks_dispatch
    webhooks_dispatch()
    """
)


def dispatch_send(broker: LocalSqs, name: str, url: str) -> None:
    """What beat does on its schedule: put one dispatch task on the broker's queue."""
    transport = {
        "region": "us-east-1",
        "is_secure": False,
        "predefined_queues": {name: {"url": url}},
    }
    with Connection(f"sqs://127.0.0.1:{broker.port}", transport_options=transport) as connection:
        Celery("sender", set_as_current=False).send_task(
            "payments.tasks.webhooks_dispatch", connection=connection, queue=name
        )
