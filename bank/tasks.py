"""The bank path's periodic rounds (scheduled by beat, ``triage.beat`` with ``bank_direct``):
sending files, collecting the bank's return and NOC files and its statements, and the books'
alerts; each one run at a time. The lock names are those of 0.1.0, when these tasks were the
payments and callbacks apps', so a worker of either release keeps out of the other's round."""

import logging

from celery import shared_task

from payments.kernel.locks import single_flight

logger = logging.getLogger(__name__)


@shared_task(name="bank.tasks.nacha_send", ignore_result=True)
def nacha_send() -> int:
    """The bank path's outbound round (``nacha_send_due``): cut when a window is closing,
    deliver, settle; one run at a time. Returns how many files were delivered."""
    from datetime import timedelta

    from django.utils import timezone

    from bank.nacha.services import nacha_send_due
    from bank.nacha.transports import transport_open
    from bank.vault.services import vault_account_reveal

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


@shared_task(name="bank.tasks.nacha_collect", ignore_result=True)
def nacha_collect() -> int:
    """Collect the bank's return and NOC files and queue their events; one run at a time.
    Returns how many events were queued (the main queue and the DLQ)."""
    from bank.collect import nacha_files_collect
    from bank.nacha.transports import transport_open

    with single_flight("callbacks.nacha_collect") as acquired:
        if not acquired:
            return 0
        transport = transport_open()
        try:
            result = nacha_files_collect(transport=transport)
        finally:
            transport.close()
    return result.published + result.dead_lettered


@shared_task(name="bank.tasks.books_alerts_check", ignore_result=True)
def books_alerts_check() -> int:
    """The books' alerts (``bank.books.monitoring``): a banking day not closed by its hour,
    a variance unexplained too long. Returns how many conditions hold."""
    from bank.books.monitoring import books_alerts_check as check

    snapshot = check()
    return len(snapshot.days_not_closed) + len(snapshot.aged_variances)


@shared_task(name="bank.tasks.bank_statements_collect", ignore_result=True)
def bank_statements_collect() -> int:
    """One import-and-match pass of the bank's statements (``bank_statements_collect``), one
    run at a time; nothing when ``BANK['BOOKS_STATEMENT_TRANSPORT']`` is not set. Returns
    how many statements were imported."""
    from bank.books.conf import statement_transport_options
    from bank.books.services import bank_statements_collect as collect
    from bank.nacha.transports import transport_open

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
