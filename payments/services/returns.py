"""ACH returns: the return record with its NACHA reason code, its counts in the merchant's
return rates, and the flags a human should see."""

from dataclasses import replace
from datetime import UTC, date

from django.db import transaction

from payments.alerts import AlertSeverity, alert_raise
from payments.catalogue import RETURNED
from payments.events import ProcessorEvent
from payments.exceptions import InvalidTransition
from payments.metrics import CREDIT_RETURNS
from payments.models import (
    LedgerEntry,
    LedgerEntryKind,
    Payment,
    PaymentDirection,
    PaymentPurpose,
    PaymentReturn,
    PaymentState,
)
from payments.return_codes import ReturnCategory, ReturnCode, return_code_get
from payments.services.credits import (
    credit_return_written,
    credit_returned_unsettled,
    credit_settled_late,
    ledger_account,
)
from payments.services.event_handlers import ApplyOutcome, Decision
from payments.services.fraud import account_blocks_on_return
from payments.services.refunds import refunds_on_debit_return
from payments.services.transitions import TransitionHandler
from payments.services.validation import micro_entry_returned
from payments.services.writes import DayCounts, merchant_return_day_add


class SettledHandler(TransitionHandler):
    """A settlement. One for a payment that failed by a return the processor made later (the
    settlement's callback was lost and pulled back after the return's, or the two overtook each
    other) follows the processor's history, whatever the delivery order: a debit settled, then
    came back, so it ends ``returned`` (``settle_before_return``) with its credit, posted at the
    settlement, and that credit's reversal, posted at the return, each once; its return record
    becomes the return after settlement it was. Money out that failed by such a return ends
    ``returned`` too, with the entries its return wrote (``credits.credit_returned_unsettled``)
    and nothing more. Any other settlement of a failed payment is refused."""

    # Its record writes the payment's own return record and reversal, no other payment.
    record_writes_other_payments = False

    def decide(self, event: ProcessorEvent, payment: Payment) -> Decision:
        if payment.state != PaymentState.FAILED:
            return super().decide(event, payment)
        earlier = PaymentReturn.objects.filter(
            payment=payment, after_settlement=False, returned_at__gte=event.timestamp
        ).first()
        if earlier is None:
            return Decision.refused(
                InvalidTransition(
                    f"{event.event_type} event {event.processor_event_id} cannot move payment "
                    f"{payment.id} from {payment.state} to {PaymentState.CONFIRMED}: it failed "
                    "without a return the processor made after this settlement"
                )
            )
        credit = payment.direction == PaymentDirection.CREDIT
        if credit and not credit_return_written(payment):
            return Decision(ApplyOutcome.RECORDED)
        decision = super().decide(event, payment)
        if credit:
            decision = replace(decision, move=credit_settled_late(decision.move))
        return replace(decision, context={"return_id": earlier.pk})

    def record(self, *, event, payment, decision, log) -> None:
        if decision.context.get("return_id") is None:
            return
        record = return_settled_before(
            return_id=decision.context["return_id"], settled_at=event.timestamp
        )
        if payment.direction == PaymentDirection.DEBIT:
            LedgerEntry.objects.create(
                payment=payment,
                merchant_id=ledger_account(payment),
                kind=LedgerEntryKind.REVERSAL,
                amount=-payment.amount,
                currency=payment.currency,
                posted_at=record.returned_at,
            )


class ReturnHandler(TransitionHandler):
    """A return: the transition (failed before settlement, returned after it) and its record.
    A return for a payment that failed without one is recorded, not stale
    (``return_after_failure``)."""

    def decide(self, event: ProcessorEvent, payment: Payment) -> Decision:
        settled_at = payment.state_changed_at if payment.state == PaymentState.CONFIRMED else None
        decision = super().decide(event, payment)
        if decision.outcome == ApplyOutcome.STALE and return_after_failure(event, payment):
            return Decision(ApplyOutcome.RECORDED, context={"after_failure": True})
        unsettled = decision.move is not None and decision.move.to_state == PaymentState.FAILED
        if unsettled and payment.direction == PaymentDirection.CREDIT:
            move = credit_returned_unsettled(decision.move, returned_at=event.timestamp)
            decision = replace(decision, move=move)
        return replace(decision, context={"settled_at": settled_at})

    def record(self, *, event, payment, decision, log) -> None:
        if decision.outcome in (ApplyOutcome.APPLIED, ApplyOutcome.RECORDED):
            return_record(
                payment=payment,
                event=event,
                settled_at=decision.context.get("settled_at"),
                after_failure=decision.context.get("after_failure", False),
            )
            if payment.purpose == PaymentPurpose.MICRO_ENTRY:
                # A micro-entry credit came back: its account cannot take entries.
                micro_entry_returned(payment=payment, return_code=event.reason_code or "")
        returned = decision.move is not None and decision.move.to_state == PaymentState.RETURNED
        if returned and payment.direction == PaymentDirection.DEBIT:
            # Its refunds: one not sent yet is canceled, one sent is a double loss.
            refunds_on_debit_return(debit=payment, event=event)


def return_settled_before(*, return_id: int, settled_at) -> PaymentReturn:
    """The return a payment failed by turned out to follow its settlement (``SettledHandler``):
    the return record made the return after settlement it was, with its deadline; returns the
    record as it was. A debit's credit reversal, posted at the return, is the handler's. The
    counters stay: the return counted the debit as the entry the network answered, as the
    settlement would have."""
    record = PaymentReturn.objects.get(pk=return_id)
    code = return_code_get(record.reason_code)
    deadline = code.deadline(settled_at) if code is not None else None
    PaymentReturn.objects.filter(pk=return_id).update(
        after_settlement=True,
        settled_at=settled_at,
        deadline=deadline,
        late=deadline is not None and record.returned_at > deadline,
    )
    return record


