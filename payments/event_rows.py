"""What one processor event writes, declared before anything is written: the dedup claim, the
event-log row and, when the state changes, the ``Move`` (the payment's fields, its ledger row or
its pending entry's new status, its counts on the merchant's day). ``payments.services.writes``
decides and hands the declaration to ``payments.event_sql``, which writes it."""

from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime
from typing import ClassVar

from payments.models import Event, LedgerEntry, Payment, PaymentEvent, ProcessedEvent

# The merchant's return-rate counters of a day, in the upsert's order.
RETURN_DAY_COUNTERS = ("debits", "returns", "unauthorized_returns", "administrative_returns")


@dataclass(frozen=True, kw_only=True)
class DayCounts:
    """What a write adds to a merchant's return-rate counters of ``day``."""

    merchant_id: str
    day: date
    debits: int = 0
    returns: int = 0
    unauthorized_returns: int = 0
    administrative_returns: int = 0

    def params(self) -> list:
        """The upsert's values: merchant, day, then the counters in the statement's order."""
        counters = (getattr(self, name) for name in RETURN_DAY_COUNTERS)
        return [self.merchant_id, self.day, *counters]


@dataclass(frozen=True, kw_only=True)
class EntryStatus:
    """The payment's pending ledger entry of ``kind`` moved to ``status``: money out's entry
    posted (at ``posted_at``) when its credit settles, archived when it fails or is canceled."""

    kind: str
    status: str
    posted_at: datetime | None = None


@dataclass(frozen=True, kw_only=True)
class Move:
    """A transition made in memory on ``payment``, and the rows it writes besides the payment
    (unsaved): a ledger row, its pending entry's new status (money out's), counts on the
    merchant's day; and ``followups``, statements run after those rows in the same transaction,
    only when they were written (a refund's double loss undone); ``event``, the merchant's
    event of the transition (``payments.webhooks``)."""

    # What a move writes on the payment, for every backend and for a rollback's refresh.
    FIELDS: ClassVar[tuple[str, ...]] = ("state", "state_changed_at", "updated_at")

    payment: Payment
    from_state: str
    to_state: str
    ledger: LedgerEntry | None = None
    entry_status: EntryStatus | None = None
    counts: DayCounts | None = None
    followups: tuple[Callable[[], None], ...] = ()
    event: Event | None = None


@dataclass(frozen=True)
class EventWrite:
    """Everything one processor event writes: nothing of it unless ``claim`` is new."""

    claim: ProcessedEvent
    log: PaymentEvent
    move: Move | None = None
