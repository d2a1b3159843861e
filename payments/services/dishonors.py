"""Dishonored and contested returns: the operator's request, and the money its answers move.

A return after settlement reversed the merchant's credit. When that return was wrong (late, a
duplicate, misrouted, with field errors: R61-R69), the originator's bank may dishonor it within
5 banking days; the receiving bank may then contest the dishonor (R71-R77), and the return
stands. The module models both answers as facts about the payment's return, not as states: the
payment stays ``returned`` (its return happened; the state graph has no path back), and the
ledger follows from which facts are recorded, never from the order they came in:

- the return reversed the credit (a ``reversal``) and the processor says the dishonor stood
  (``return_dishonored``): one ``recredit`` of the amount;
- the receiving bank contested it (``dishonor_contested``) and a re-credit exists: one
  ``recredit_reversal``.

So ``dishonor_contested`` before ``return_dishonored`` writes nothing (no re-credit yet); the
late ``return_dishonored`` then writes the re-credit and its reversal together, and the ledger
is the one the other order leaves. The unique constraint on (payment, kind) makes each entry
exactly once whatever repeats; both are written under the payment's row lock, in the
transaction of the event that recorded the fact. The return-rate counters follow the
re-credit: while a return is dishonored and not contested it does not count.

The request is three short steps, as a submission is: one transaction writes the request (the
audit row: who, when, code, note), the call goes out with no transaction open, and a second one
records the attempt and its outcome. A failed call leaves the request ``failed`` with its
attempt row and error, shown on the payment's admin page, and the operator sends it again under
the same idempotency key.
"""

import logging
from dataclasses import dataclass
from datetime import UTC, datetime

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from payments.alerts import AlertSeverity, alert_raise
from payments.catalogue import DISHONOR_CONTESTED, RETURN_DISHONORED
from payments.events import ProcessorEvent
from payments.exceptions import DishonorRefused, InvalidTransition
from payments.models import (
    DishonorRequestStatus,
    LedgerEntry,
    LedgerEntryKind,
    MerchantReturnDay,
    Payment,
    PaymentEvent,
    PaymentReturn,
    PaymentState,
    ReturnDishonor,
)
from payments.processor.backend import (
    DishonorAccepted,
    ProcessorAuthFailed,
    ProcessorCallRejected,
    ProcessorCallUnavailable,
    get_backend,
)
from payments.return_codes import (
    CONTEST_CODES,
    DISHONOR_CODES,
    UNTIMELY_RETURN_CODE,
    ReturnCategory,
    dishonor_deadline,
    return_code_get,
    return_code_label,
)
from payments.services.calls import alert_auth_failed, attempt_record, log_attempt
from payments.services.credits import ledger_account
from payments.services.event_handlers import ApplyOutcome, Decision, EventHandler
from payments.services.remedies import return_reinitiation
from payments.services.writes import DayCounts, merchant_return_day_add, payment_lock
from payments.signals import payment_dishonor_booked
from payments.webhooks import catalogue as event_types
from payments.webhooks.events import dishonor_shape, event_record

logger = logging.getLogger(__name__)

# ProcessorAttempt.operation of a dishonor request.
DISHONOR_OPERATION = "dishonor"


@dataclass(frozen=True)
class DishonorResult:
    dishonor: ReturnDishonor
    sent: bool  # the processor accepted the request
    error: str  # why not, when it did not (the attempt row has the whole answer)


def dishonor_ledger_kinds(*, reversed_: bool, dishonored: bool, contested: bool) -> set[str]:
    """The dishonor entries a payment's ledger holds for these facts, whatever their order: a
    re-credit undoes a reversal the processor says was dishonored, and a contest reverses the
    re-credit. No reversal (the return came before settlement), nothing to undo."""
    kinds = set()
    if reversed_ and dishonored:
        kinds.add(LedgerEntryKind.RECREDIT)
        if contested:
            kinds.add(LedgerEntryKind.RECREDIT_REVERSAL)
    return kinds


