"""What a transition of money out (a refund or a payout, ``direction=credit``) does to the
ledger.

Its money left the merchant's balance when it was made (a pending entry: ``refunds``,
``payouts``). Its settlement posts that entry; its failure or cancel archives it, the money
never moved; its return (the receiving bank sent the credit back) puts the money back with an
entry of its own, once (the ledger's one entry per payment and kind). A refund that fails or
comes back also undoes the double loss its debit's return recorded: the customer never had the
money twice.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import datetime

from django.utils import timezone

from payments import conf as payments_conf
from payments.event_rows import EntryStatus, Move
from payments.models import (
    HOUSE_ACCOUNT,
    DoubleLoss,
    DoubleLossStatus,
    LedgerEntry,
    LedgerEntryKind,
    LedgerEntryStatus,
    Payment,
    PaymentPurpose,
    PaymentState,
)
from payments.services.writes import entry_status_save
from payments.webhooks.catalogue import DOUBLE_LOSS_RESOLVED
from payments.webhooks.events import double_loss_shape, event_record

# Per purpose: the entry made with the credit, and the one its return writes.
ENTRY_KINDS = {
    PaymentPurpose.REFUND: (LedgerEntryKind.REFUND, LedgerEntryKind.REFUND_RETURN),
    PaymentPurpose.PAYOUT: (LedgerEntryKind.PAYOUT, LedgerEntryKind.PAYOUT_RETURN),
    PaymentPurpose.MICRO_ENTRY: (LedgerEntryKind.MICRO_ENTRY, LedgerEntryKind.MICRO_ENTRY_RETURN),
}


def ledger_account(payment: Payment) -> str:
    """The ledger account (``LedgerEntry.merchant_id``) the payment's entries are written to:
    its merchant's, or for a micro-entry the one ``PAYMENTS["MICRO_ENTRY_COST"]`` names (the
    house's by default), so the credits, the offsetting debit and their returns land together
    and the round's cost stays there."""
    if payment.purpose == PaymentPurpose.MICRO_ENTRY and payments_conf.MICRO_ENTRY_COST == "house":
        return HOUSE_ACCOUNT
    return payment.merchant_id


def credit_move_effects(
    payment: Payment, target: str
) -> tuple[LedgerEntry | None, EntryStatus | None, tuple[Callable[[], None], ...]]:
    """The ledger row a credit's move to ``target`` writes, the new status of its pending
    entry, and its follow-ups. The status is declared on the move, not run after it: the event
    write then sets it in its one statement, where a follow-up would be one more."""
    held, returned = ENTRY_KINDS[payment.purpose]
    if target == PaymentState.CONFIRMED:
        posted = EntryStatus(kind=held, status=LedgerEntryStatus.POSTED, posted_at=timezone.now())
        return None, posted, ()
    if target in (PaymentState.FAILED, PaymentState.CANCELED):
        return (
            None,
            EntryStatus(kind=held, status=LedgerEntryStatus.ARCHIVED),
            (lambda: _double_loss_undo(payment, because=target),),
        )
    if target == PaymentState.RETURNED:
        entry = LedgerEntry(
            payment=payment,
            merchant_id=ledger_account(payment),
            kind=returned,
            amount=payment.amount,
            currency=payment.currency,
            posted_at=timezone.now(),
        )
        return entry, None, (lambda: _double_loss_undo(payment, because=target),)
    return None, None, ()


def credit_returned_unsettled(move: Move, *, returned_at: datetime) -> Move:
    """A credit's return delivered while the credit is ``submitted`` (its settlement's
    callback lost, or overtaken): a credit is returned only once it settled, so the money
    left and came back. Its move to ``failed`` posts the held entry and writes the return's
    entry, both at the return, as the settlement and the return would have; the settlement,
    when it comes, moves it to ``returned`` and writes nothing (``credit_settled_late``)."""
    payment = move.payment
    held, returned = ENTRY_KINDS[payment.purpose]
    return replace(
        move,
        entry_status=EntryStatus(kind=held, status=LedgerEntryStatus.POSTED, posted_at=returned_at),
        ledger=LedgerEntry(
            payment=payment,
            merchant_id=ledger_account(payment),
            kind=returned,
            amount=payment.amount,
            currency=payment.currency,
            posted_at=returned_at,
        ),
    )


def credit_return_written(payment: Payment) -> bool:
    """Whether the credit's return wrote its entry (a credit failed by its return before this
    rule kept its held entry archived instead: nothing moved, and so it stays)."""
    _, returned = ENTRY_KINDS[payment.purpose]
    return LedgerEntry.objects.filter(payment=payment, kind=returned).exists()


def credit_settled_late(move: Move) -> Move:
    """The settlement of a credit its return failed (``credit_returned_unsettled``): the move
    to ``returned`` without a row of money, which the return wrote."""
    return replace(move, ledger=None, entry_status=None, followups=())


def _double_loss_undo(payment: Payment, *, because: str) -> None:
    """A refund that failed or came back never reached the customer: its double loss, if its
    debit's return recorded one, is undone and the recovery owed archived."""
    if payment.purpose != PaymentPurpose.REFUND:
        return
    # Locked, as a person's ``double_loss_resolve`` locks it: one of them closes it.
    loss = (
        DoubleLoss.objects.select_for_update()
        .filter(refund=payment, status=DoubleLossStatus.OPEN)
        .first()
    )
    if loss is None:
        return
    loss.status = DoubleLossStatus.UNDONE
    loss.resolved_at = timezone.now()
    loss.note = f"the refund {because}: the customer never had the money twice"
    loss.save(update_fields=["status", "resolved_at", "note"])
    entry_status_save(
        payment,
        EntryStatus(kind=LedgerEntryKind.RECOVERY_OWED, status=LedgerEntryStatus.ARCHIVED),
    )
    event_record(
        type=DOUBLE_LOSS_RESOLVED,
        merchant_id=loss.merchant_id,
        obj=double_loss_shape(loss),
        object_id=str(payment.pk),
    )