def return_after_failure(event: ProcessorEvent, payment: Payment) -> bool:
    """A return for a payment that failed (rejected with a 4xx, or a ``failed`` event) and has
    no return recorded yet: the debit reached the network after all. It is recorded and counted
    like any return, though the state stays ``failed`` and there is no credit to reverse. A
    failed payment that has its return (it failed *by* a return, or one was recorded after the
    failure) takes a second one with a new id as stale, as a returned payment does."""
    return (
        event.event_type == RETURNED.name
        and payment.state == PaymentState.FAILED
        and not PaymentReturn.objects.filter(payment=payment).exists()
    )


def return_record(
    *, payment: Payment, event: ProcessorEvent, settled_at, after_failure: bool = False
) -> PaymentReturn:
    """Record the return with its reason code, count it, and flag what a human should see.

    Called in the transaction that applied (or, after a failure, recorded) the return. Nothing
    here refuses a return: the money has already gone back to the customer, so an unknown code,
    a late return or a return for a payment we had as failed is kept and flagged (medium alert
    after commit), never dropped.
    """
    code = return_code_get(event.reason_code)
    after_settlement = settled_at is not None
    deadline = code.deadline(settled_at) if code is not None and after_settlement else None
    record = PaymentReturn.objects.create(
        payment=payment,
        merchant_id=payment.merchant_id,
        processor_event_id=event.processor_event_id,
        reason_code=code.code if code is not None else event.reason_code[:16],
        reason_title=code.title if code is not None else "",
        category=code.category if code is not None else "",
        after_settlement=after_settlement,
        settled_at=settled_at,
        returned_at=event.timestamp,
        deadline=deadline,
        unknown_code=code is None,
        late=deadline is not None and event.timestamp > deadline,
        after_failure=after_failure,
    )
    # Counted on its record's day, which a dishonor's correction reads back.
    day = record.created_at.astimezone(UTC).date()
    if payment.direction == PaymentDirection.DEBIT:
        # The merchant's return rates are its debits' (NACHA's thresholds); a credit's return
        # is money back, not a customer disputing a charge, and is counted apart.
        _return_count(payment, code, after_settlement=after_settlement, day=day)
        # R17 QUESTIONABLE or unauthorized: no further debit from the account until cleared.
        account_blocks_on_return(payment=payment, event=event)
    else:
        purpose = payment.purpose
        transaction.on_commit(lambda: CREDIT_RETURNS.labels(purpose).inc(), robust=True)
    details = {
        "reason_code": record.reason_code,
        "processor_event_id": event.processor_event_id,
        "after_settlement": after_settlement,
        "after_failure": after_failure,
        "flags": record.flags,
    }
    for alert in _return_alerts(record, code, event):
        transaction.on_commit(
            lambda alert=alert: alert_raise(
                severity=AlertSeverity.MEDIUM, details=details, payment_id=payment.id, **alert
            ),
            robust=True,
        )
    return record


def _return_count(
    payment: Payment, code: ReturnCode | None, *, after_settlement: bool, day: date
) -> None:
    """Add the return to the merchant's counters of today, by category.

    NACHA's rates count the entries the receiving banks returned, whatever the originator's
    books say about them, so every return counts the same in whatever state it finds the
    payment: in ``returns`` (the overall rate, unknown codes included), and in its category
    (R05/R07/R10/R11/R29/R51 unauthorized, R02-R04 administrative). A return after our failure
    (a 4xx rejection, a ``failed`` event) is no exception: the bank returned the entry, so it
    was originated, and an R10 there is as unauthorized as after settlement.
    """
    category = code.category if code is not None else None
    counts = DayCounts(
        merchant_id=payment.merchant_id,
        day=day,
        # A debit returned before it settled (or after it failed) was never counted as settled:
        # it counts here, once, as the entry the network answered.
        debits=0 if after_settlement else 1,
        returns=1,
        unauthorized_returns=int(category == ReturnCategory.UNAUTHORIZED),
        administrative_returns=int(category == ReturnCategory.ADMINISTRATIVE),
    )
    merchant_return_day_add(counts)


def _return_alerts(
    record: PaymentReturn, code: ReturnCode | None, event: ProcessorEvent
) -> list[dict]:
    """The alerts (key and summary) a late return or an unknown reason code calls for."""
    payment = record.payment
    alerts = []
    if record.after_failure:
        alerts.append(
            {
                "key": f"payment.return_after_failure:{payment.id}",
                "summary": (
                    f"return {record.reason_code or '(no code)'} for payment {payment.id} of "
                    f"{payment.merchant_id}, which had failed: the processor sent the debit to "
                    "the network after all; recorded and counted in the return rates, no credit "
                    "to reverse; check the debit with the processor"
                ),
            }
        )
    if record.late:
        alerts.append(
            {
                "key": f"payment.late_return:{payment.id}",
                "summary": (
                    f"late return {record.reason_code} for payment {payment.id} of "
                    f"{payment.merchant_id}: returned {event.timestamp.isoformat()}, due by "
                    f"{record.deadline.isoformat()} ({code.time_frame} after settlement at "
                    f"{record.settled_at.isoformat()}); applied and reversed, a dishonor may be "
                    "possible"
                ),
            }
        )
    if code is None:
        alerts.append(
            {
                "key": f"payment.return_unknown_code:{payment.id}",
                "summary": (
                    f"return for payment {payment.id} of {payment.merchant_id} carries "
                    f"reason code {event.reason_code!r}, which is not a NACHA return code; "
                    "applied, check it with the processor"
                ),
            }
        )
    return alerts
