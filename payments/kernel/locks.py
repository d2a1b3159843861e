"""A cluster-wide guard for periodic work: two overlapping runs never do the same work at once."""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass

logger = logging.getLogger(__name__)


def _lock_key(name: str) -> int:
    # pg advisory locks take a signed 64-bit key.
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


@contextlib.contextmanager
def single_flight(name: str) -> Iterator[bool]:
    """Hold a cluster-wide lock named ``name`` for the block; yield False if someone holds it.

    PostgreSQL: a session-level advisory lock (``pg_try_advisory_lock``), released in
    ``finally`` and by the server if the connection dies, so a crashed task never leaves it
    held. Nothing is waited for: a second tick finds the lock taken and skips its run.

    SQLite (the one-machine quick start) has no advisory locks: the block always runs (yields
    True). That is safe there because every periodic task is idempotent on its own and SQLite
    serialises writers; it only means two overlapping ticks may both do (harmless) work.
    """
    from django.db import connection

    if connection.vendor != "postgresql":
        yield True
        return
    key = _lock_key(name)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [key])
        acquired = cursor.fetchone()[0]
    if not acquired:
        logger.info("%s is already running elsewhere: this run is skipped", name)
        yield False
        return
    try:
        yield True
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [key])


def money_out_lock_sql(merchant_id: str, *, shared: bool = False) -> LockSql | None:
    """The merchant's money-out lock, as a part of a statement the caller sends (a create's
    first, ``payments.services.create.create_locks_take``).

    Exclusive, a payout's: one merchant's payouts decided one transaction at a time, and each
    against a balance no refund is changing meanwhile. Shared (``shared``), a refund's: refunds
    of one merchant go side by side (none reads the balance, each only adds its own pending
    entry), while a payout waits for every refund in flight to commit and holds off new ones
    until it commits, so it reads a balance no refund is changing and its ledger entry comes
    after every entry it counted."""
    return transaction_lock_sql(_money_out_name(merchant_id), shared=shared)


def exposure_lock(merchant_id: str, direction: str, currency: str) -> None:
    """One merchant's creates in one direction and currency checked against its exposure limits
    one transaction at a time (``payments.services.limits``), exclusive. Taken last, after
    every other lock of the create (a refund's debit row and money-out share, a payout's
    money-out lock, a reinitiation's chain), so no two creates wait on each other in a cycle."""
    transaction_lock(_exposure_name(merchant_id, direction, currency))


def exposure_lock_sql(merchant_id: str, direction: str, currency: str) -> LockSql | None:
    """``exposure_lock`` as a part of a statement the caller sends (after the create's other
    locks in it, as its last)."""
    return transaction_lock_sql(_exposure_name(merchant_id, direction, currency))


def _exposure_name(merchant_id: str, direction: str, currency: str) -> str:
    return f"payments.exposure:{merchant_id}:{direction}:{currency}"


def _money_out_name(merchant_id: str) -> str:
    return f"payments.money_out:{merchant_id}"


def transaction_lock(name: str, *, shared: bool = False) -> None:
    """Wait for, and hold until the caller's transaction ends, a cluster-wide lock named
    ``name`` (``pg_advisory_xact_lock``): what is decided under it (a merchant's payout against
    its available balance) is decided by one transaction at a time. ``shared``
    (``pg_advisory_xact_lock_shared``) lets holders in shared mode in together and keeps out only
    the exclusive ones. SQLite needs none: its IMMEDIATE transactions already serialise every
    writer. Call inside ``transaction.atomic()``.
    """
    lock = transaction_lock_sql(name, shared=shared)
    if lock is None:
        return
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {lock.sql}", lock.params)


@dataclass(frozen=True)
class LockSql:
    """A transaction lock as an expression of a ``SELECT``: taken when the statement runs, held
    until the transaction ends. What the statement reads is not protected by it: the statement's
    snapshot may predate the wait, so what the lock guards is read by a later statement, or by
    a VOLATILE function called after the lock in the same statement
    (``payments.kernel.reads.AfterLocks``), whose own statements read after the wait."""

    sql: str
    params: list


def transaction_lock_sql(name: str, *, shared: bool = False) -> LockSql | None:
    """``transaction_lock`` as an expression, for a caller that takes it in a statement of its
    own making; None where no lock is needed (SQLite)."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return None
    function = "pg_advisory_xact_lock_shared" if shared else "pg_advisory_xact_lock"
    return LockSql(f"{function}(%s)", [_lock_key(name)])
