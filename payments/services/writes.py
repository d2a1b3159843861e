"""The one write of a processor event's rows, and the payment's row lock every service takes.

A service decides under the payment's row lock (``payment_lock``) what an event does, then
declares it as one ``EventWrite``: the dedup record that claims the event, the event-log row and,
when the state changes, the ``Move`` (the payment's fields it declares, its ledger row or its
pending entry's new status, its counts on the merchant's day). ``event_write`` writes that
declaration through one of two backends: on PostgreSQL one statement (``payments.event_sql``),
elsewhere (the quick start's SQLite) the ORM row by row after the same claim. Both write the
same rows from the same declaration, so neither can write a field the other forgets.
"""

import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.db.models import Case, Model, Q, QuerySet, Value, When
from django.utils import timezone

from payments import event_sql
from payments.event_rows import DayCounts, EntryStatus, EventWrite, Move
from payments.exceptions import PaymentNotFound
from payments.insert_sql import rows_insert

# Declared in payments.event_rows; and below.
__all__ = ["DayCounts", "EntryStatus", "EventWrite", "Move"]
from payments.models import (
    LedgerEntry,
    LedgerEntryStatus,
    Payment,
    PaymentEvent,
    PaymentPurpose,
    PaymentState,
)

_events_isolated: ContextVar[bool] = ContextVar("payment_events_isolated", default=True)


@contextmanager
def events_share_transaction() -> Iterator[None]:
    """Apply the events of this block without a savepoint each (``event_atomic``).

    An event's writes are then not isolated from the other writes of the caller's transaction:
    an event that fails leaves that whole transaction to be rolled back (Django refuses every
    statement after it). Only for a caller that applies several events in one transaction and,
    when any of them fails, rolls all of it back and applies them again, each in its own
    savepoint (``callbacks.worker.batch``): a batch without a failure then pays no savepoint
    and release, two round trips per event.
    """
    token = _events_isolated.set(False)
    try:
        yield
    finally:
        _events_isolated.reset(token)


def event_atomic() -> transaction.Atomic:
    """The transaction an event is applied in: its own, or a savepoint inside the caller's,
    unless the caller applies its events together (``events_share_transaction``)."""
    return transaction.atomic(savepoint=_events_isolated.get())


def payment_lock(payment_id) -> Payment:
    """The payment, its row locked for the caller's transaction; ``PaymentNotFound`` for an
    unknown or malformed id. Call inside ``transaction.atomic()``.

    ``SELECT ... FOR NO KEY UPDATE``: it excludes every other writer and locker of the row, but
    not the key-share lock a foreign key takes, so inserting a row that refers to the payment
    (an event, a ledger entry, a refund of it) never waits on it. A transaction that locks more
    than one payment takes them in the one lock order (``payments_lock``). Inside
    ``payments_locked`` the row read with the batch's locks is handed out, once, instead of a
    statement of its own."""
    locked = _locked_rows.get()
    payment = locked.pop(_uuid_or_none(payment_id), None) if locked else None
    if payment is not None:
        return payment
    try:
        return event_sql.payment_select_for_update(payment_id)
    except Payment.DoesNotExist:
        raise PaymentNotFound(f"payment {payment_id} does not exist") from None
    except ValidationError:
        raise PaymentNotFound(f"payment id {payment_id!r} is not a valid UUID") from None


def payments_lock(*, payment_ids: Iterable, merchant_days: bool = False) -> list[Payment]:
    """Lock, for the caller's transaction, the payments ``payment_ids`` and the refunds of them
    that still hold money, in the one lock order every service follows: the debits (every
    payment that is not a refund) before the refunds, each set by id. A return of a debit locks
    the debit and then its refunds by id (``refunds_on_debit_return``); a worker's batch, which
    applies the events of several payments in one transaction, takes its locks here first, so
    the two never wait on each other in a circle (a deadlock PostgreSQL would end by killing
    one). Ids that are not UUIDs are left out: the work for them fails on its own. Call inside
    ``transaction.atomic()``; one statement. Returns the rows locked, read whole.

    ``merchant_days``: then, in the same statement, their merchants' return-rate counters of
    today (``merchant_days_lock``, after the payments, as the lock order says)."""
    ids = sorted({_uuid_or_none(payment_id) for payment_id in payment_ids} - {None})
    if not ids:
        return []
    along = None
    if merchant_days:
        along = (event_sql.merchant_days_lock_sql, [ids, timezone.now().date()])
    return event_sql.rows_select_for_update(_payments_lock_query, ids, along=along)


def _payments_lock_query(ids: list[uuid.UUID]) -> QuerySet[Payment]:
    """``payments_lock``'s statement (compiled once per number of ids, ``payments.event_sql``)."""
    holding = (PaymentState.PENDING, PaymentState.SUBMITTED, PaymentState.CONFIRMED)
    return (
        Payment.objects.filter(Q(pk__in=ids) | Q(refund_of__in=ids, state__in=holding))
        .order_by(_is_refund(), "id")
        .select_for_update(no_key=True)
    )


# The rows ``payments_locked`` read with its locks, by id, not handed out yet.
_locked_rows: ContextVar[dict[uuid.UUID, Payment] | None] = ContextVar(
    "payments_locked_rows", default=None
)


