"""Applying a processor event exactly once: decide under the payment's row lock, then write
the decision through the one event write (``payments.services.writes``)."""

import enum
from dataclasses import dataclass

from payments.events import (
    DISHONOR_EVENT_TYPES,
    PAYMENT_DIRECTION,
    RECORDED_EVENT_TYPES,
    ProcessorEvent,
    event_target_state,
)
from payments.exceptions import (
    AmountMismatch,
    CurrencyMismatch,
    DirectionMismatch,
    EventConflict,
    EventMismatch,
    InvalidTransition,
    ProcessorIdMismatch,
)
from payments.models import (
    PAYMENT_GRAPH,
    EventKind,
    EventOutcome,
    Payment,
    PaymentEvent,
    PaymentState,
    ProcessedEvent,
)
from payments.services.dishonors import (
    dishonor_event_record,
    dishonor_event_refusal,
    dishonor_event_stale,
)
from payments.services.nocs import noc_record, noc_recorded_before, noc_same
from payments.services.returns import return_after_failure, return_record
from payments.services.transitions import (
    EVENT_TRANSITIONS,
    transition_announce,
    transition_count,
    transition_move,
)
from payments.services.writes import (
    EventWrite,
    Move,
    event_atomic,
    event_write,
    payment_lock,
)


class ApplyOutcome(enum.StrEnum):
    """What applying a processor event did; the values are the event log's (``EventOutcome``)."""

    APPLIED = EventOutcome.APPLIED.value  # the state changed
    # Kept without a state change: a return for a payment that had already failed.
    RECORDED = EventOutcome.RECORDED.value
    STALE = EventOutcome.STALE.value  # the target equals or lies behind the current state
    DUPLICATE = EventOutcome.DUPLICATE.value  # this processor_event_id was processed before


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

    Outcomes: applied (state changed), stale (target equals or lies behind the current state),
    duplicate (this processor_event_id was processed before with the same payload). Raises
    ``EventConflict`` for a known id with another payload, ``AmountMismatch``,
    ``InvalidTransition`` (no valid transition and not stale) and ``PaymentNotFound``; nothing is
    written then, and the caller records the error. A repeat is a duplicate before it is
    anything else: a refused event whose id was processed before is judged as a repeat.

    The state machine decides in memory; then the dedup record is claimed with ``INSERT ... ON
    CONFLICT DO NOTHING`` and everything else is written only if that claim inserted it (one
    ``EventWrite``, on PostgreSQL in one statement): the unique key decides whether this is the
    first time the event is seen (a concurrent claim for another payment waits on the key and
    then finds it taken).
    """
    if event.event_type in DISHONOR_EVENT_TYPES:
        return _apply_dishonor_event(event, caused_by)
    with event_atomic():
        payment = payment_lock(event.payment_id)
        if event.event_type in RECORDED_EVENT_TYPES:
            return _apply_recorded(event, payment, caused_by)
        current = payment.state
        settled_at = payment.state_changed_at if current == PaymentState.CONFIRMED else None
        target = event_target_state(event.event_type, current)
        stale = PAYMENT_GRAPH.is_stale(target, current)
        recorded = stale and return_after_failure(event, payment)
        refusal = _apply_refusal(event, payment, target, stale=stale)
        if refusal is None:
            move = None if stale else transition_move(payment, target)
            if recorded:
                outcome = ApplyOutcome.RECORDED
            else:
                outcome = ApplyOutcome.STALE if stale else ApplyOutcome.APPLIED
            log = _event_row(
                payment, event, outcome, current, move.to_state if move else current, caused_by
            )
            if event_write(_event_rows(payment, event, move, log)):
                if move is not None:
                    transition_count(move)
                if event.event_type == "returned" and (recorded or not stale):
                    return_record(
                        payment=payment, event=event, settled_at=settled_at, after_failure=recorded
                    )
                transition_announce(log)
                return ApplyResult(log.outcome, payment, current, log.to_state)
            if move is not None:  # nothing was written: the event was claimed before
                payment.refresh_from_db(fields=Move.FIELDS)
        return _apply_repeat(event, payment, caused_by, refusal)


def _apply_recorded(event: ProcessorEvent, payment: Payment, caused_by: str) -> ApplyResult:
    """An event no transition takes (a notification of change): claimed and logged as
    recorded in the payment's current state, its record written once; a repeat is judged as
    any other. Its restated fields are checked as any event's."""
    mismatch = _event_mismatch(event, payment)
    recorded = noc_recorded_before(event)
    if mismatch is None and recorded is not None:
        # A repeat is judged by its NOC, which outlives the dedup record (purged after
        # PROCESSED_EVENT_RETENTION): a resend months later is still one NOC.
        if recorded.payment_id != payment.id or not noc_same(recorded, event):
            raise EventConflict(
                f"processor_event_id {event.processor_event_id} was recorded before as another "
                f"notification of change (NOC {recorded.id} for payment {recorded.payment_id})"
            )
        current = payment.state
        _event_row(payment, event, ApplyOutcome.DUPLICATE, current, current, caused_by).save()
        return ApplyResult(ApplyOutcome.DUPLICATE, payment, current, current)
    if mismatch is None:
        current = payment.state
        log = _event_row(payment, event, ApplyOutcome.RECORDED, current, current, caused_by)
        if event_write(_event_rows(payment, event, None, log)):
            noc_record(payment=payment, event=event)
            return ApplyResult(ApplyOutcome.RECORDED, payment, current, current)
    return _apply_repeat(event, payment, caused_by, mismatch)


