"""Batched deletes for the retention purges of every app (payments, callbacks, triage).

A purge never deletes its whole backlog in one statement: the first run over months of rows
would hold row locks on all of them, bloat one huge transaction and stall autovacuum. Each batch
is ``DELETE ... WHERE pk IN (SELECT pk ... ORDER BY pk LIMIT n)`` in its own short transaction,
so the worker's inserts (which never touch rows this old) go on between batches.
"""

from collections.abc import Callable, Sequence
from datetime import timedelta

from django.db import connection, models, transaction
from django.utils import timezone

from payments import conf as payments_conf
from payments.models import CircuitBreakerTransition, OutboxMessage


def _delete_ids(model: type[models.Model], column: str, ids: Sequence) -> int:
    table = connection.ops.quote_name(model._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"DELETE FROM {table} WHERE {connection.ops.quote_name(column)} = ANY(%s)",  # noqa: S608
            [list(ids)],
        )
        return cursor.rowcount


def batched_delete(
    queryset: models.QuerySet,
    *,
    batch_size: int | None = None,
    before_each: Callable[[list], None] | None = None,
) -> int:
    """Delete every row of ``queryset`` in primary-key batches of ``batch_size``, each batch in
    its own transaction; return how many rows went.

    ``before_each(ids)`` runs inside the batch's transaction before the rows go: it deletes the
    children that reference them (their foreign keys are PROTECT, as history should be). The
    batch is picked and deleted in the same transaction with ``FOR UPDATE SKIP LOCKED``, so a row
    another transaction is changing right now is left for the next run instead of waited for.
    """
    batch_size = batch_size or payments_conf.RETENTION_PURGE_BATCH_SIZE
    model = queryset.model
    pk = model._meta.pk
    select = queryset.order_by("pk").values_list("pk", flat=True)
    total = 0
    while True:
        with transaction.atomic():
            ids = list(select.select_for_update(skip_locked=True, of=("self",))[:batch_size])
            if not ids:
                return total
            if before_each is not None:
                before_each(ids)
            total += _delete_ids(model, pk.column, ids)
        if len(ids) < batch_size:
            return total


def outbox_messages_purge(
    *, older_than: timedelta | None = None, batch_size: int | None = None
) -> int:
    """Delete outbox rows published before ``now - older_than`` (default: OUTBOX_RETENTION).

    A published row has done its work (the queue message carries its body and the payment's
    event log its history); unpublished rows are never touched, whatever their age."""
    cutoff = timezone.now() - (older_than or payments_conf.OUTBOX_RETENTION)
    return batched_delete(
        OutboxMessage.objects.filter(published_at__lt=cutoff), batch_size=batch_size
    )


def breaker_transitions_purge(
    *, older_than: timedelta | None = None, batch_size: int | None = None
) -> int:
    """Delete circuit-breaker transitions older than BREAKER_TRANSITION_RETENTION; the breaker's
    current state lives on ``CircuitBreaker`` and is never touched."""
    cutoff = timezone.now() - (older_than or payments_conf.BREAKER_TRANSITION_RETENTION)
    return batched_delete(
        CircuitBreakerTransition.objects.filter(created_at__lt=cutoff), batch_size=batch_size
    )