# --- the operator's request ------------------------------------------------------------------


def return_dishonor_request(
    *, payment_id, reason_code: str, note: str, user, now: datetime | None = None
) -> DishonorResult:
    """Ask the processor to dishonor the payment's return with ``reason_code`` (R61-R69).

    Refused with ``DishonorRefused`` naming the rule, nothing written: no return after
    settlement, a code outside R61-R69, R68 (untimely) for a return that was on time, no note,
    past 5 banking days after the return, or a dishonor already asked for or reported. The
    permission is the caller's to check (the triage admin's). A processor that does not take
    the request is no refusal: the request stays, ``failed``, with its attempt row.
    """
    code = (reason_code or "").strip().upper()
    note = (note or "").strip()
    now = now or timezone.now()
    with transaction.atomic():
        payment = payment_lock(payment_id)
        ach_return = PaymentReturn.objects.filter(payment=payment).first()
        _request_refusal(payment, ach_return, code, note, now)
        dishonor = ReturnDishonor.objects.create(
            payment=payment,
            ach_return=ach_return,
            merchant_id=payment.merchant_id,
            reason_code=code,
            note=note,
            requested_by=user,
            requested_at=now,
            request_status=DishonorRequestStatus.REQUESTED,
        )
    return dishonor_request_send(dishonor=dishonor)


def return_dishonor_resend(*, payment_id, now: datetime | None = None) -> DishonorResult:
    """Send a request the processor did not take (or whose answer never came) again, under the
    same idempotency key, while the window is open."""
    now = now or timezone.now()
    with transaction.atomic():
        payment = payment_lock(payment_id)
        dishonor = ReturnDishonor.objects.filter(payment=payment).select_related("ach_return")
        dishonor = dishonor.first()
        if dishonor is None or dishonor.request_status not in (
            DishonorRequestStatus.REQUESTED,
            DishonorRequestStatus.FAILED,
        ):
            raise DishonorRefused(
                f"payment {payment.id} has no dishonor request waiting to be sent "
                f"({dishonor.get_request_status_display() if dishonor else 'none was made'})"
            )
        _refuse_if_reinitiated(payment)
        deadline = dishonor_deadline(dishonor.ach_return.returned_at)
        if now > deadline:
            raise DishonorRefused(_window_message(payment, dishonor.ach_return, deadline))
    return dishonor_request_send(dishonor=dishonor)


def _request_refusal(
    payment: Payment, ach_return: PaymentReturn | None, code: str, note: str, now: datetime
) -> None:
    """Raise ``DishonorRefused`` with the first rule the request breaks."""
    if payment.state != PaymentState.RETURNED or ach_return is None:
        raise DishonorRefused(
            f"payment {payment.id} is {payment.state}, not returned after settlement: only a "
            "return that reversed a settled debit can be dishonored"
        )
    _refuse_if_reinitiated(payment)
    if code not in DISHONOR_CODES:
        raise DishonorRefused(
            f"{code or '(no code)'} is not a dishonor reason code; use one of "
            f"{', '.join(DISHONOR_CODES)}"
        )
    if code == UNTIMELY_RETURN_CODE and not ach_return.late:
        raise DishonorRefused(
            f"{return_code_label(code)} needs a late return, and the return "
            f"{ach_return.reason_code} of payment {payment.id} came within its time frame "
            f"(due by {ach_return.deadline.isoformat() if ach_return.deadline else '—'})"
        )
    if not note:
        raise DishonorRefused("a dishonor request needs a note: why the return is wrong")
    deadline = dishonor_deadline(ach_return.returned_at)
    if now > deadline:
        raise DishonorRefused(_window_message(payment, ach_return, deadline))
    existing = ReturnDishonor.objects.filter(payment=payment).first()
    if existing is not None:
        raise DishonorRefused(
            f"the return of payment {payment.id} already has a dishonor "
            f"({existing.outcome}); send a failed request again instead"
        )