@contextmanager
def payments_locked(*, payment_ids: Iterable, merchant_days: bool = False) -> Iterator[None]:
    """``payments_lock`` for a block that applies the events of these payments one after the
    other (a worker's batch): the statement that takes the locks also reads the rows, and
    ``payment_lock`` hands each of ``payment_ids`` out once from them instead of reading it
    again, one statement per event fewer. Call inside ``transaction.atomic()``, for that
    transaction's body. ``merchant_days``: the same statement then locks their merchants'
    return-rate counters of today (``merchant_days_lock``), one statement fewer.

    A row handed out is what the database holds as long as nothing in the block has written it
    since: an event writes its own payment (handed out already) through its ``EventWrite``, and
    anything that may write other payments (a type's own ``record``, a move's follow-ups, a
    host's ``payment_transitioned`` receiver) calls ``payments_locked_forget`` first, so that
    every later event reads its row again."""
    wanted = {_uuid_or_none(payment_id) for payment_id in payment_ids} - {None}
    locked = payments_lock(payment_ids=wanted, merchant_days=merchant_days)
    rows = {row.pk: row for row in locked if row.pk in wanted}
    token = _locked_rows.set(rows)
    try:
        yield
    finally:
        _locked_rows.reset(token)


def payments_locked_forget() -> None:
    """Hand out no more rows read by ``payments_locked``: something may write them now."""
    locked = _locked_rows.get()
    if locked:
        locked.clear()


def merchant_days_lock(*, payment_ids: Iterable) -> None:
    """Lock, for the caller's transaction, the return-rate counters of today (the app's and
    the database's UTC day, when they differ) of the merchants of ``payment_ids``, in
    (merchant, day) order, after their payments (``payments_lock``). A worker's batch adds to
    several merchants' counters in its messages' order; taking them all first, in one order,
    two batches never wait on each other in a circle. Call inside ``transaction.atomic()``;
    one statement."""
    ids = sorted({_uuid_or_none(payment_id) for payment_id in payment_ids} - {None})
    if not ids:
        return
    with connection.cursor() as cursor:
        cursor.execute(event_sql.merchant_days_lock_sql(), [ids, timezone.now().date()])


def _is_refund() -> Case:
    return Case(When(purpose=PaymentPurpose.REFUND, then=Value(1)), default=Value(0))


def _uuid_or_none(value) -> uuid.UUID | None:
    try:
        return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))
    except ValueError:
        return None


def event_write(write: EventWrite) -> bool:
    """Claim the event's dedup record and, only if it is new, write the move and the log row.
    True when written; False (nothing written) when the id was processed before. Call inside
    the payment's transaction, holding its row lock."""
    if _one_statement():
        written = event_sql.event_write(write)
        if written and write.move is not None:
            _move_followups(write.move)
        return written
    if not event_sql.processed_event_claim(write.claim):
        return False
    if write.move is not None:
        move_save(write.move)
    write.log.save()
    return True


def event_log_write(log: PaymentEvent) -> None:
    """Write an event-log row that claims nothing: a repeat of an event applied before."""
    log.save()


def _one_statement() -> bool:
    """PostgreSQL writes an event's rows in one statement; other databases statement by
    statement, in the same order and under the same claim."""
    return connection.vendor == "postgresql"


def move_save(move: Move, *, fields: tuple[str, ...] = (), rows: tuple[Model, ...] = ()) -> None:
    """Save a transition made in memory: the payment's declared fields (and the caller's
    ``fields`` of it, in the same UPDATE), the rows the move writes, and the caller's ``rows``
    (its audit row), the new rows in one statement (``payments.insert_sql``)."""
    move.payment.save(update_fields=[*Move.FIELDS, *fields])
    if move.entry_status is not None:
        entry_status_save(move.payment, move.entry_status)
    if move.counts is not None:
        merchant_return_day_add(move.counts)
    new_rows = [row for row in (move.ledger, move.event, *rows) if row is not None]
    if new_rows:
        rows_insert(new_rows)
    _move_followups(move)


def entry_status_save(payment: Payment, entry: EntryStatus) -> None:
    """Move the payment's pending entry of ``entry.kind`` to ``entry.status``, row by row."""
    fields = {"status": entry.status}
    if entry.posted_at is not None:
        fields["posted_at"] = entry.posted_at
    LedgerEntry.objects.filter(
        payment=payment, kind=entry.kind, status=LedgerEntryStatus.PENDING
    ).update(**fields)


def _move_followups(move: Move) -> None:
    for followup in move.followups:
        followup()


def merchant_return_day_add(counts: DayCounts) -> None:
    """Add ``counts`` to the merchant's counters of their day inside the caller's transaction.

    One ``INSERT ... ON CONFLICT DO UPDATE`` adding to the stored values: two transitions of the
    same merchant committing at once both count, without a read-modify-write race.
    """
    params = counts.params()
    values = ", ".join(["%s"] * len(params))
    with connection.cursor() as cursor:
        cursor.execute(event_sql.merchant_day_add_sql(f"VALUES ({values})"), params)
