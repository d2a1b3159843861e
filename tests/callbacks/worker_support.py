"""Helpers for the worker tests: put messages on the queue, read queues, run worker processes."""

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from django.conf import settings
from django.core.management import call_command

from callbacks import conf as callbacks_conf
from callbacks.schema import event_deduplication_id, processor_event_message
from payments import conf as payments_conf
from payments.models import Payment, PaymentEvent
from tests.factories import processor_event
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]


def send_event(client, url, payment, event_type, *, dedup_id=None, **overrides) -> tuple[str, dict]:
    """Publish a processor event as the callback endpoint would; return (message id, body)."""
    event = processor_event(payment, event_type, **overrides)
    body = processor_event_message(event, received_at=datetime.now(UTC))
    response = client.send_message(
        QueueUrl=url,
        MessageBody=json.dumps(body),
        MessageGroupId=str(payment.id),
        MessageDeduplicationId=dedup_id or event_deduplication_id(event),
    )
    return response["MessageId"], body


def send_body(client, url, group_id, body, *, dedup_id=None) -> str:
    response = client.send_message(
        QueueUrl=url,
        MessageBody=body if isinstance(body, str) else json.dumps(body),
        MessageGroupId=str(group_id),
        MessageDeduplicationId=dedup_id or uuid.uuid4().hex,
    )
    return response["MessageId"]


def receive_head(client, url, *, visibility=30) -> dict:
    """Receive the first visible message alone, as a worker with a batch size of one would.

    A group's next message stays behind it while it is in flight, on every server: the way to
    have one message of a group in hand whether the server returns one per group (fauxqs) or
    several in one receive (LocalStack, and AWS at times)."""
    [message] = client.receive_message(
        QueueUrl=url,
        MaxNumberOfMessages=1,
        WaitTimeSeconds=0,
        VisibilityTimeout=visibility,
        AttributeNames=["All"],
        MessageSystemAttributeNames=["All"],
    )["Messages"]
    return message


def drain(client, url, *, visibility=30) -> list[dict]:
    """Receive everything visible, without deleting: one message per group on fauxqs, several
    of a group in one receive on LocalStack, which is why its order is not asserted here."""
    seen: dict[str, dict] = {}
    for _ in range(200):
        response = client.receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=0,
            VisibilityTimeout=visibility,
            AttributeNames=["All"],
            MessageSystemAttributeNames=["All"],
        )
        messages = response.get("Messages") or []
        if not messages:
            break
        for m in messages:
            seen[m["MessageId"]] = m
    return list(seen.values())