def _refuse_if_reinitiated(payment: Payment) -> None:
    """A reinitiated return charges the customer again; a dishonor that stood would re-credit
    the merchant for the original as well (``payments.services.remedies``)."""
    again = return_reinitiation(payment)
    if again is not None:
        raise DishonorRefused(
            f"the return of payment {payment.id} was reinitiated as payment {again.id} "
            f"({again.state}): a dishonor that stood would re-credit the original as well and "
            "charge the customer twice; the reinitiation is the remedy taken"
        )


def _window_message(payment: Payment, ach_return: PaymentReturn, deadline: datetime) -> str:
    return (
        f"the return of payment {payment.id} came on {ach_return.returned_at.isoformat()}; a "
        f"dishonor must go out within 5 banking days, by {deadline.isoformat()}"
    )


def dishonor_request_send(*, dishonor: ReturnDishonor) -> DishonorResult:
    """Call the processor with no transaction open, then record the attempt and the outcome."""
    payment = dishonor.payment
    result: DishonorAccepted | ProcessorCallRejected | ProcessorCallUnavailable
    try:
        result = get_backend().return_dishonor(
            idempotency_key=dishonor.idempotency_key,
            debit_idempotency_key=payment.idempotency_key,
            payment_id=payment.id,
            processor_id=payment.processor_id,
            return_event_id=dishonor.ach_return.processor_event_id,
            reason_code=dishonor.reason_code,
            amount=payment.amount,
            currency=payment.currency,
        )
    except (ProcessorCallRejected, ProcessorCallUnavailable) as exc:
        result = exc
    with transaction.atomic():
        payment = payment_lock(payment.id)
        attempt = attempt_record(
            payment, DISHONOR_OPERATION, result, idempotency_key=dishonor.idempotency_key
        )
        dishonor = ReturnDishonor.objects.select_for_update().get(pk=dishonor.pk)
        failed = isinstance(result, Exception)
        if dishonor.request_status != DishonorRequestStatus.SENT:
            dishonor.request_status = (
                DishonorRequestStatus.FAILED if failed else DishonorRequestStatus.SENT
            )
        dishonor.last_error = (attempt.error or str(result)) if failed else ""
        dishonor.save(update_fields=["request_status", "last_error", "updated_at"])
    log_attempt(payment, attempt, dishonor.request_status)
    if isinstance(result, ProcessorAuthFailed):
        alert_auth_failed(payment, attempt)
    return DishonorResult(dishonor, sent=not failed, error=dishonor.last_error)


# --- the processor's answers -----------------------------------------------------------------


class DishonorAnswerHandler(EventHandler):
    """The processor's answer about a return (dishonored, contested): a fact, not a transition.
    Recorded the first time with the ledger entries it calls for, stale when the fact is
    recorded already under another id."""

    def decide(self, event: ProcessorEvent, payment: Payment) -> Decision:
        refusal = dishonor_event_refusal(event, payment)
        if refusal is not None:
            return Decision.refused(refusal)
        stale = dishonor_event_stale(event, payment)
        return Decision(ApplyOutcome.STALE if stale else ApplyOutcome.RECORDED)

    def record(self, *, event, payment, decision, log) -> None:
        if decision.outcome == ApplyOutcome.RECORDED:
            dishonor_event_record(payment=payment, event=event, log=log)


def dishonor_event_refusal(event: ProcessorEvent, payment: Payment) -> InvalidTransition | None:
    """A dishonor answer needs a return after settlement to be about; before one is recorded it
    is refused (retried, since the return may still be on its way, then dead-lettered)."""
    if payment.state == PaymentState.RETURNED:
        return None
    return InvalidTransition(
        f"{event.event_type} event {event.processor_event_id} is about the return of payment "
        f"{payment.id}, which is {payment.state}: there is no return after settlement to "
        "dishonor"
    )