def _apply_dishonor_event(event: ProcessorEvent, caused_by: str) -> ApplyResult:
    """A dishonor answer is a fact about the payment's return, not a transition
    (``payments.services.dishonors``): recorded the first time (its ledger entries with it),
    stale when the fact is recorded already under another id, and through the same claim,
    duplicate and conflict rules as every event."""
    with event_atomic():
        payment = payment_lock(event.payment_id)
        current = payment.state
        refusal = _event_mismatch(event, payment) or dishonor_event_refusal(event, payment)
        if refusal is None:
            stale = dishonor_event_stale(event, payment)
            outcome = ApplyOutcome.STALE if stale else ApplyOutcome.RECORDED
            log = _event_row(payment, event, outcome, current, current, caused_by)
            if event_write(_event_rows(payment, event, None, log)):
                if not stale:
                    dishonor_event_record(payment=payment, event=event, log=log)
                return ApplyResult(log.outcome, payment, current, current)
        return _apply_repeat(event, payment, caused_by, refusal)


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
    if event.direction and event.direction != PAYMENT_DIRECTION:
        return DirectionMismatch(
            f"{what} reports a {event.direction} but payment {payment.id} is a {PAYMENT_DIRECTION}"
        )
    if event.processor_id and payment.processor_id and event.processor_id != payment.processor_id:
        return ProcessorIdMismatch(
            f"{what} names the processor's debit {event.processor_id[:128]!r} but payment "
            f"{payment.id} is the processor's {payment.processor_id!r}"
        )
    return None


def _apply_refusal(
    event: ProcessorEvent, payment: Payment, target: str, *, stale: bool
) -> EventMismatch | InvalidTransition | None:
    """Why ``event`` cannot be applied to the locked ``payment``, if it cannot. Checked before
    anything is written, so both write paths (one statement or statement by statement) refuse
    alike, stale events and recorded returns included."""
    mismatch = _event_mismatch(event, payment)
    if mismatch is not None:
        return mismatch
    if not stale and (payment.state, target) not in EVENT_TRANSITIONS:
        return InvalidTransition(
            f"{event.event_type} event {event.processor_event_id} cannot move payment "
            f"{payment.id} from {payment.state} to {target}"
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
    refusal: EventMismatch | InvalidTransition | None,
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
    current = payment.state
    log = _event_row(payment, event, ApplyOutcome.DUPLICATE, current, current, caused_by)
    log.save()
    transition_announce(log)
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
