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


@shared_task(name="payments.tasks.available_totals_fold", ignore_result=True)
def available_totals_fold() -> int:
    """Fold the ledger's appended changes into the available totals payouts read, for the
    merchants that do not pay out often enough to fold them themselves."""
    from payments.services.available import available_totals_fold as fold

    with single_flight("payments.available_totals_fold") as acquired:
        if not acquired:
            return 0
        folded = fold()
    if folded:
        logger.info("folded the available totals' changes of %s merchant currencies", folded)
    return folded


@shared_task(name="payments.tasks.review_holds_check", ignore_result=True)
def review_holds_check() -> int:
    """Alert on each payment held for review longer than ``REVIEW_HOLD_ALERT_HOURS``."""
    from payments.services.review import review_holds_overdue_alert

    with single_flight("payments.review_holds_check") as acquired:
        if not acquired:
            return 0
        return review_holds_overdue_alert()


@shared_task(name="payments.tasks.account_validations_advance", ignore_result=True)
def account_validations_advance() -> int:
    """End the account validations whose time has come: prenotes past their wait (validated),
    micro-entries past their expiry (failed), and ask a validation service again where it
    could not answer; the debits held on them follow."""
    from payments.services.validation import account_validations_advance as advance

    with single_flight("payments.account_validations_advance") as acquired:
        if not acquired:
            return 0
        return advance()


@shared_task(name="payments.tasks.events_purge", ignore_result=True)
def events_purge() -> int:
    """Delete events older than EVENT_RETENTION_DAYS, with their deliveries (idempotent)."""
    from payments import retention

    with single_flight("payments.events_purge") as acquired:
        if not acquired:
            return 0
        deleted = retention.events_purge()
    logger.info("purged %s events past retention", deleted)
    return deleted


@shared_task(name="payments.tasks.webhooks_dispatch", ignore_result=True)
def webhooks_dispatch() -> int:
    """Number and fan out committed events, then hand each due delivery to ``webhook_deliver``.
    A delivery whose task is lost (or whose worker dies) is claimed again when its lease ends.
    A broker that cannot take a task (down, unreachable) leaves the deliveries not yet handed
    over due again at once, rather than leased to no one, and the error is raised: the next
    dispatch after the broker is back sends them without waiting out their lease."""
    from payments.webhooks.delivery import deliveries_claim, deliveries_release, events_dispatch

    events_dispatch()
    claimed = deliveries_claim(limit=500)
    for handed, delivery_id in enumerate(claimed):
        try:
            webhook_deliver.delay(delivery_id)
        except Exception:
            # kombu's OperationalError, or the transport's own (botocore's for SQS): the task
            # may or may not have reached the broker, and a delivery is at least once.
            released = deliveries_release(claimed[handed:])
            logger.warning(
                "the broker refused a delivery task: %s claimed deliveries made due again",
                released,
            )
            raise
    return len(claimed)


@shared_task(name="payments.tasks.webhook_deliver", ignore_result=True, acks_late=True)
def webhook_deliver(delivery_id: int) -> None:
    """Send one claimed delivery and record the attempt."""
    from payments.webhooks.delivery import delivery_attempt

    delivery_attempt(delivery_id=delivery_id)