def dishonor_event_stale(event: ProcessorEvent, payment: Payment) -> bool:
    """The fact is recorded already (under another event id): acknowledged, nothing moves."""
    dishonor = ReturnDishonor.objects.filter(payment=payment).first()
    if dishonor is None:
        return False
    if event.event_type == RETURN_DISHONORED.name:
        return bool(dishonor.dishonored_event_id)
    return bool(dishonor.contested_event_id)


def dishonor_event_record(
    *, payment: Payment, event: ProcessorEvent, log: PaymentEvent
) -> ReturnDishonor:
    """Record the processor's answer on the payment's dishonor, write what its ledger lacks and
    tell the host (``payment_dishonor_booked``, in this transaction).

    Called under the payment's row lock, in the transaction that claimed the event (``log`` is
    its event-log row). An answer we never asked for is recorded all the same (the processor
    moved the money) and flagged.
    """
    ach_return = PaymentReturn.objects.get(payment=payment)
    dishonor, created = ReturnDishonor.objects.get_or_create(
        payment=payment,
        defaults={"ach_return": ach_return, "merchant_id": payment.merchant_id},
    )
    code = event.reason_code.strip().upper()[:16]
    if event.event_type == RETURN_DISHONORED.name:
        dishonor.dishonored_event_id = event.processor_event_id
        dishonor.dishonored_at = event.timestamp
        dishonor.reason_code = dishonor.reason_code or code
        known = code in DISHONOR_CODES or (not code and bool(dishonor.reason_code))
    else:
        dishonor.contested_event_id = event.processor_event_id
        dishonor.contested_at = event.timestamp
        dishonor.contest_reason_code = code
        known = code in CONTEST_CODES
    dishonor.unrequested = dishonor.unrequested or not dishonor.requested_at
    if dishonor.request_status in (DishonorRequestStatus.REQUESTED, DishonorRequestStatus.FAILED):
        # An answer proves the processor took the request (a timeout that reached it after
        # all): nothing is left to send.
        dishonor.request_status = DishonorRequestStatus.SENT
    dishonor.unknown_code = dishonor.unknown_code or not known
    dishonor.save()
    event_record(
        type=event_types.DISHONOR_RECORDED
        if event.event_type == RETURN_DISHONORED.name
        else event_types.DISHONOR_CONTESTED,
        merchant_id=payment.merchant_id,
        obj=dishonor_shape(dishonor),
        object_id=str(payment.pk),
    )
    written = _ledger_follow(payment, ach_return, dishonor)
    _alerts(payment, dishonor, event, [entry.kind for entry in written])
    payment_dishonor_booked.send(
        sender=Payment, payment=payment, event=log, dishonor=dishonor, entries=written
    )
    return dishonor


def _ledger_follow(
    payment: Payment, ach_return: PaymentReturn, dishonor: ReturnDishonor
) -> list[LedgerEntry]:
    """Write the dishonor entries the facts call for and the ledger lacks; correct the
    return-rate counters by what was written. The entries written, in order."""
    kinds = set(LedgerEntry.objects.filter(payment=payment).values_list("kind", flat=True))
    wanted = dishonor_ledger_kinds(
        reversed_=LedgerEntryKind.REVERSAL in kinds,
        dishonored=bool(dishonor.dishonored_event_id),
        contested=bool(dishonor.contested_event_id),
    )
    written = []
    for kind, sign in ((LedgerEntryKind.RECREDIT, 1), (LedgerEntryKind.RECREDIT_REVERSAL, -1)):
        if kind in wanted and kind not in kinds:
            entry = LedgerEntry.objects.create(
                payment=payment,
                merchant_id=ledger_account(payment),
                kind=kind,
                amount=sign * payment.amount,
                currency=payment.currency,
            )
            written.append(entry)
    # A re-credit takes the return out of the merchant's counts, its reversal puts it back:
    # written together (a contest that came first), they cancel.
    kinds_written = {entry.kind for entry in written}
    delta = (LedgerEntryKind.RECREDIT in kinds_written) - (
        LedgerEntryKind.RECREDIT_REVERSAL in kinds_written
    )
    if delta:
        _return_uncount(ach_return, sign=-delta)
    return written


