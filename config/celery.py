"""The Celery app: broker SQS (kombu's SQS transport), periodic tasks scheduled by beat.

Settings come from Django settings with the ``CELERY_`` prefix (``config/settings/base.py``:
broker URL and transport options). The apps' tasks are ``shared_task``s found by
``autodiscover_tasks()``; the beat schedule is the module's own (``triage.beat``), which a host
project merges into its schedule the same way.

Run: ``celery -A config worker`` and ``celery -A config beat`` (one beat only).
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.base")

app = Celery("payments")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


def _module_wiring() -> None:
    from callbacks.celery_metrics import celery_metrics_configure
    from callbacks.celery_queue import celery_queue_configure

    celery_queue_configure(app)
    celery_metrics_configure(app)


_module_wiring()