def queue_counts(client, url) -> tuple[int, int]:
    """(visible, in flight) as the queue reports them."""
    attributes = client.get_queue_attributes(
        QueueUrl=url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return (
        int(attributes["ApproximateNumberOfMessages"]),
        int(attributes["ApproximateNumberOfMessagesNotVisible"]),
    )


def worker_env(**extra: str) -> dict[str, str]:
    """The environment a worker subprocess needs to reach the test database and queues."""
    env = dict(os.environ)
    database = settings.DATABASES["default"]
    env.update(
        DJANGO_SETTINGS_MODULE="config.settings.test",
        DATABASE_URL=(
            f"postgres://{database['USER']}@{database['HOST']}:{database['PORT']}/"
            f"{database['NAME']}"
        ),
        SQS_ENDPOINT_URL=callbacks_conf.SQS_ENDPOINT_URL,
        SQS_QUEUE_NAME=callbacks_conf.SQS_QUEUE_NAME,
        SQS_DLQ_NAME=callbacks_conf.SQS_DLQ_NAME,
        PROCESSOR_BASE_URL=payments_conf.PROCESSOR_BASE_URL,
        PROCESSOR_TIMEOUT_SECONDS=str(payments_conf.PROCESSOR_TIMEOUT_SECONDS),
        WORKER_BACKOFF_BASE_SECONDS=str(callbacks_conf.WORKER_BACKOFF_BASE_SECONDS),
        WORKER_BACKOFF_CAP_SECONDS=str(callbacks_conf.WORKER_BACKOFF_CAP_SECONDS),
        AWS_ACCESS_KEY_ID=env.get("AWS_ACCESS_KEY_ID", "test"),
        AWS_SECRET_ACCESS_KEY=env.get("AWS_SECRET_ACCESS_KEY", "test"),
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


class WorkerProcess:
    """``manage.py run_sqs_worker`` as a real child process; output goes to a log file.
    ``program``: another command line that runs the worker (its options follow it)."""

    def __init__(
        self,
        *args: str,
        log_dir: Path,
        name: str = "worker",
        program: tuple[str, ...] = (str(ROOT / "manage.py"), "run_sqs_worker"),
        **env: str,
    ) -> None:
        self.log_path = log_dir / f"{name}.log"
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in wait()
        self.process = subprocess.Popen(
            [sys.executable, *program, *args],
            cwd=ROOT,
            env=worker_env(**env),
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    @property
    def output(self) -> str:
        return self.log_path.read_text()

    def wait_for(self, text: str, timeout: float = 30) -> None:
        """Until ``text`` is in the worker's output; fails at once if the worker exits."""
        wait_for(lambda: text in self.output, timeout, f"{text!r} in its output", watch=[self])

    def signal(self, signum: int = signal.SIGTERM) -> None:
        self.process.send_signal(signum)

    def kill(self) -> None:
        self.process.kill()
        self.wait()

    def wait(self, timeout: float = 120) -> int:
        try:
            return self.process.wait(timeout)
        finally:
            self._log.close()


def run_worker(**options):
    """run_sqs_worker until the queue is empty, without the outbox relay, at once."""
    options.setdefault("until_empty", True)
    options.setdefault("wait_time", 0)
    options.setdefault("visibility_timeout", 30)
    options.setdefault("relay", False)
    call_command("run_sqs_worker", **options)


def run_worker_until(done, *, timeout: float = 10, **options) -> None:
    """run_worker, and again until ``done()`` holds.

    ``--until-empty`` stops once the retries it scheduled are due, but a server makes a hidden
    message visible again only when it next looks: fauxqs on time, LocalStack up to a second
    late (it sweeps expired visibility once a second), so the last retry may come back after
    the run has ended."""
    deadline = time.monotonic() + timeout
    run_worker(**options)
    while not done():
        assert time.monotonic() < deadline, "the worker's retries did not come back in time"
        time.sleep(0.2)
        run_worker(**options)


def run_worker_receives(count: int, **options) -> None:
    """``count`` runs of one message each, each waiting (long poll) for a message to come back
    from its backoff: ``count`` receives however late the server returns a hidden message."""
    for _ in range(count):
        run_worker(max_messages=1, wait_time=5, **options)


def applied_moves(payment) -> list[tuple[str, str]]:
    """The (from, to) states of a payment's applied submission and processor events, in the
    order the event log was written (by id: rows of one statement share a created_at)."""
    return list(
        PaymentEvent.objects.filter(
            payment=payment, outcome="applied", kind__in=("submission", "processor_event")
        )
        .order_by("id")
        .values_list("from_state", "to_state")
    )


def applied_events(payment) -> list[str]:
    """The event types applied to a payment, in order."""
    return list(
        PaymentEvent.objects.filter(payment=payment, kind="processor_event", outcome="applied")
        .order_by("id")
        .values_list("event_type", flat=True)
    )


def payments_created(
    count: int, prefix: str, *, merchant_id: str = "merchant-test", first_amount: str = "10.00"
) -> list[Payment]:
    """``count`` payments through ``payment_create`` (each with its outbox row), amounts rising
    by one from ``first_amount``, tokens ``tok_<prefix>_<n>xyz`` (no token rule of the
    sandbox's)."""
    from decimal import Decimal

    from payments.services import payment_create

    return [
        payment_create(
            merchant_id=merchant_id,
            amount=Decimal(first_amount) + n,
            source_token=f"tok_{prefix}_{n:05d}xyz",
        )
        for n in range(count)
    ]
