"""The Celery app: broker SQS (kombu's SQS transport), periodic tasks scheduled by beat.

Settings come from Django settings with the ``CELERY_`` prefix (``config/settings/base.py``:
broker URL and transport options, ``CELERY_BEAT_SCHEDULE``). Tasks are thin wrappers in each
app's ``tasks.py``; the periodic ones run under ``single_flight`` so two overlapping beat ticks
(a slow run, a second beat by mistake) never do the same work twice at once.

Run: ``celery -A config worker`` and ``celery -A config beat`` (one beat only).
"""

import contextlib
import hashlib
import logging
import os
from collections.abc import Iterator

from celery import Celery
from celery.signals import worker_process_shutdown

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.base")

logger = logging.getLogger(__name__)

app = Celery("payments")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


class CeleryQueueError(Exception):
    """The broker's SQS queue could not be found or created; the message says why."""


def celery_queue_ensure(*, visibility_timeout: int | None = None) -> str:
    """Return the URL of the broker's standard SQS queue, creating the queue if it is missing.

    The URL is the one SQS's GetQueueUrl/CreateQueue return (on AWS
    ``https://sqs.<region>.amazonaws.com/<account>/<name>``, on the local server its own form),
    which kombu's ``predefined_queues`` must carry.
    """
    from botocore.exceptions import BotoCoreError, ClientError
    from django.conf import settings

    from callbacks import sqs
    from callbacks.queues import broker_queue_attributes

    name = settings.CELERY_SQS_QUEUE_NAME
    if name.endswith(".fifo"):
        raise CeleryQueueError(
            f"CELERY_SQS_QUEUE_NAME {name!r} names a FIFO queue; Celery's queue is a standard "
            "queue (drop the .fifo suffix)"
        )
    transport = getattr(settings, "CELERY_BROKER_TRANSPORT_OPTIONS", {})
    timeout = (
        transport.get("visibility_timeout", 300)
        if visibility_timeout is None
        else (visibility_timeout)
    )
    if not 0 <= timeout <= 43200:
        raise CeleryQueueError(f"visibility timeout must be 0..43200 seconds, got {timeout}")
    try:
        return sqs.sqs_client().create_queue(
            QueueName=name, Attributes=broker_queue_attributes(visibility_timeout=timeout)
        )["QueueUrl"]
    except ClientError as exc:
        error = exc.response.get("Error", {})
        raise CeleryQueueError(
            f"SQS refused to create queue {name!r}: {error.get('Code')} "
            f"{error.get('Message', '')}".strip()
        ) from exc
    except BotoCoreError as exc:
        raise CeleryQueueError(f"cannot reach SQS to create queue {name!r}: {exc}") from exc


@app.on_after_configure.connect
def _predefined_queue_url(sender, source, **kwargs) -> None:
    """Give kombu the broker queue's URL when CELERY_SQS_QUEUE_URL did not.

    Runs once per process, when the Celery configuration is first used (a worker or beat
    starting, a first ``.delay``), never at import. Celery's signal dispatch swallows a
    receiver's exception, so a failure (SQS unreachable) is logged here, naming the setting;
    kombu is then left to its own queue lookup, which retries until SQS answers.
    """
    from django.conf import settings

    if not str(sender.conf.broker_url or "").startswith("sqs://"):
        return
    options = source.get("broker_transport_options") or {}
    queues = options.get("predefined_queues") or {}
    name = settings.CELERY_SQS_QUEUE_NAME
    if name in queues:
        return
    try:
        url = celery_queue_ensure()
    except CeleryQueueError as exc:
        logger.error(
            "Celery's SQS queue URL is unknown: set CELERY_SQS_QUEUE_URL (python manage.py "
            "setup_celery_queue prints it); looking it up failed: %s",
            exc,
        )
        return
    source["broker_transport_options"] = {
        **options,
        "predefined_queues": {**queues, name: {"url": url}},
    }
    logger.info("Celery broker queue %s: %s", name, url)


def _lock_key(name: str) -> int:
    # pg advisory locks take a signed 64-bit key.
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


@contextlib.contextmanager
def single_flight(name: str) -> Iterator[bool]:
    """Hold a cluster-wide lock named ``name`` for the block; yield False if someone holds it.

    PostgreSQL: a session-level advisory lock (``pg_try_advisory_lock``), released in
    ``finally`` and by the server if the connection dies, so a crashed task never leaves it
    held. Nothing is waited for: a second tick finds the lock taken and skips its run.

    SQLite (the one-machine quick start) has no advisory locks: the block always runs (yields
    True). That is safe there because every periodic task is idempotent on its own and SQLite
    serialises writers; it only means two overlapping ticks may both do (harmless) work.
    """
    from django.db import connection

    if connection.vendor != "postgresql":
        yield True
        return
    key = _lock_key(name)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [key])
        acquired = cursor.fetchone()[0]
    if not acquired:
        logger.info("%s is already running elsewhere: this run is skipped", name)
        yield False
        return
    try:
        yield True
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [key])


@worker_process_shutdown.connect
def _prometheus_mark_process_dead(pid=None, **kwargs) -> None:
    """In multiprocess metrics mode, drop an exiting pool process's live gauge files."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid or os.getpid())
