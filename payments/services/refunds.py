"""Refunds of collected debits, exactly once, and the double loss a return after one makes.

A refund is a payment of its own (``purpose=refund``, ``direction=credit``), an ACH credit to
the account its debit came from: its own idempotency key, minted with it and sent unchanged on
every call, its own states (``pending -> submitted -> confirmed | failed``, ``confirmed ->
returned``), the same outbox, queue, worker and event log as a debit. Its money leaves the
merchant's balance when it is made: a ``refund`` ledger entry, pending, posted when the credit
settles, archived when it fails or is canceled; a returned refund puts it back.

Every refund of a debit is decided under the debit's row lock, so concurrent requests never
refund more than was collected. A return of the debit takes the same lock: a refund not yet
sent is canceled, exactly once, and never sent; one already sent stands beside the return, the
customer has the money twice, and that is recorded as a ``DoubleLoss`` with the recovery the
merchant is owed in its ledger and a high alert, for a person to recover outside ACH.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from decimal import Decimal

from django.db import transaction
from django.db.models import QuerySet, Sum
from django.utils import timezone

from payments import originator
from payments.alerts import AlertSeverity, alert_raise
from payments.banking_days import add_banking_days
from payments.events import ProcessorEvent
from payments.exceptions import CancelRefused, MoneyOutRefused
from payments.kernel.locks import money_out_lock_sql
from payments.kernel.reads import PreparedRead, Read
from payments.messages import MessageKind, submit_payment_body
from payments.metrics import DOUBLE_LOSSES
from payments.models import (
    DoubleLoss,
    DoubleLossStatus,
    LedgerEntry,
    LedgerEntryKind,
    LedgerEntryStatus,
    Payment,
    PaymentDirection,
    PaymentPurpose,
    PaymentState,
    ReturnDishonor,
    ReviewStatus,
)
from payments.processor.backend import get_backend
from payments.services.cancel import payment_cancel
from payments.services.create import (
    create_locks_take,
    create_transaction,
    outbox_enqueue,
    payment_build,
)
from payments.services.fraud import hold_decide
from payments.services.remedies import dishonor_may_stand
from payments.services.writes import payment_lock
from payments.webhooks.catalogue import DOUBLE_LOSS_OPENED, DOUBLE_LOSS_RESOLVED
from payments.webhooks.events import double_loss_shape, event_record

logger = logging.getLogger(__name__)

# The refusals (``MoneyOutRefused.rule``), each the API's 409 ``code``.
PAYMENT_NOT_CONFIRMED = "payment_not_confirmed"
REFUND_EXCEEDS_REFUNDABLE = "refund_exceeds_refundable"
PAYMENT_RETURNED = "payment_returned"
DISHONOR_PENDING = "dishonor_pending"
PAYMENT_NOT_REFUNDABLE = "payment_not_refundable"
CREDITS_UNSUPPORTED = "credits_unsupported"
RULES = (
    PAYMENT_NOT_CONFIRMED,
    REFUND_EXCEEDS_REFUNDABLE,
    PAYMENT_RETURNED,
    DISHONOR_PENDING,
    PAYMENT_NOT_REFUNDABLE,
    CREDITS_UNSUPPORTED,
)

# A refund in these states holds part of its debit: the others (failed, canceled, returned)
# moved no money to the customer, and free it again.
HOLDING_STATES = (PaymentState.PENDING, PaymentState.SUBMITTED, PaymentState.CONFIRMED)
REASON_MAX = 255


def refundable_amount(payment: Payment, holding: list[dict] | None = None) -> Decimal:
    """What may still be refunded of ``payment``: its amount less what its refunds that hold
    add up to (read here, unless ``holding`` gives it, as ``refunds_holding`` reads it)."""
    if payment.purpose != PaymentPurpose.COLLECTION:
        return Decimal("0.00")
    if holding is not None:
        return payment.amount - (holding[0]["held"] if holding else Decimal("0"))
    held = payment.refunds.filter(state__in=HOLDING_STATES).aggregate(total=Sum("amount"))
    return payment.amount - (held["total"] or Decimal("0"))


def _holding_queryset(*, refund_of) -> QuerySet:
    return (
        Payment.objects.filter(refund_of=refund_of, state__in=HOLDING_STATES)
        .order_by()
        .values("refund_of")
        .annotate(held=Sum("amount"))
        .values("held")
    )


# Compiled once per process: a refund's create only gives it its debit's id.
_HOLDING_READ = PreparedRead(_holding_queryset, uuid_slots=("refund_of",))


def refunds_holding(payment: Payment) -> Read:
    """What ``payment``'s refunds that hold part of it add up to, summed by the database: one
    row (``held``), none when no refund holds any (``payments.kernel.reads``). The sum, not the
    refunds: a debit refunded a thousand times in part costs a refund's create one figure, not
    a thousand rows made model instances."""
    return _HOLDING_READ.read(refund_of=payment.pk)


def refund_create(
    *,
    payment_id,
    amount: Decimal,
    reason: str = "",
    metadata: dict | None = None,
    caused_by: str = "",
    carried: Mapping[str, str] | None = None,
    now=None,
) -> Payment:
    """Refund ``amount`` of the debit ``payment_id``: the refund (pending, its own idempotency
    key), its pending ledger entry, its audit row and its submit command in one transaction,
    decided under the debit's row lock.

    Refused with ``MoneyOutRefused`` naming the rule, nothing written: a debit not confirmed
    (one not yet sent is canceled instead), returned, with a dishonor of its return pending, an
    amount over what is refundable, a payment that is itself money out, or a backend that
    cannot send credits; ``ExposureLimitExceeded`` when it would take the merchant past a
    credit limit.
    """
    if not get_backend().supports_credits:
        raise MoneyOutRefused(
            CREDITS_UNSUPPORTED,
            f"the processor backend {type(get_backend()).__name__} cannot send credits, so "
            "nothing can be refunded through it",
        )
    with create_transaction():
        debit = payment_lock(payment_id)
        # After the debit's lock (a return takes that one alone), before the merchant's money
        # moves: a concurrent payout reads the available balance with this refund or without.
        # Shared: the merchant's other refunds do not wait on it (none reads the balance, and
        # what is refundable of each debit is decided under that debit's lock), only payouts.
        # Refunds and payouts count against one credit limit; its lock is the create's last.
        # The debit's refunds are read by the same statement: its row lock, taken before,
        # keeps any other refund of it from being made meanwhile.
        locks = create_locks_take(
            merchant_id=debit.merchant_id,
            direction=PaymentDirection.CREDIT,
            currency=debit.currency,
            first=money_out_lock_sql(debit.merchant_id, shared=True),
            also=[refunds_holding(debit)],
        )
        [holding] = locks.also
        _refusal(debit, amount, now=now or timezone.now(), holding=holding)
        hold = hold_decide(
            merchant_id=debit.merchant_id,
            direction=PaymentDirection.CREDIT,
            purpose=PaymentPurpose.REFUND,
            currency=debit.currency,
            amount=amount,
            account_token=debit.source_token,
            now=now,
            limit_rows=locks.limits,
            exposure_locked=locks.exposure_locked,
        )
        hold_until = _hold_until(debit)
        refund = payment_build(
            merchant_id=debit.merchant_id,
            amount=amount,
            currency=debit.currency,
            # Back to the account the debit came from, in its class (a WEB one as PPD).
            account_token=debit.source_token,
            sec_code=originator.credit_sec_code(debit.sec_code),
            entry_description=originator.REFUND,
            direction=PaymentDirection.CREDIT,
            purpose=PaymentPurpose.REFUND,
            description=reason[:REASON_MAX],
            metadata=metadata,
            refund_of=debit,
            hold=hold,
            # Held: its submit command once its debit's window has passed.
            hold_until=hold_until if hold_until and hold_until > (now or timezone.now()) else None,
            audit={"refund_of": str(debit.id)},
            caused_by=caused_by,
            carried=carried,
        )
    logger.info(
        "refund %s of %s %s created for payment %s",
        refund.id,
        amount,
        refund.currency,
        debit.id,
        extra={"payment_id": str(debit.id), "refund_id": str(refund.id)},
    )
    return refund


def _hold_until(debit: Payment):
    """When a refund of ``debit`` may be sent: ``REFUND_HOLD_BANKING_DAYS`` banking days after
    it settled; None without a hold."""
    from payments import conf as payments_conf

    days = payments_conf.REFUND_HOLD_BANKING_DAYS
    return add_banking_days(debit.state_changed_at, days) if days else None


def refunds_release(*, now=None, limit: int = 500) -> int:
    """Enqueue the submit commands of held refunds whose debit's window has passed, each once
    (its row locked, ``hold_until`` cleared in the same transaction); a refund canceled meanwhile
    (its debit returned) is left alone, and so is one held for review until it is approved
    (``payments.services.review``). The refunds released."""
    now = now or timezone.now()
    released = 0
    with transaction.atomic():
        held = (
            Payment.objects.select_for_update(skip_locked=True)
            .filter(
                purpose=PaymentPurpose.REFUND,
                state=PaymentState.PENDING,
                hold_until__isnull=False,
                hold_until__lte=now,
            )
            .exclude(review_status=ReviewStatus.HELD)[:limit]
        )
        for refund in held:
            refund.hold_until = None
            refund.save(update_fields=["hold_until", "updated_at"])
            outbox_enqueue(
                kind=MessageKind.SUBMIT_PAYMENT,
                group_id=str(refund.id),
                body=submit_payment_body(refund.id),
            )
            released += 1
    if released:
        logger.info("released %s held refund(s) for sending", released)
    return released


def _refusal(debit: Payment, amount: Decimal, *, now, holding: list[dict]) -> None:
    if debit.purpose != PaymentPurpose.COLLECTION:
        raise MoneyOutRefused(
            PAYMENT_NOT_REFUNDABLE,
            f"payment {debit.id} is a {debit.purpose}, money sent out: only a collected debit "
            "can be refunded",
        )
    if debit.state == PaymentState.RETURNED:
        dishonor = ReturnDishonor.objects.filter(payment=debit).first()
        if dishonor_may_stand(dishonor, now=now) is not None:
            raise MoneyOutRefused(
                DISHONOR_PENDING,
                f"payment {debit.id} was returned and a dishonor of its return is pending or "
                "stood: refund it, if at all, once the dishonor is settled",
            )
        raise MoneyOutRefused(
            PAYMENT_RETURNED,
            f"payment {debit.id} was returned: the customer has the money back already",
        )
    if debit.state != PaymentState.CONFIRMED:
        advice = (
            "cancel it instead"
            if debit.state == PaymentState.PENDING
            else "wait until it settles, or for its failure"
        )
        raise MoneyOutRefused(
            PAYMENT_NOT_CONFIRMED,
            f"payment {debit.id} is {debit.state}: only a confirmed debit can be refunded; "
            f"{advice}",
        )
    available = refundable_amount(debit, holding)
    if amount > available:
        raise MoneyOutRefused(
            REFUND_EXCEEDS_REFUNDABLE,
            f"a refund of {amount:.2f} {debit.currency} exceeds the {available:.2f} "
            f"{debit.currency} still refundable of payment {debit.id}",
        )


# --- a return of the refunded debit --------------------------------------------------------------


def refunds_on_debit_return(*, debit: Payment, event: ProcessorEvent) -> list[DoubleLoss]:
    """Called in the transaction that applied a return of ``debit`` after settlement, under its
    row lock. Each refund that holds money is then one of two things:

    - not sent yet (pending, its submission not started): canceled, exactly once, by the one
      cancel path (``payments.services.cancel``: its row lock and the submission's mark decide
      who wins, and a backend holding it unsent withdraws it); its pending entry is archived;
    - sent (its submission started, or further): it stands beside the return. A
      ``DoubleLoss`` is recorded with a ``recovery_owed`` entry and a high alert after commit.
    """
    losses = []
    # By id, after the debit's lock: the one lock order (``payments_lock``).
    for refund in debit.refunds.filter(state__in=HOLDING_STATES).order_by("id"):
        try:
            payment_cancel(
                payment_id=refund.id,
                caused_by=f"refunds: debit returned ({event.processor_event_id})",
            )
        except CancelRefused:
            refund.refresh_from_db()
            losses.append(_double_loss_record(debit, refund, event))
    return losses


def _double_loss_record(debit: Payment, refund: Payment, event: ProcessorEvent) -> DoubleLoss:
    loss, created = DoubleLoss.objects.get_or_create(
        refund=refund,
        defaults={
            "payment": debit,
            "merchant_id": debit.merchant_id,
            "amount": refund.amount,
            "currency": refund.currency,
            "return_event_id": event.processor_event_id,
            "refund_state": refund.state,
        },
    )
    if not created:
        return loss
    transaction.on_commit(DOUBLE_LOSSES.inc, robust=True)
    event_record(
        type=DOUBLE_LOSS_OPENED,
        merchant_id=loss.merchant_id,
        obj=double_loss_shape(loss),
        object_id=str(refund.pk),
    )
    LedgerEntry.objects.create(
        payment=refund,
        merchant_id=refund.merchant_id,
        kind=LedgerEntryKind.RECOVERY_OWED,
        amount=refund.amount,
        currency=refund.currency,
        status=LedgerEntryStatus.PENDING,
    )
    code = event.reason_code or "no code"
    summary = (
        f"payment {debit.id} of {debit.merchant_id} was returned ({code}) "
        f"after refund {refund.id} of {refund.amount} {refund.currency} was sent: the customer "
        "has the money twice; recover it outside ACH"
    )
    details = {
        "double_loss_id": loss.pk,
        "refund_id": str(refund.id),
        "amount": f"{refund.amount:.2f}",
        "currency": refund.currency,
        "return_event_id": event.processor_event_id,
        "reason_code": event.reason_code,
        "refund_state": refund.state,
    }
    transaction.on_commit(
        lambda: alert_raise(
            severity=AlertSeverity.HIGH,
            key=f"payment.double_loss:{refund.id}",
            summary=summary,
            details=details,
            payment_id=debit.id,
        ),
        robust=True,
    )
    logger.error(summary, extra={"payment_id": str(debit.id), "refund_id": str(refund.id)})
    return loss


# --- a person closes a double loss -------------------------------------------------------------


class DoubleLossNotOpen(MoneyOutRefused):
    def __init__(self, loss: DoubleLoss) -> None:
        super().__init__("double_loss_not_open", f"double loss {loss.pk} is {loss.status}")


def double_loss_resolve(*, loss_id: int, status: str, user, note: str) -> DoubleLoss:
    """Close an open double loss: ``recovered`` (the customer paid the refund back outside
    ACH: the recovery owed is posted) or ``written_off`` (it will not be: archived). A note is
    required; the permission is the caller's to check (the admin's)."""
    note = (note or "").strip()
    if status not in (DoubleLossStatus.RECOVERED, DoubleLossStatus.WRITTEN_OFF):
        raise ValueError(f"a double loss is closed as recovered or written_off, not {status!r}")
    if not note:
        raise MoneyOutRefused("note_required", "say how it was recovered, or why it was not")
    with transaction.atomic():
        loss = DoubleLoss.objects.select_for_update().get(pk=loss_id)
        if loss.status != DoubleLossStatus.OPEN:
            raise DoubleLossNotOpen(loss)
        loss.status = status
        loss.resolved_at = timezone.now()
        loss.resolved_by = user
        loss.note = note
        loss.save(update_fields=["status", "resolved_at", "resolved_by", "note"])
        event_record(
            type=DOUBLE_LOSS_RESOLVED,
            merchant_id=loss.merchant_id,
            obj=double_loss_shape(loss),
            object_id=str(loss.refund_id),
        )
        entry_status = (
            LedgerEntryStatus.POSTED
            if status == DoubleLossStatus.RECOVERED
            else LedgerEntryStatus.ARCHIVED
        )
        LedgerEntry.objects.filter(
            payment_id=loss.refund_id,
            kind=LedgerEntryKind.RECOVERY_OWED,
            status=LedgerEntryStatus.PENDING,
        ).update(
            status=entry_status,
            posted_at=loss.resolved_at if entry_status == LedgerEntryStatus.POSTED else None,
        )
    logger.warning(
        "double loss %s closed as %s by %s: %s",
        loss.pk,
        status,
        user,
        note,
        extra={"payment_id": str(loss.payment_id), "refund_id": str(loss.refund_id)},
    )
    return loss
