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
