"""What an event type's handler is: the part of applying a processor event that differs by
type. The catalogue (``payments.catalogue``) names one handler per type; the apply path
(``payments.services.events``) does the rest, the same for every type: the payment's row lock,
the restated fields, the claim of the dedup record, duplicates, conflicts and the one write.
"""

import enum
from dataclasses import dataclass, field

from payments.events import ProcessorEvent
from payments.models import EventOutcome, Payment, PaymentEvent
from payments.services.writes import Move


class ApplyOutcome(enum.StrEnum):
    """What applying a processor event did; the values are the event log's (``EventOutcome``)."""

    APPLIED = EventOutcome.APPLIED.value  # the state changed
    # Kept without a state change: a fact, a record, a return for a payment that had failed.
    RECORDED = EventOutcome.RECORDED.value
    STALE = EventOutcome.STALE.value  # the target equals or lies behind the current state
    DUPLICATE = EventOutcome.DUPLICATE.value  # this processor_event_id was processed before


@dataclass(frozen=True)
class Decision:
    """What a handler decided in memory, under the payment's row lock, before anything is
    written: the outcome, the transition (a ``Move``) if any, or why the event is refused.
    ``context`` carries what its ``record`` step needs of the state before the move."""

    outcome: ApplyOutcome = ApplyOutcome.RECORDED
    move: Move | None = None
    refusal: Exception | None = None
    context: dict = field(default_factory=dict)

    @classmethod
    def refused(cls, refusal: Exception) -> "Decision":
        return cls(refusal=refusal)


class EventHandler:
    """How one event type is applied. ``decide`` writes nothing; ``record`` runs only when this
    event's claim was new, in its transaction, so what it writes is written exactly once.

    ``record_writes_other_payments``: whether ``record`` may write another payment's row (a
    return cancels the debit's refunds not sent yet); the rows a worker's batch read ahead for
    its later events are then read again (``payments.services.payments_locked``). True unless
    the type's ``record`` is known to write only rows of the event's own payment."""

    record_writes_other_payments: bool = True

    def earlier(self, event: ProcessorEvent, payment: Payment) -> bool:
        """Whether this event was applied before by a record of the handler's own that outlives
        the dedup record (purged after ``PROCESSED_EVENT_RETENTION``): then it is a duplicate.
        Raise ``EventConflict`` when that record says something else."""
        return False

    def decide(self, event: ProcessorEvent, payment: Payment) -> Decision:
        raise NotImplementedError

    def record(
        self, *, event: ProcessorEvent, payment: Payment, decision: Decision, log: PaymentEvent
    ) -> None:
        """Write the type's own rows (a return, a NOC, a dishonor's ledger entries)."""


class RecordHandler(EventHandler):
    """A type that moves nothing: logged as recorded in the payment's current state."""

    def decide(self, event: ProcessorEvent, payment: Payment) -> Decision:
        return Decision(ApplyOutcome.RECORDED)
