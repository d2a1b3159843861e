"""Periodic work of the queue layer (scheduled by beat, see CELERY_BEAT_SCHEDULE)."""

import logging
from datetime import timedelta

from celery import shared_task

from payments.kernel.locks import single_flight

logger = logging.getLogger(__name__)


@shared_task(name="callbacks.tasks.outbox_relay_publish", ignore_result=True)
def outbox_relay_publish(limit: int = 500) -> int:
    """Publish outbox rows left unpublished for over a minute (queue down, crash after commit).

    Idempotent: rows are published under their deduplication ids, in group order, and marked
    published; a row published twice is dropped by the queue.
    """
    from callbacks import outbox

    with single_flight("callbacks.outbox_relay_publish") as acquired:
        if not acquired:
            return 0
        published = outbox.outbox_relay_publish(limit=limit, older_than=timedelta(minutes=1))
    if published:
        logger.info("outbox relay published %s message(s) left unpublished", published)
    return published


@shared_task(name="callbacks.tasks.payments_reconcile", ignore_result=True)
def payments_reconcile() -> int:
    """Ask the processor about stuck payments and publish what it knows (idempotent)."""
    from callbacks import reconciliation

    with single_flight("callbacks.payments_reconcile") as acquired:
        if not acquired:
            return 0
        return reconciliation.payments_reconcile()


@shared_task(name="callbacks.tasks.processor_events_pull", ignore_result=True)
def processor_events_pull() -> int:
    """Pull the processor's events after the stored cursor onto the queue (one pass, one at a
    time: the pass holds its own lock). Returns how many events it pulled."""
    from callbacks import events_pull

    return events_pull.processor_events_pull().pulled


@shared_task(name="callbacks.tasks.queue_messages_purge", ignore_result=True)
def queue_messages_purge() -> int:
    """Delete records of cleanly finished messages past QUEUE_MESSAGE_RETENTION (idempotent)."""
    from callbacks import retention

    with single_flight("callbacks.queue_messages_purge") as acquired:
        if not acquired:
            return 0
        deleted = retention.queue_messages_purge()
    logger.info("purged %s queue-message records past retention", deleted)
    return deleted


@shared_task(name="callbacks.tasks.holds_purge", ignore_result=True)
def holds_purge() -> int:
    """Delete released holds and their released parked messages past HOLD_RETENTION."""
    from callbacks import retention

    with single_flight("callbacks.holds_purge") as acquired:
        if not acquired:
            return 0
        deleted = retention.holds_purge()
    logger.info("purged %s released holds and parked messages past retention", deleted)
    return deleted
