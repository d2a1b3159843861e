"""Payments held for a person's review: created ``pending`` without a submit command, sent once
approved, canceled when rejected.

A create past an exposure limit with ``PAYMENTS["OVER_LIMIT"] = "hold"``, or one a fraud rule
flags, writes its payment held (``payments.services.fraud.hold_apply``): ``review_status =
held``, the rule, the reason, the evidence, and no submit command, so nothing reaches the
processor or a bank file; a stray submit command is skipped by the submission
(``payments.services.submission``). A user with ``payments.review_payment`` then decides,
with a note, under the payment's row lock: ``payment_review_approve`` enqueues its submit
command once (a refund still inside its debit's return window waits for
``refunds_release``), and ``payment_review_reject`` cancels it by the one cancel path. The
merchant's own cancel takes the same lock, so an approval, a rejection and a cancel racing each
other have one winner; the others are refused (``ReviewRefused``). Every decision is an audit
row in the payment's event log.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.utils import timezone

from payments import conf as payments_conf
from payments.alerts import AlertSeverity, alert_clear, alert_raise
from payments.exceptions import PaymentError
from payments.messages import MessageKind, submit_payment_body
from payments.metrics import REVIEW_DECISIONS
from payments.models import EventKind, EventOutcome, Payment, PaymentEvent, PaymentState
from payments.models import ReviewStatus as Review
from payments.services.cancel import payment_cancel
from payments.services.create import outbox_enqueue
from payments.services.writes import payment_lock
from payments.webhooks.events import review_event_record

logger = logging.getLogger(__name__)

REVIEW_PERMISSION = "payments.review_payment"
# A hold written before holds named their rule was an exposure limit's.
EXPOSURE_LIMIT_RULE = "exposure_limit"


class ReviewRefused(PaymentError):
    """A review decision the payment no longer allows (not held: decided before, or canceled
    by the merchant first); ``rule`` names why."""

    def __init__(self, rule: str, message: str) -> None:
        self.rule = rule
        super().__init__(message)


def payment_review_approve(*, payment_id, user, note: str) -> Payment:
    """Approve a held payment: its submit command, once, and an audit row."""
    note = _decision_checked(user, note)
    with transaction.atomic():
        payment = payment_lock(payment_id)
        _held_checked(payment)
        payment.review_status = Review.APPROVED
        payment.save(update_fields=["review_status", "updated_at"])
        _decision_record(payment, Review.APPROVED, user, note)
        if payment.hold_until is None or payment.hold_until <= timezone.now():
            outbox_enqueue(
                kind=MessageKind.SUBMIT_PAYMENT,
                group_id=str(payment.id),
                body=submit_payment_body(payment.id),
            )
    logger.warning(
        "payment %s approved by %s: %s",
        payment.id,
        user,
        note,
        extra={"payment_id": str(payment.id)},
    )
    return payment


def payment_review_reject(*, payment_id, user, note: str) -> Payment:
    """Reject a held payment: canceled by the one cancel path, and an audit row."""
    note = _decision_checked(user, note)
    with transaction.atomic():
        payment = payment_lock(payment_id)
        _held_checked(payment)
        payment_cancel(payment_id=payment.id, caused_by=f"review:{user.get_username()}")
        payment.refresh_from_db()
        payment.review_status = Review.REJECTED
        payment.save(update_fields=["review_status", "updated_at"])
        _decision_record(payment, Review.REJECTED, user, note)
    logger.warning(
        "payment %s rejected by %s: %s",
        payment.id,
        user,
        note,
        extra={"payment_id": str(payment.id)},
    )
    return payment


def _decision_checked(user, note: str) -> str:
    if not user.has_perm(REVIEW_PERMISSION):
        raise PermissionDenied(f"deciding a held payment needs {REVIEW_PERMISSION}")
    note = (note or "").strip()
    if not note or "\x00" in note:
        raise ValidationError({"note": "say why (no NUL characters)"})
    return note


def _held_checked(payment: Payment) -> None:
    if payment.review_status != Review.HELD:
        raise ReviewRefused(
            "payment_not_held",
            f"payment {payment.id} is not held for review"
            + (f" (it was {payment.review_status})" if payment.review_status else ""),
        )
    if payment.state != PaymentState.PENDING:
        raise ReviewRefused(
            "payment_not_pending",
            f"payment {payment.id} is {payment.state}: there is nothing left to decide",
        )


def _decision_record(payment: Payment, decision: str, user, note: str) -> None:
    """The decision's audit row and its merchant's event, in the decision's transaction; the
    count per rule after commit."""
    rule = payment.review_rule or EXPOSURE_LIMIT_RULE
    transaction.on_commit(lambda: REVIEW_DECISIONS.labels(rule, decision).inc(), robust=True)
    key = overdue_alert_key(payment.id)
    transaction.on_commit(lambda: alert_clear(key=key, reason=f"payment {decision}"), robust=True)
    review_event_record(payment=payment, decision=decision)
    PaymentEvent.objects.create(
        payment=payment,
        kind=EventKind.REVIEW,
        outcome=EventOutcome.RECORDED,
        event_type=decision,
        from_state=payment.state,
        to_state=payment.state,
        payload={
            "decision": decision,
            "note": note[:2000],
            "reason": payment.review_reason,
            "rule": payment.review_rule,
        },
        caused_by=f"review:{user.get_username()}"[:255],
    )


def overdue_alert_key(payment_id) -> str:
    return f"payments.review_hold_overdue:{payment_id}"


def review_holds_overdue_alert(*, now: datetime | None = None) -> int:
    """Raise an alert (medium) for each payment held for review, still pending, longer than
    ``PAYMENTS["REVIEW_HOLD_ALERT_HOURS"]``: a payment a person must decide is waiting, and its
    merchant with it. Raised again each run while it waits (the alert sinks group by key);
    cleared when it is decided. How many are overdue."""
    hours = payments_conf.REVIEW_HOLD_ALERT_HOURS
    since = (now or timezone.now()) - timedelta(hours=hours)
    overdue = list(
        Payment.objects.filter(
            review_status=Review.HELD, state=PaymentState.PENDING, created_at__lt=since
        )
        .order_by("created_at")
        .values("id", "merchant_id", "amount", "currency", "review_rule", "created_at")
    )
    for row in overdue:
        alert_raise(
            severity=AlertSeverity.MEDIUM,
            key=overdue_alert_key(row["id"]),
            summary=(
                f"payment {row['id']} of {row['merchant_id']} ({row['amount']} "
                f"{row['currency']}) held for review by {row['review_rule'] or 'a limit'} since "
                f"{row['created_at']:%Y-%m-%d %H:%M} UTC, over {hours} hours: decide it in the "
                "review queue"
            ),
            details={"rule": row["review_rule"], "hours": hours},
            payment_id=row["id"],
        )
    return len(overdue)
