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

Claiming, on PostgreSQL (no transaction or row lock is held across the network call, and no
statement runs inside a transaction of its own: each one commits as it runs):

1. One statement picks the window's rows (the ids a request just committed, or the relay's
   oldest unpublished rows) and takes a session-level advisory lock per message group among
   them (``pg_try_advisory_lock``, keyed by ``hashtext`` of the group in the database): whoever
   holds a group's lock is its only publisher. A group whose lock is taken is skipped this
   round.
2. A second statement, after the locks, reads the locked groups' unpublished rows up to the
   window's last id, and per group only the unbroken run of its oldest rows that may go is
   kept: a row is never sent while an earlier unpublished row of its group is not in the same
   batch (the publish after commit sends only the ids it was given). Rows of one group are
   written under the payment's row lock, so their id order is their commit order. This read
   runs after the group lock is taken and, under READ COMMITTED (Django's default), sees every
   mark committed by the previous holder, so a row another relay has just published is never
   sent again; the first statement's own snapshot, taken before its locks, is not trusted for
   that.
3. The batch is sent; one statement marks it published (committed before the next step);
   then the group locks are released. Session locks die with the connection, so a crashed
   relay never leaves a group blocked.

A row going out after its commit thus costs four statements and the send. The lock key is the
database's ``hashtext`` of the group (it was ``crc32`` computed here before): every publisher
of one database must use the same key, so while a deploy replaces publishers that used the old
key, two of them may send one row twice (the queue's deduplication id absorbs it).

Other databases (the SQLite quick start) have no advisory locks: there the claim, the send and
the mark share one transaction. SQLite runs it as ``BEGIN IMMEDIATE`` (see settings), which
serialises relays across processes; batches are at most 10 rows and the SQS client's timeouts
bound how long the write lock is held. Session advisory locks also need a real session: behind a
transaction-pooling proxy (PgBouncer in transaction mode) use session pooling for the relay.
"""

import json
import logging
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime, timedelta
from functools import cache
from typing import NamedTuple

from django.db import connection, transaction
from django.db.models import F, QuerySet
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


def _uses_advisory_locks() -> bool:
    return connection.vendor == "postgresql"


class _Row(NamedTuple):
    """An outbox row as the PostgreSQL claim reads it: what its message needs, no model."""

    id: int
    group_id: str
    body: dict
    carried: dict
    created_at: datetime

    @property
    def deduplication_id(self) -> str:
        return OutboxMessage.deduplication_id.fget(self)


# The statements of a claim on PostgreSQL, built once: ``{window}`` is the rows a publisher
# looks at (the ids a request just committed, or the relay's oldest unpublished rows).
# A group's lock key is computed by the database (``hashtext``), so the window's groups and
# their try-locks are one statement whatever rows it finds.
_WINDOW_IDS = "SELECT id, group_id FROM {table} WHERE id = ANY(%s) AND published_at IS NULL"
_WINDOW_OLDEST = (
    "SELECT id, group_id FROM {table} WHERE published_at IS NULL{younger} ORDER BY id LIMIT %s"
)
_LOCK_WINDOW_SQL = """
WITH w AS ({window})
SELECT g, pg_try_advisory_lock(%s, hashtext(g)), (SELECT max(id) FROM w)
FROM (SELECT DISTINCT group_id AS g FROM w) AS groups
"""
# After the locks, so under READ COMMITTED it sees every mark the groups' previous holders
# committed: per locked group, its unpublished rows up to the window's last, in id order.
_PENDING_SQL = """
SELECT id, group_id, body, carried, created_at FROM {table}
WHERE group_id = ANY(%s) AND published_at IS NULL AND id <= %s ORDER BY id
"""
_MARK_SQL = "UPDATE {table} SET published_at = %s WHERE id = ANY(%s) AND published_at IS NULL"
_UNLOCK_SQL = "SELECT pg_advisory_unlock(%s, hashtext(g)) FROM unnest(%s::text[]) AS t(g)"


@cache
def _sql(template: str, window: str = "") -> str:
    """A statement's text, built once per template (and window)."""
    table = connection.ops.quote_name(OutboxMessage._meta.db_table)
    return template.replace("{window}", window).format(table=table)


def _unlock_groups(groups: Iterable[str]) -> None:
    groups = list(groups)
    if not groups:
        return
    with connection.cursor() as cursor:
        cursor.execute(_sql(_UNLOCK_SQL), [ADVISORY_NAMESPACE, groups])


def _lock_window(window: str, params: list) -> tuple[list[str], int | None]:
    """Try-lock the groups of the window's rows, in one statement: the groups locked and the
    window's last id."""
    with connection.cursor() as cursor:
        cursor.execute(_sql(_LOCK_WINDOW_SQL, window), [*params, ADVISORY_NAMESPACE])
        found = cursor.fetchall()
    locked = [group for group, taken, _ in found if taken]
    return locked, (found[0][2] if found else None)


def _pending_rows(groups: list[str], last_id: int) -> list[_Row]:
    with connection.cursor() as cursor:
        cursor.execute(_sql(_PENDING_SQL), [groups, last_id])
        found = cursor.fetchall()
    # Django reads jsonb as text and leaves the parsing to the field: so does this read.
    return [
        _Row(row_id, group, _json(body), _json(carried), created)
        for row_id, group, body, carried, created in found
    ]


def _json(value) -> dict:
    return json.loads(value) if isinstance(value, str | bytes) else value


def _sendable(rows: list, may_send: Callable[[object], bool], *, size: int) -> list:
    """Of ``rows`` (every unpublished row of their groups up to some id, in id order), the ones
    that may be sent now: per group, its oldest rows up to the first one ``may_send`` refuses
    (a row not wanted, or too young), at most ``size`` in all."""
    blocked: set[str] = set()
    chosen = []
    for row in rows:
        if row.group_id in blocked:
            continue
        if not may_send(row):
            blocked.add(row.group_id)
            continue
        chosen.append(row)
        if len(chosen) == size:
            break
    return chosen


@contextmanager
def _claimed_locked(
    window: str, params: list, may_send: Callable[[object], bool], *, size: int
) -> Iterator[list[_Row]]:
    """The claim with advisory locks, outside any transaction: the window's groups try-locked
    (one statement), their rows read after the locks (one), the batch handed to the caller to
    send and mark, then the locks given back (one). Groups with nothing to send are given back
    at once."""
    locked, last_id = _lock_window(window, params)
    if not locked:
        yield []
        return
    try:
        batch = _sendable(_pending_rows(locked, last_id), may_send, size=size)
    except BaseException:
        # Session locks outlive a failed statement: give them back before the error travels on.
        _unlock_groups(locked)
        raise
    batch_groups = {row.group_id for row in batch}
    if len(batch_groups) < len(locked):
        _unlock_groups(g for g in locked if g not in batch_groups)
    try:
        yield batch
    finally:
        _unlock_groups(batch_groups)


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
def _claimed_in_transaction(rows: QuerySet, *, size: int) -> Iterator[list[OutboxMessage]]:
    """The claim without advisory locks (SQLite, the quick start): the claim is the
    transaction's write lock, so the send happens inside it, deliberately: SQLite has one
    writer anyway, and a rollback after a send only republishes later with the same
    deduplication id, which the queue and the worker's dedup record absorb."""
    with transaction.atomic(), sqs.transaction_allowed():
        candidates = list(rows.select_for_update().order_by("id")[:CLAIM_WINDOW])
        yield _in_group_order(candidates, {r.group_id for r in candidates}, size=size)


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
    if _uses_advisory_locks():
        # One statement, committed on its own: the groups' locks are still held.
        with connection.cursor() as cursor:
            cursor.execute(_sql(_MARK_SQL), [when, ids])
            return cursor.rowcount
    return OutboxMessage.objects.filter(id__in=ids, published_at__isnull=True).update(
        published_at=when
    )


Claim = Callable[[int], AbstractContextManager[list]]


def _publish(claim: Claim, *, limit: int, path: str) -> int:
    """Claim, send and mark batches until ``limit`` rows are published, nothing is left to
    claim, or a send fails."""
    published = 0
    # With advisory locks nothing but the group locks is held while sending, so a claim may
    # cover several SQS batches; on the single-transaction path it stays one batch.
    claim_size = CLAIM_SIZE if _uses_advisory_locks() else BATCH_SIZE
    while published < limit:
        failure: tuple[list[int], sqs.QueueUnavailable] | None = None
        with claim(min(claim_size, limit - published)) as claimed:
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
    cutoff = None if older_than is None else timezone.now() - older_than
    if not _uses_advisory_locks():
        rows = OutboxMessage.objects.filter(published_at__isnull=True)
        if cutoff is not None:
            rows = rows.filter(created_at__lte=cutoff)
        return _publish(
            lambda size: _claimed_in_transaction(rows, size=size), limit=limit, path="relay"
        )
    if cutoff is None:
        window = _WINDOW_OLDEST.format(table="{table}", younger="")
        params: list = [CLAIM_WINDOW]
        may_send = _always
    else:
        window = _WINDOW_OLDEST.format(table="{table}", younger=" AND created_at <= %s")
        params = [cutoff, CLAIM_WINDOW]

        def may_send(row) -> bool:
            # A younger row of a group the window holds waits, and so do the rows after it.
            return row.created_at <= cutoff

    return _publish(
        lambda size: _claimed_locked(window, params, may_send, size=size),
        limit=limit,
        path="relay",
    )


def _always(row) -> bool:
    return True


def outbox_relay_publish_ids(ids: Iterable[int]) -> int:
    """Publish the given rows immediately if they are still unpublished and first in their
    group; return how many were published. A row behind an earlier unpublished row of its group,
    or whose group another publisher holds, is left for the relay. Queue failures are recorded
    on the rows and logged, never raised: the relay publishes them later.

    On PostgreSQL this is the path every create pays after its commit: four statements for a
    row that goes out (its group's try-lock, the group's order read after the lock, the mark,
    the unlock) and the send, none of them inside a transaction of their own."""
    wanted = set(ids)
    if not wanted:
        return 0
    if not _uses_advisory_locks():
        rows = OutboxMessage.objects.filter(id__in=wanted, published_at__isnull=True)
        return _publish(
            lambda size: _claimed_in_transaction(rows, size=size),
            limit=len(wanted),
            path="on_commit",
        )
    params = [sorted(wanted)]
    return _publish(
        lambda size: _claimed_locked(_WINDOW_IDS, params, lambda row: row.id in wanted, size=size),
        limit=len(wanted),
        path="on_commit",
    )
