"""Celery's broker queue on SQS: a standard queue, created or found, and its URL given to kombu.

The host's Celery app calls ``celery_queue_configure(app)`` once after building itself; the
``setup_celery_queue`` command prints the URL for ``CELERY_SQS_QUEUE_URL``.
"""

import logging

from callbacks import conf

logger = logging.getLogger(__name__)


class CeleryQueueError(Exception):
    """The broker's SQS queue could not be found or created; the message says why."""


def celery_queue_ensure(*, visibility_timeout: int | None = None) -> str:
    """Return the URL of the broker's standard SQS queue, creating the queue if it is missing.

    The URL is the one SQS's GetQueueUrl/CreateQueue return (on AWS
    ``https://sqs.<region>.amazonaws.com/<account>/<name>``, on the local server its own form),
    which kombu's ``predefined_queues`` must carry.
    """
    from django.conf import settings

    from callbacks import sqs
    from callbacks.queues import broker_queue_attributes

    name = conf.CELERY_SQS_QUEUE_NAME
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
        return sqs.queue_create(
            name=name, attributes=broker_queue_attributes(visibility_timeout=timeout)
        )
    except sqs.QueueRefused as exc:
        raise CeleryQueueError(
            f"SQS refused to create queue {name!r}: {exc.code} {exc.detail}".strip()
        ) from exc
    except sqs.QueueUnavailable as exc:
        raise CeleryQueueError(f"cannot reach SQS to create queue {name!r}: {exc}") from exc


def _predefined_queue_url(sender, source, **kwargs) -> None:
    """Give kombu the broker queue's URL when CELERY_SQS_QUEUE_URL did not.

    Runs once per process, when the Celery configuration is first used (a worker or beat
    starting, a first ``.delay``), never at import. Celery's signal dispatch swallows a
    receiver's exception, so a failure (SQS unreachable) is logged here, naming the setting;
    kombu is then left to its own queue lookup, which retries until SQS answers.
    """
    if not str(sender.conf.broker_url or "").startswith("sqs://"):
        return
    options = source.get("broker_transport_options") or {}
    queues = options.get("predefined_queues") or {}
    name = conf.CELERY_SQS_QUEUE_NAME
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


def celery_queue_configure(app) -> None:
    """Connect the broker queue's URL lookup to ``app`` (a host's Celery app, on SQS)."""
    app.on_after_configure.connect(_predefined_queue_url, weak=False)