def _return_uncount(ach_return: PaymentReturn, *, sign: int) -> None:
    """Add ``sign`` times the return's counts to the day it was counted on (its record's
    creation, as ``returns._return_count`` counted it), so every window holding that day is
    corrected. Taking away is an ``UPDATE`` of the stored values (the row exists: the return
    was counted there), adding back the counters' own upsert; neither reads and writes back."""
    code = return_code_get(ach_return.reason_code)
    category = code.category if code is not None else None
    counts = DayCounts(
        merchant_id=ach_return.merchant_id,
        day=ach_return.created_at.astimezone(UTC).date(),
        returns=1,
        unauthorized_returns=int(category == ReturnCategory.UNAUTHORIZED),
        administrative_returns=int(category == ReturnCategory.ADMINISTRATIVE),
    )
    if sign > 0:
        merchant_return_day_add(counts)
        return
    MerchantReturnDay.objects.filter(merchant_id=counts.merchant_id, day=counts.day).update(
        returns=F("returns") - counts.returns,
        unauthorized_returns=F("unauthorized_returns") - counts.unauthorized_returns,
        administrative_returns=F("administrative_returns") - counts.administrative_returns,
    )


def _alerts(
    payment: Payment, dishonor: ReturnDishonor, event: ProcessorEvent, written: list[str]
) -> None:
    """A medium alert after commit for what a human should look at: an answer we never asked
    for, a code outside the tables, and every contest (the money went back to the customer); a
    high one for a dishonor that stood after the return was reinitiated (the customer pays
    twice unless someone acts)."""
    alerts = []
    high_alerts = []
    if dishonor.unrequested:
        alerts.append(
            (
                f"payment.dishonor_unrequested:{payment.id}",
                f"{event.event_type} for payment {payment.id} of {payment.merchant_id} with no "
                "dishonor request of ours: recorded and booked; check it with the processor",
            )
        )
    if dishonor.unknown_code:
        alerts.append(
            (
                f"payment.dishonor_unknown_code:{payment.id}",
                f"{event.event_type} for payment {payment.id} carries reason code "
                f"{event.reason_code!r}, outside {', '.join(DISHONOR_CODES + CONTEST_CODES)}; "
                "recorded and booked, check it with the processor",
            )
        )
    if event.event_type == DISHONOR_CONTESTED.name:
        alerts.append(
            (
                f"payment.dishonor_contested:{payment.id}",
                f"the receiving bank contested the dishonor of the return of payment "
                f"{payment.id} of {payment.merchant_id} "
                f"({return_code_label(dishonor.contest_reason_code)}): the return stands"
                + ("; the re-credit is reversed" if written else ""),
            )
        )
    again = return_reinitiation(payment) if event.event_type == RETURN_DISHONORED.name else None
    stood = LedgerEntryKind.RECREDIT in written and LedgerEntryKind.RECREDIT_REVERSAL not in written
    if again is not None and stood:
        high_alerts.append(
            (
                f"payment.dishonor_after_reinitiation:{payment.id}",
                f"the dishonor of the return of payment {payment.id} of {payment.merchant_id} "
                f"stood after the return was reinitiated as payment {again.id} ({again.state}): "
                "the merchant is re-credited for the original and the reinitiation charges the "
                "customer again; refund or stop the reinitiation",
            )
        )
    details = {
        "event_type": event.event_type,
        "processor_event_id": event.processor_event_id,
        "reason_code": event.reason_code,
        "ledger_written": written,
    }
    for severity, key, summary in [
        *((AlertSeverity.HIGH, key, summary) for key, summary in high_alerts),
        *((AlertSeverity.MEDIUM, key, summary) for key, summary in alerts),
    ]:
        transaction.on_commit(
            lambda severity=severity, key=key, summary=summary: alert_raise(
                severity=severity,
                key=key,
                summary=summary,
                details=details,
                payment_id=payment.id,
            ),
            robust=True,
        )
