"""Periodic housekeeping of the payments core (scheduled by beat, see CELERY_BEAT_SCHEDULE):
thin wrappers over the purges of ``payments.retention``, one run at a time."""

import logging

from celery import shared_task

from payments.kernel.locks import single_flight

logger = logging.getLogger(__name__)


@shared_task(name="payments.tasks.processed_events_purge", ignore_result=True)
def processed_events_purge() -> int:
    """Delete dedup records older than PROCESSED_EVENT_RETENTION (idempotent)."""
    from payments import retention

    with single_flight("payments.processed_events_purge") as acquired:
        if not acquired:
            return 0
        deleted = retention.processed_events_purge()
    logger.info("purged %s processed-event records past retention", deleted)
    return deleted


@shared_task(name="payments.tasks.idempotency_keys_purge", ignore_result=True)
def idempotency_keys_purge() -> int:
    """Delete API idempotency keys older than API_IDEMPOTENCY_RETENTION (idempotent)."""
    from payments import retention

    with single_flight("payments.idempotency_keys_purge") as acquired:
        if not acquired:
            return 0
        deleted = retention.idempotency_keys_purge()
    logger.info("purged %s API idempotency keys past retention", deleted)
    return deleted


@shared_task(name="payments.tasks.outbox_messages_purge", ignore_result=True)
def outbox_messages_purge() -> int:
    """Delete outbox rows published before OUTBOX_RETENTION (idempotent)."""
    from payments import retention

    with single_flight("payments.outbox_messages_purge") as acquired:
        if not acquired:
            return 0
        deleted = retention.outbox_messages_purge()
    logger.info("purged %s published outbox rows past retention", deleted)
    return deleted


@shared_task(name="payments.tasks.breaker_transitions_purge", ignore_result=True)
def breaker_transitions_purge() -> int:
    """Delete circuit-breaker transitions older than BREAKER_TRANSITION_RETENTION (idempotent)."""
    from payments import retention

    with single_flight("payments.breaker_transitions_purge") as acquired:
        if not acquired:
            return 0
        deleted = retention.breaker_transitions_purge()
    logger.info("purged %s circuit-breaker transitions past retention", deleted)
    return deleted


@shared_task(name="payments.tasks.refunds_release", ignore_result=True)
def refunds_release() -> int:
    """Send the refunds held until their debit's return window passed
    (``REFUND_HOLD_BANKING_DAYS``)."""
    from payments.services.refunds import refunds_release as release

    with single_flight("payments.refunds_release") as acquired:
        if not acquired:
            return 0
        return release()
