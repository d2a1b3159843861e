"""Applying a processor event exactly once: one path for every event type, whatever its kind.

Under the payment's row lock the restated fields are compared, then the type's handler
(``payments.catalogue``, ``payments.services.event_handlers``) decides in memory; the decision
is written through the one event write (``payments.services.writes``), and the handler writes
its own rows only if that write claimed the event.
"""

from dataclasses import dataclass

from payments.catalogue import event_type_get
from payments.events import ProcessorEvent
from payments.exceptions import (
    AmountMismatch,
    CurrencyMismatch,
    DirectionMismatch,
    EventConflict,
    EventMismatch,
    ProcessorIdMismatch,
)
from payments.models import EventKind, Payment, PaymentEvent, ProcessedEvent
from payments.services.event_handlers import ApplyOutcome, EventHandler
from payments.services.transitions import transition_announce, transition_count
from payments.services.writes import (
    EventWrite,
    Move,
    event_atomic,
    event_log_write,
    event_write,
    payment_lock,
    payments_locked_forget,
)
from payments.signals import payment_transitioned

__all__ = ["ApplyOutcome", "ApplyResult", "payment_apply_event"]


@dataclass(frozen=True)
class ApplyResult:
    outcome: ApplyOutcome
    payment: Payment
    from_state: str
    to_state: str

    @property
    def changed(self) -> bool:
        return self.outcome == ApplyOutcome.APPLIED


def payment_apply_event(*, event: ProcessorEvent, caused_by: str = "") -> ApplyResult:
    """Apply one processor event exactly once, under a row lock on the payment.

    Outcomes: applied (state changed), recorded (kept, no state change), stale (the target
    equals or lies behind the current state, or the fact is recorded already), duplicate (this
    processor_event_id was processed before with the same payload). Raises ``EventConflict``
    for a known id with another payload, an ``EventMismatch`` for a restated field that
    differs, the handler's refusal (``InvalidTransition``) and ``PaymentNotFound``; nothing is
    written then, and the caller records the error. A repeat is a duplicate before it is
    anything else: a refused event whose id was processed before is judged as a repeat.

    The handler decides in memory; then the dedup record is claimed with ``INSERT ... ON
    CONFLICT DO NOTHING`` and everything else is written only if that claim inserted it (one
    ``EventWrite``, on PostgreSQL in one statement): the unique key decides whether this is the
    first time the event is seen (a concurrent claim for another payment waits on the key and
    then finds it taken).
    """
    handler = event_type_get(event.event_type).handler_instance
    with event_atomic():
        payment = payment_lock(event.payment_id)
        current = payment.state
        refusal = _event_mismatch(event, payment)
        if refusal is None and handler.earlier(event, payment):
            return _duplicate(event, payment, caused_by)
        if refusal is None:
            decision = handler.decide(event, payment)
            refusal = decision.refusal
        if refusal is None:
            move = decision.move
            to_state = move.to_state if move is not None else current
            log = _event_row(payment, event, decision.outcome, current, to_state, caused_by)
            if _writes_beyond(handler, move):
                payments_locked_forget()
            if event_write(_event_rows(payment, event, move, log)):
                if move is not None:
                    transition_count(move)
                handler.record(event=event, payment=payment, decision=decision, log=log)
                transition_announce(log)
                return ApplyResult(log.outcome, payment, current, log.to_state)
            if move is not None:  # nothing was written: the event was claimed before
                payment.refresh_from_db(fields=Move.FIELDS)
        return _apply_repeat(event, payment, caused_by, refusal)


def _writes_beyond(handler: EventHandler, move: Move | None) -> bool:
    """Whether applying the event may write other payments' rows than its own ``EventWrite``
    does: the type's own ``record`` (``EventHandler.record_writes_other_payments``), the move's
    follow-ups, or a host's receiver of ``payment_transitioned``. Rows read ahead for later
    events (``payments_locked``) are then read again."""
    return (
        (type(handler).record is not EventHandler.record and handler.record_writes_other_payments)
        or (move is not None and bool(move.followups))
        or payment_transitioned.has_listeners(Payment)
    )


def _event_mismatch(event: ProcessorEvent, payment: Payment) -> EventMismatch | None:
    """The first field of the payment the event restates with another value (see
    ``payments.events.RESTATED_FIELDS`` for which fields, and why the others are not)."""
    what = f"{event.event_type} event {event.processor_event_id}"
    if event.amount != payment.amount:
        return AmountMismatch(
            f"{what} reports {event.amount} but payment {payment.id} is for {payment.amount}"
        )
    if event.currency and event.currency != payment.currency:
        return CurrencyMismatch(
            f"{what} reports currency {event.currency} but payment {payment.id} is in "
            f"{payment.currency}"
        )
    if event.direction and event.direction != payment.direction:
        return DirectionMismatch(
            f"{what} reports a {event.direction} but payment {payment.id} is a {payment.direction}"
        )
    if event.processor_id and payment.processor_id and event.processor_id != payment.processor_id:
        return ProcessorIdMismatch(
            f"{what} names the processor's debit {event.processor_id[:128]!r} but payment "
            f"{payment.id} is the processor's {payment.processor_id!r}"
        )
    return None


def _event_rows(
    payment: Payment, event: ProcessorEvent, move: Move | None, log: PaymentEvent
) -> EventWrite:
    """What the event writes: its dedup record (the claim), ``move`` if any, and ``log``."""
    claim = ProcessedEvent(
        processor_event_id=event.processor_event_id,
        payment=payment,
        event_type=event.event_type,
        payload_hash=event.fingerprint,
        outcome=log.outcome,
    )
    return EventWrite(claim=claim, log=log, move=move)


def _apply_repeat(
    event: ProcessorEvent,
    payment: Payment,
    caused_by: str,
    refusal: Exception | None,
) -> ApplyResult:
    """The event's id was processed before, or the event was refused: the same payload again
    is logged as a duplicate, another payload under a known id is a conflict; an unknown id
    keeps its refusal."""
    try:
        seen = ProcessedEvent.objects.get(pk=event.processor_event_id)
    except ProcessedEvent.DoesNotExist:
        if refusal is None:
            raise
        raise refusal from None
    if seen.payload_hash != event.fingerprint or seen.payment_id != payment.id:
        raise EventConflict(
            f"processor_event_id {event.processor_event_id} was processed before with a "
            f"different payload (first seen {seen.processed_at.isoformat()} as "
            f"{seen.event_type} for payment {seen.payment_id})"
        )
    return _duplicate(event, payment, caused_by)


def _duplicate(event: ProcessorEvent, payment: Payment, caused_by: str) -> ApplyResult:
    """Log a repeat of an event applied before: nothing else is written."""
    current = payment.state
    event_log_write(_event_row(payment, event, ApplyOutcome.DUPLICATE, current, current, caused_by))
    return ApplyResult(ApplyOutcome.DUPLICATE, payment, current, current)


def _event_row(
    payment: Payment,
    event: ProcessorEvent,
    outcome: ApplyOutcome,
    from_state: str,
    to_state: str,
    caused_by: str,
) -> PaymentEvent:
    """The event-log row of a processor event (unsaved)."""
    return PaymentEvent(
        payment=payment,
        kind=EventKind.PROCESSOR_EVENT,
        outcome=outcome,
        event_type=event.event_type,
        processor_event_id=event.processor_event_id,
        from_state=from_state,
        to_state=to_state,
        payload=event.raw or event.as_payload(),
        caused_by=caused_by,
    )
