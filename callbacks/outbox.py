"""The outbox relay: publish committed ``OutboxMessage`` rows to the FIFO queue, in order.

A row is the promise made in the transaction that wrote it; the relay keeps it. Each row goes
out with ``MessageGroupId = row.group_id`` and ``MessageDeduplicationId = outbox-<id>``, so a row
sent twice (a crash between the send and the mark) is dropped by SQS inside its window, and a
later repeat of a ``submit_payment`` is harmless anyway (the processor call carries the
payment's idempotency key).

Two paths publish: ``outbox_relay_publish`` (the relay loop, run by ``run_outbox_relay`` and by
each ``run_sqs_worker`` loop) and ``outbox_relay_publish_ids`` (right after commit, from the
``outbox_committed`` signal; best effort, the relay is the guarantee). Any number of them may
run at once in any number of processes.

Claiming, on PostgreSQL (no transaction or row lock is held across the network call):

1. A short transaction picks the oldest unpublished rows with ``FOR UPDATE SKIP LOCKED`` (so
   concurrent claimers do not wait on each other) and takes a session-level advisory lock per
   message group (``pg_try_advisory_lock``): whoever holds a group's lock is its only publisher.
   A group whose lock is taken is skipped this round.
2. Per group, only the unbroken run of its oldest unpublished rows is kept: a row is never sent
   while an earlier unpublished row of its group is not in the same batch (it may be claimed by
   another process right now). Rows of one group are written under the payment's row lock, so
   their id order is their commit order. This check runs after the group lock is taken and,
   under READ COMMITTED (Django's default), sees every mark committed by the previous holder,
   so a row another relay has just published is never sent again.
3. The batch is sent outside any transaction; a second short transaction marks it published;
   then the group locks are released. Session locks die with the connection, so a crashed
   relay never leaves a group blocked.

Other databases (the SQLite quick start) have no advisory locks: there the claim, the send and
the mark share one transaction. SQLite runs it as ``BEGIN IMMEDIATE`` (see settings), which
serialises relays across processes; batches are at most 10 rows and the SQS client's timeouts
bound how long the write lock is held. Session advisory locks also need a real session: behind a
transaction-pooling proxy (PgBouncer in transaction mode) use session pooling for the relay.
"""

import logging
import zlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta

from django.db import connection, transaction
from django.db.models import F, Q, QuerySet
from django.utils import timezone

from callbacks import sqs
from callbacks.metrics import OUTBOX_PUBLISHED
from payments.kernel import propagation
from payments.models import OutboxMessage

logger = logging.getLogger(__name__)

BATCH_SIZE = 10  # SQS's batch limit
# Rows claimed at once (several batches): fewer database round trips per published row.
CLAIM_SIZE = 50
# Rows examined per claim: enough to fill a batch when a few groups are held by other relays.
CLAIM_WINDOW = 200
# First key of the two-key advisory lock: keeps these locks apart from any others in the database.
ADVISORY_NAMESPACE = 0x0B0C
LAST_ERROR_MAX = 2000
# A row that keeps failing is logged at error level from this attempt on (an operator must look).
STUCK_AFTER_ATTEMPTS = 5


def _group_key(group_id: str) -> int:
    """A signed 32-bit advisory lock key for a group; a collision only serialises two groups."""
    return zlib.crc32(group_id.encode()) - 2**31


def _uses_advisory_locks() -> bool:
    return connection.vendor == "postgresql"


def _try_lock_groups(groups: Iterable[str]) -> set[str]:
    groups = list(groups)
    if not groups:
        return set()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT g, pg_try_advisory_lock(%s, k) FROM unnest(%s::text[], %s::int[]) AS t(g, k)",
            [ADVISORY_NAMESPACE, groups, [_group_key(g) for g in groups]],
        )
        return {group for group, locked in cursor.fetchall() if locked}


def _unlock_groups(groups: Iterable[str]) -> None:
    groups = list(groups)
    if not groups:
        return
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_advisory_unlock(%s, k) FROM unnest(%s::int[]) AS t(k)",
            [ADVISORY_NAMESPACE, [_group_key(g) for g in groups]],
        )


def _in_group_order(
    candidates: list[OutboxMessage], groups: set[str], *, size: int
) -> list[OutboxMessage]:
    """The candidates of ``groups`` that may be sent now: per group, its oldest unpublished rows
    up to the first gap (an earlier row that is not among the candidates)."""
    if not candidates:
        return []
    last_id = candidates[-1].id
    pending: dict[str, list[int]] = {}
    for row_id, group_id in (
        OutboxMessage.objects.filter(
            group_id__in=groups, published_at__isnull=True, id__lte=last_id
        )
        .order_by("id")
        .values_list("id", "group_id")
    ):
        pending.setdefault(group_id, []).append(row_id)
    position = dict.fromkeys(groups, 0)
    blocked: set[str] = set()
    chosen: list[OutboxMessage] = []
    for row in candidates:
        group = row.group_id
        if group not in groups or group in blocked:
            continue
        ids = pending.get(group, [])
        if position[group] < len(ids) and ids[position[group]] == row.id:
            chosen.append(row)
            position[group] += 1
            if len(chosen) == size:
                break
        else:
            blocked.add(group)
    return chosen


