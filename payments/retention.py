"""The payments app's retention purges (dedup records, API idempotency keys, published outbox
rows, circuit-breaker transitions) and the batched delete every app's purges use (payments,
callbacks, triage).

A purge never deletes its whole backlog in one statement: the first run over months of rows
would hold row locks on all of them, bloat one huge transaction and stall autovacuum. Each batch
is ``SELECT pk ... ORDER BY <indexed column> LIMIT n FOR UPDATE SKIP LOCKED`` then
``DELETE ... WHERE pk = ANY(those ids)``, in its own short transaction, so the worker's inserts
(which never touch rows this old) go on between batches.
"""

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from django.db import connection, models, transaction
from django.utils import timezone

from payments import conf as payments_conf
from payments.history import retention_delete
from payments.models import (
    ApiIdempotencyKey,
    CircuitBreakerTransition,
    OutboxMessage,
    ProcessedEvent,
)


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
    order_by: str = "pk",
    batch_size: int | None = None,
    before_each: Callable[[list], None] | None = None,
) -> int:
    """Delete every row of ``queryset`` in batches of ``batch_size`` taken in ``order_by``
    order (an indexed column), each batch in its own transaction; return how many rows went.

    Each batch starts where the last one ended (``order_by >= last value``), so no batch walks
    again over what the previous ones deleted. ``before_each(ids)`` runs inside the batch's
    transaction before the rows go: it deletes the children that reference them (their foreign
    keys are PROTECT, as history should be). The rows themselves go through
    ``payments.history.retention_delete``, the one path by which the database lets a purge
    delete guarded history (the dedup records). The batch is picked and deleted in one transaction
    with ``FOR UPDATE SKIP LOCKED``, so a row another transaction is changing right now is left
    for the next run instead of waited for.
    """
    batch_size = batch_size or payments_conf.RETENTION_PURGE_BATCH_SIZE
    model = queryset.model
    pk = model._meta.pk
    field = pk.name if order_by == "pk" else order_by
    select = queryset.order_by(field).select_for_update(skip_locked=True, of=("self",))
    total, last = 0, None
    while True:
        page = select if last is None else select.filter(**{f"{field}__gte": last})
        with transaction.atomic():
            rows = list(page.values_list("pk", field)[:batch_size])
            if not rows:
                return total
            ids = [row[0] for row in rows]
            if before_each is not None:
                before_each(ids)
            with retention_delete():  # the one path guarded history is deleted through
                total += _delete_ids(model, pk.column, ids)
        if len(rows) < batch_size:
            return total
        last = rows[-1][1]


def id_bound(model: type[models.Model], time_field: str, cutoff: datetime) -> int | None:
    """The smallest id whose row's ``time_field`` is at or after ``cutoff`` (None: the table is
    empty), found by binary search on the primary key in ~log2(rows) index lookups.

    For tables whose integer ids are handed out as their rows are written, at that time: a
    purge of rows older than ``cutoff`` then never needs to look at ids from the bound up,
    and a table of months needs no index on the time column. Ids handed out a little out of time
    order (concurrent inserts) only make a row wait for the next run."""
    ids = model.objects.order_by()
    bounds = ids.aggregate(low=models.Min("pk"), high=models.Max("pk"))
    low, high = bounds["low"], bounds["high"]
    if low is None:
        return None
    high += 1
    while low < high:
        middle = (low + high) // 2
        when = ids.filter(pk__gte=middle).order_by("pk").values_list(time_field, flat=True).first()
        if when is None or when >= cutoff:
            high = middle
        else:
            low = middle + 1
    return low


def outbox_messages_purge(
    *, older_than: timedelta | None = None, batch_size: int | None = None
) -> int:
    """Delete outbox rows published before ``now - older_than`` (default: OUTBOX_RETENTION).

    A published row has done its work (the queue message carries its body and the payment's
    event log its history); unpublished rows are never touched, whatever their age."""
    cutoff = timezone.now() - (older_than or payments_conf.OUTBOX_RETENTION)
    # Published after it was created: nothing from the bound on was published before cutoff.
    bound = id_bound(OutboxMessage, "created_at", cutoff)
    return batched_delete(
        OutboxMessage.objects.filter(published_at__lt=cutoff, pk__lt=bound or 0),
        batch_size=batch_size,
    )


def breaker_transitions_purge(
    *, older_than: timedelta | None = None, batch_size: int | None = None
) -> int:
    """Delete circuit-breaker transitions older than BREAKER_TRANSITION_RETENTION; the breaker's
    current state lives on ``CircuitBreaker`` and is never touched."""
    cutoff = timezone.now() - (older_than or payments_conf.BREAKER_TRANSITION_RETENTION)
    return batched_delete(
        CircuitBreakerTransition.objects.filter(created_at__lt=cutoff),
        order_by="created_at",
        batch_size=batch_size,
    )


def processed_events_purge(
    *, older_than: timedelta | None = None, batch_size: int | None = None
) -> int:
    """Delete dedup records past their retention, in batches; returns how many went.

    Safe to forget: a redelivery of an event whose record is gone finds its payment already in
    (or past) the event's state and is recorded as stale, never applied twice."""
    cutoff = timezone.now() - (older_than or payments_conf.PROCESSED_EVENT_RETENTION)
    return batched_delete(
        ProcessedEvent.objects.filter(processed_at__lt=cutoff),
        order_by="processed_at",  # indexed; the key (the processor's id) is in random order
        batch_size=batch_size,
    )


def idempotency_keys_purge(*, batch_size: int | None = None) -> int:
    """Delete API idempotency keys older than API_IDEMPOTENCY_RETENTION, in batches."""
    cutoff = timezone.now() - payments_conf.API_IDEMPOTENCY_RETENTION
    return batched_delete(
        ApiIdempotencyKey.objects.filter(created_at__lt=cutoff),
        order_by="created_at",
        batch_size=batch_size,
    )


def events_purge(*, now: datetime | None = None) -> int:
    """Delete events older than EVENT_RETENTION_DAYS, with their deliveries and attempts."""
    from payments.webhooks.models import Event, WebhookAttempt, WebhookDelivery

    cutoff = (now or timezone.now()) - timedelta(days=payments_conf.EVENT_RETENTION_DAYS)

    def children_delete(ids: list) -> None:
        WebhookAttempt.objects.filter(delivery__event_id__in=ids).delete()
        WebhookDelivery.objects.filter(event_id__in=ids).delete()

    return batched_delete(
        Event.objects.filter(created_at__lt=cutoff),
        order_by="created_at",
        before_each=children_delete,
    )
