"""Retention purges of the queue layer's records: cleanly finished messages, released holds and
their parked messages, and the error history (triage says which dead letters are closed).

Each deletes in primary-key batches, one short transaction per batch (``batched_delete``).
Nothing a person may still need goes: an active hold, a message still parked behind one, and
the error history of a dead letter triage has not closed are kept whatever their age.
"""

from datetime import timedelta

from django.db.models import Exists, OuterRef, Q, QuerySet
from django.utils import timezone

from callbacks import conf
from callbacks.models import (
    ParkedMessage,
    PaymentHold,
    ProcessingError,
    QueueMessage,
    QueueMessageStatus,
)
from payments.retention import batched_delete, id_bound


def queue_messages_purge(
    *, older_than: timedelta | None = None, batch_size: int | None = None
) -> int:
    """Delete the records of messages finished cleanly before ``now - older_than`` (default:
    QUEUE_MESSAGE_RETENTION); returns how many went. Records with a processing error or behind
    a hold are kept: they are the error history a person may still need (ProcessingError and
    PaymentHold protect them; ``queue_message_history_purge`` purges them later, on its own
    terms).

    Deletes ``batch_size`` rows per transaction in id order, looking only below the first id
    started after the cutoff (``id_bound``), so a run over months of records holds no long
    lock, no huge transaction, and needs no index on ``finished_at``."""
    cutoff = timezone.now() - (older_than or conf.QUEUE_MESSAGE_RETENTION)
    bound = id_bound(QueueMessage, "first_started_at", cutoff)
    stale = QueueMessage.objects.filter(
        status=QueueMessageStatus.DONE, finished_at__lt=cutoff, pk__lt=bound or 0
    ).exclude(
        Exists(ProcessingError.objects.filter(queue_message=OuterRef("pk")))
        | Exists(PaymentHold.objects.filter(caused_by=OuterRef("pk")))
    )
    return batched_delete(stale, batch_size=batch_size)


def holds_purge(*, older_than: timedelta | None = None, batch_size: int | None = None) -> int:
    """Delete parked messages released before HOLD_RETENTION, then holds released before it
    with nothing left parked behind them; returns how many rows went (both kinds).

    Active holds and messages still parked (not yet republished) are never touched."""
    cutoff = timezone.now() - (older_than or conf.HOLD_RETENTION)
    parked = batched_delete(
        ParkedMessage.objects.filter(released_at__lt=cutoff), batch_size=batch_size
    )
    holds = PaymentHold.objects.filter(released_at__lt=cutoff).exclude(
        Exists(ParkedMessage.objects.filter(hold=OuterRef("pk")))
    )
    return parked + batched_delete(holds, batch_size=batch_size)


def queue_message_history_purge(
    *,
    closed_message_ids: QuerySet | None = None,
    older_than: timedelta | None = None,
    batch_size: int | None = None,
) -> int:
    """Delete the finished message records the clean purge keeps, with their error rows, once
    they finished before QUEUE_ERROR_RETENTION: messages that failed and later succeeded,
    parked messages whose parked copy is gone, and dead-lettered messages whose dead letter
    is closed. Returns how many message records went.

    ``closed_message_ids`` (a query of message ids) names the dead-lettered messages a person
    has finished with; the queue layer does not know dead letters, so its caller (triage)
    says. Without it no dead-lettered message is touched. A message that caused a hold is kept
    while the hold exists (``holds_purge`` removes released holds first)."""
    cutoff = timezone.now() - (older_than or conf.QUEUE_ERROR_RETENTION)
    purgeable = Q(status=QueueMessageStatus.DONE) | (
        Q(status=QueueMessageStatus.PARKED)
        & ~Exists(ParkedMessage.objects.filter(message_id=OuterRef("message_id")))
    )
    if closed_message_ids is not None:
        purgeable |= Q(status=QueueMessageStatus.DEAD_LETTERED, message_id__in=closed_message_ids)
    # Below the first id started after the cutoff only: what lies there is mostly what the
    # clean purge kept, so a run reads little however big the table.
    bound = id_bound(QueueMessage, "first_started_at", cutoff)
    stale = (
        QueueMessage.objects.filter(purgeable, finished_at__lt=cutoff, pk__lt=bound or 0)
        .exclude(Exists(PaymentHold.objects.filter(caused_by=OuterRef("pk"))))
        .filter(
            Exists(ProcessingError.objects.filter(queue_message=OuterRef("pk")))
            | Q(status=QueueMessageStatus.PARKED)
            | Q(status=QueueMessageStatus.DEAD_LETTERED)
        )
    )

    def errors_first(ids: list) -> None:
        ProcessingError.objects.filter(queue_message_id__in=ids).delete()

    return batched_delete(stale, batch_size=batch_size, before_each=errors_first)