@contextmanager
def _claimed_batch(rows: QuerySet, *, size: int) -> Iterator[list[OutboxMessage]]:
    """Claim up to ``size`` sendable rows of ``rows``; the caller sends and marks them inside."""
    if not _uses_advisory_locks():
        # Without advisory locks (SQLite, the quick start) the claim is the transaction's write
        # lock, so the send happens inside it, deliberately: SQLite has one writer anyway, and
        # a rollback after a send only republishes later with the same deduplication id, which
        # the queue and the worker's dedup record absorb.
        with transaction.atomic(), sqs.transaction_allowed():
            candidates = list(rows.select_for_update().order_by("id")[:CLAIM_WINDOW])
            yield _in_group_order(candidates, {r.group_id for r in candidates}, size=size)
        return

    locked: set[str] = set()
    try:
        with transaction.atomic():
            candidates = list(
                rows.select_for_update(skip_locked=True).order_by("id")[:CLAIM_WINDOW]
            )
            locked = _try_lock_groups(dict.fromkeys(r.group_id for r in candidates))
            batch = _in_group_order(candidates, locked, size=size)
    except BaseException:
        # Session locks survive a rollback: give them back before the error travels on.
        _unlock_groups(locked)
        raise
    # Keep only the locks of groups in the batch; the rest go back at once.
    batch_groups = {r.group_id for r in batch}
    _unlock_groups(locked - batch_groups)
    try:
        yield batch
    finally:
        _unlock_groups(batch_groups)


def _message(row: OutboxMessage) -> sqs.OutgoingMessage:
    return sqs.OutgoingMessage(
        body={**row.body, "outbox_id": row.id, "enqueued_at": row.created_at.isoformat()},
        group_id=row.group_id,
        deduplication_id=row.deduplication_id,
        attributes=propagation.message_attributes(row.carried),
    )


def _batches(rows: list[OutboxMessage]) -> Iterator[list[OutboxMessage]]:
    """SQS batches in id order holding at most one row per group.

    A batch can fail in part (``Failed`` entries beside ``Successful`` ones); with two rows of
    one group in it, the later could be queued while the earlier was refused. One row per group
    per batch, sent batch after batch, keeps every group's order whatever fails.
    """
    batch: list[OutboxMessage] = []
    groups: set[str] = set()
    for row in rows:
        if len(batch) == BATCH_SIZE or row.group_id in groups:
            yield batch
            batch, groups = [], set()
        batch.append(row)
        groups.add(row.group_id)
    if batch:
        yield batch


def _record_failure(ids: list[int], error: Exception) -> None:
    """Count the failed attempt on each row, committed on its own so no rollback can erase it."""
    message = str(error)[:LAST_ERROR_MAX]
    with transaction.atomic():
        OutboxMessage.objects.filter(id__in=ids, published_at__isnull=True).update(
            publish_attempts=F("publish_attempts") + 1, last_error=message
        )
        worst = (
            OutboxMessage.objects.filter(id__in=ids)
            .order_by("-publish_attempts")
            .values_list("publish_attempts", flat=True)
            .first()
        )
    log = logger.error if (worst or 0) >= STUCK_AFTER_ATTEMPTS else logger.warning
    log(
        "outbox publish failed for rows %s (attempts up to %s), left for the relay: %s",
        ids,
        worst,
        message,
        extra={"outbox_ids": ids, "outcome": "queue_unavailable"},
    )


def _mark_published(ids: list[int], when: datetime) -> int:
    with transaction.atomic():
        return OutboxMessage.objects.filter(id__in=ids, published_at__isnull=True).update(
            published_at=when
        )


def _publish(rows: QuerySet, *, limit: int, path: str) -> int:
    published = 0
    # With advisory locks nothing but the group locks is held while sending, so a claim may
    # cover several SQS batches; on the single-transaction path it stays one batch.
    claim_size = CLAIM_SIZE if _uses_advisory_locks() else BATCH_SIZE
    while published < limit:
        failure: tuple[list[int], sqs.QueueUnavailable] | None = None
        with _claimed_batch(rows, size=min(claim_size, limit - published)) as claimed:
            if not claimed:
                break
            sent: list[int] = []
            for batch in _batches(claimed):
                try:
                    sqs.send_messages_now([_message(row) for row in batch])
                except sqs.QueueUnavailable as exc:
                    failure = ([row.id for row in batch], exc)
                    break
                sent += [row.id for row in batch]
            marked = _mark_published(sent, timezone.now()) if sent else 0
        if marked:
            published += marked
            OUTBOX_PUBLISHED.labels(path=path).inc(marked)
            logger.info(
                "outbox published %s rows",
                marked,
                extra={"outbox_ids": sent, "path": path, "outcome": "published"},
            )
        if failure is not None:
            # After the claim has ended, so the record commits on its own.
            _record_failure(*failure)
            break
    return published


def outbox_relay_publish(*, limit: int = 500, older_than: timedelta | None = None) -> int:
    """Publish up to ``limit`` unpublished outbox rows, oldest first, immediately; return how
    many were published. ``older_than`` leaves younger rows to the publish-after-commit path
    (the periodic sweep only picks up what that path left behind). Stops at the first queue
    failure (recorded on the rows). Safe to call from several processes at once; call it
    outside any transaction."""
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    rows = OutboxMessage.objects.filter(published_at__isnull=True)
    if older_than is not None:
        rows = rows.filter(created_at__lte=timezone.now() - older_than)
    return _publish(rows, limit=limit, path="relay")


def outbox_relay_publish_ids(ids: Iterable[int]) -> int:
    """Publish the given rows immediately if they are still unpublished and first in their
    group; return how many were published. A row behind an earlier unpublished row of its group,
    or whose group another publisher holds, is left for the relay. Queue failures are recorded
    on the rows and logged, never raised: the relay publishes them later."""
    wanted = sorted(set(ids))
    if not wanted:
        return 0
    rows = OutboxMessage.objects.filter(Q(id__in=wanted) & Q(published_at__isnull=True))
    return _publish(rows, limit=len(wanted), path="on_commit")
