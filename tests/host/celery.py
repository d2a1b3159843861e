"""The host's own Celery app, with the module's periodic tasks merged into its schedule."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.host.settings")

app = Celery("shop")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

SHOP_SCHEDULE = {
    "shop-nightly-report": {"task": "shop.nightly_report", "schedule": 86400.0},
}


def _wire_payments_module() -> None:
    from callbacks.celery_queue import celery_queue_configure
    from triage.beat import beat_schedule

    app.conf.beat_schedule = {**SHOP_SCHEDULE, **beat_schedule()}
    celery_queue_configure(app)


_wire_payments_module()
