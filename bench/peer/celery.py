"""The peer's Celery app, as Celery's "First steps with Django" writes one: configured from the
Django settings under the ``CELERY_`` namespace (broker ``sqs://``, the standard queue's URL in
``predefined_queues``, see ``config/settings/base.py``), its task module included.

Three options differ from the product's own Celery settings, which are made for its few long
periodic tasks: the peer's tasks are short, so they keep Celery's default prefetch (4 per pool
process, as Celery's optimizing guide leaves short tasks), and the queue is long-polled with no
client-side pause (``polling_interval`` 0), as kombu's SQS documentation advises to rely on
long polling alone. With a pause of 1 s the worker waits a second each time its prefetch is
full, a ceiling of 8 tasks/s: a strawman, not the peer. And Celery's Django fixup closes the
database connection before and after every task unless ``CELERY_DB_REUSE_MAX`` is set, which
would open a PostgreSQL connection per event against the settings' persistent connections
(``CONN_MAX_AGE``); the peer keeps its connection, as a team would once it saw that.
"""

import logging
import os

from celery import Celery
from celery.signals import worker_ready

from bench.peer import READY_LINE

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")

app = Celery("peer", include=["bench.peer.tasks"])
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.worker_prefetch_multiplier = 4
app.conf["CELERY_DB_REUSE_MAX"] = 1_000_000
app.conf.broker_transport_options = {
    **(app.conf.broker_transport_options or {}),
    "polling_interval": 0,
}


@worker_ready.connect
def _say_ready(**_kwargs) -> None:
    """One line at warning level, so the benchmark knows the worker consumes without the
    per-task lines of the info level."""
    logging.getLogger("bench.peer").warning(READY_LINE)
