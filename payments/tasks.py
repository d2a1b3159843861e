"""Periodic housekeeping of the payments core (scheduled by beat, see CELERY_BEAT_SCHEDULE):
thin wrappers over the purges of ``payments.retention``, one run at a time."""

import logging

from celery import shared_task

from payments.locks import single_flight

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


@shared_task(name="payments.tasks.nacha_send", ignore_result=True)
def nacha_send() -> int:
    """The bank path's outbound round (``nacha_send_due``): cut when a window is closing,
    deliver, settle; one run at a time. Returns how many files were delivered."""
    from datetime import timedelta

    from django.utils import timezone

    from payments.nacha.services import nacha_send_due
    from payments.nacha.transports import transport_open
    from payments.vault.services import vault_account_reveal

    with single_flight("payments.nacha_send") as acquired:
        if not acquired:
            return 0
        transport = transport_open()
        try:
            result = nacha_send_due(
                now=timezone.now(),
                transport=transport,
                resolve_account=vault_account_reveal,
                lead=timedelta(minutes=10),
            )
        finally:
            transport.close()
    return len(result.delivered)


@shared_task(name="payments.tasks.books_alerts_check", ignore_result=True)
def books_alerts_check() -> int:
    """The books' alerts (``payments.books.monitoring``): a banking day not closed by its hour,
    a variance unexplained too long. Returns how many conditions hold."""
    from payments.books.monitoring import books_alerts_check as check

    snapshot = check()
    return len(snapshot.days_not_closed) + len(snapshot.aged_variances)


@shared_task(name="payments.tasks.bank_statements_collect", ignore_result=True)
def bank_statements_collect() -> int:
    """One import-and-match pass of the bank's statements (``bank_statements_collect``), one
    run at a time; nothing when ``PAYMENTS_BOOKS['STATEMENT_TRANSPORT']`` is not set. Returns
    how many statements were imported."""
    from payments.books.conf import statement_transport_options
    from payments.books.services import bank_statements_collect as collect
    from payments.nacha.transports import transport_open

    options = statement_transport_options()
    if options is None:
        logger.info("no statement transport set: bank statements are not collected")
        return 0
    with single_flight("payments.bank_statements_collect") as acquired:
        if not acquired:
            return 0
        transport = transport_open(options)
        try:
            result = collect(transport=transport)
        finally:
            transport.close()
    return len(result.imported)


@shared_task(name="payments.tasks.refunds_release", ignore_result=True)
def refunds_release() -> int:
    """Send the refunds held until their debit's return window passed
    (``REFUND_HOLD_BANKING_DAYS``)."""
    from payments.services.refunds import refunds_release as release

    with single_flight("payments.refunds_release") as acquired:
        if not acquired:
            return 0
        return release()
