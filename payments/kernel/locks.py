"""A cluster-wide guard for periodic work: two overlapping runs never do the same work at once."""

import contextlib
import hashlib
import logging
from collections.abc import Iterator

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


def money_out_lock(merchant_id: str) -> None:
    """One merchant's money out (refunds, payouts) decided one transaction at a time: a payout
    reads the available balance no refund is changing meanwhile."""
    transaction_lock(f"payments.money_out:{merchant_id}")


def transaction_lock(name: str) -> None:
    """Wait for, and hold until the caller's transaction ends, a cluster-wide lock named
    ``name`` (``pg_advisory_xact_lock``): what is decided under it (a merchant's payout against
    its available balance) is decided by one transaction at a time. SQLite needs none: its
    IMMEDIATE transactions already serialise every writer. Call inside ``transaction.atomic()``.
    """
    from django.db import connection

    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_lock_key(name)])
