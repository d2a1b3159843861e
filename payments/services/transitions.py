"""State changes of a payment: the transition made in memory, its rows, and its announcements.

The graph itself is declared once, by the ``@transition``s on ``Payment``; the tables here are
read from it (``payments.state_graph``).
"""

import logging

from django.db import transaction
from django.utils import timezone

from payments.events import ProcessorEvent, event_target_state
from payments.exceptions import InvalidTransition
from payments.metrics import MONEY_OUT
from payments.metrics import TRANSITIONS as TRANSITIONS_TOTAL
from payments.models import (
    PAYMENT_GRAPH,
    EventOutcome,
    LedgerEntry,
    LedgerEntryKind,
    Payment,
    PaymentDirection,
    PaymentEvent,
    PaymentPurpose,
    PaymentState,
)
from payments.services.credits import credit_move_effects, ledger_account
from payments.services.event_handlers import ApplyOutcome, Decision, EventHandler
from payments.services.writes import DayCounts, Move, move_save
from payments.signals import payment_transition_committed, payment_transitioned
from payments.webhooks.events import payment_event_new

logger = logging.getLogger(__name__)

# (current state, target state) -> the model transition that gets there.
TRANSITIONS = PAYMENT_GRAPH.names
# Processor events may only use these; ``reject`` belongs to a 4xx answer to our submission.
EVENT_TRANSITIONS = PAYMENT_GRAPH.event_transitions


class TransitionHandler(EventHandler):
    """A transition type: the state graph says where it drives the payment from its state.
    A target that equals or lies behind the current state is stale; one no event transition
    reaches is refused."""

    def decide(self, event: ProcessorEvent, payment: Payment) -> Decision:
        current = payment.state
        target = event_target_state(event.event_type, current)
        if PAYMENT_GRAPH.is_stale(target, current):
            return Decision(ApplyOutcome.STALE)
        if (current, target) not in EVENT_TRANSITIONS:
            return Decision.refused(
                InvalidTransition(
                    f"{event.event_type} event {event.processor_event_id} cannot move payment "
                    f"{payment.id} from {current} to {target}"
                )
            )
        move = transition_move(payment, target)
        if move.ledger is not None:
            # Posted when the processor says the money moved: the return reserve counts from
            # the event, however late its callback came (``merchant_money_figures``).
            move.ledger.posted_at = event.timestamp
        return Decision(ApplyOutcome.APPLIED, move=move)


def payment_transition(*, payment: Payment, target: str) -> tuple[str, str]:
    """Move a payment locked by the caller to ``target`` and save it; return (from, to).

    Call inside ``transaction.atomic()`` on a row fetched with ``select_for_update()``.
    Confirmation writes the merchant's credit, a return after settlement its reversal (a debit
    of the same amount); both count in the merchant's daily return-rate counters.
    """
    move = transition_move(payment, target)
    move_save(move)
    transition_count(move)
    return move.from_state, move.to_state


def transition_move(payment: Payment, target: str) -> Move:
    """Run the state machine's transition to ``target`` on ``payment`` (in memory only) and
    build the ledger row it writes: a credit on confirmation, its reversal on a return."""
    current = payment.state
    name = TRANSITIONS.get((current, target))
    if name is None:
        raise InvalidTransition(
            f"no transition from {current} to {target} for payment {payment.id}"
        )
    getattr(payment, name)()
    payment.state_changed_at = timezone.now()
    payment.updated_at = payment.state_changed_at  # as the event's copy of the payment shows
    # The merchant's event rides with the move's rows: written exactly when they are. A
    # micro-entry has none: its amount is the validation's secret, never shown to the merchant.
    move = {
        "payment": payment,
        "from_state": current,
        "to_state": target,
        "event": None
        if payment.purpose == PaymentPurpose.MICRO_ENTRY
        else payment_event_new(payment=payment, state=target),
    }
    if payment.direction == PaymentDirection.CREDIT:
        ledger, entry_status, followups = credit_move_effects(payment, target)
        return Move(**move, ledger=ledger, entry_status=entry_status, followups=followups)
    entry = {
        "payment": payment,
        "merchant_id": ledger_account(payment),
        "currency": payment.currency,
    }
    if target == PaymentState.CONFIRMED:
        return Move(
            **move,
            ledger=LedgerEntry(kind=LedgerEntryKind.CREDIT, amount=payment.amount, **entry),
            # The merchant's day counting one more settled debit.
            counts=DayCounts(
                merchant_id=payment.merchant_id, day=payment.state_changed_at.date(), debits=1
            ),
        )
    if target == PaymentState.RETURNED and current == PaymentState.FAILED:
        # Settled before the return it failed by (``settle_before_return``): the credit now,
        # its reversal by the settlement's handler (``payments.services.returns``).
        return Move(
            **move,
            ledger=LedgerEntry(kind=LedgerEntryKind.CREDIT, amount=payment.amount, **entry),
        )
    if target == PaymentState.RETURNED:
        return Move(
            **move,
            ledger=LedgerEntry(kind=LedgerEntryKind.REVERSAL, amount=-payment.amount, **entry),
        )
    return Move(**move)


def transition_count(move: Move) -> None:
    """Count the transition in the metrics once its transaction has committed."""
    transaction.on_commit(
        lambda: TRANSITIONS_TOTAL.labels(move.from_state, move.to_state).inc(), robust=True
    )
    if move.payment.direction == PaymentDirection.CREDIT:
        money_out_count(move.payment.purpose, move.to_state)


def money_out_count(purpose: str, to_state: str) -> None:
    """Count a refund or payout made (``pending``) or moved, once its transaction commits."""
    transaction.on_commit(lambda: MONEY_OUT.labels(purpose, to_state).inc(), robust=True)


def transition_announce(row: PaymentEvent) -> None:
    """Tell the host about a state change recorded by ``row``, inside the transaction and after
    its commit (see ``payments.signals``). Not robust on purpose: a receiver's error rolls the
    transition back with it, so the host's rows and ours never disagree."""
    if row.outcome != EventOutcome.APPLIED or row.from_state == row.to_state:
        return
    signal_args = {
        "payment": row.payment,
        "from_state": row.from_state,
        "to_state": row.to_state,
        "event": row,
    }
    payment_transitioned.send(sender=Payment, **signal_args)
    transaction.on_commit(lambda: _transition_committed_send(signal_args), robust=True)


def _transition_committed_send(signal_args: dict) -> None:
    for receiver, result in payment_transition_committed.send_robust(sender=Payment, **signal_args):
        if isinstance(result, Exception):
            logger.error(
                "payment_transition_committed receiver %r failed for payment %s: %r",
                receiver,
                signal_args["payment"].pk,
                result,
                exc_info=result,
                extra={"payment_id": str(signal_args["payment"].pk)},
            )
