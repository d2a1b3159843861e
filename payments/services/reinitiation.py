"""Reinitiation: a returned debit sent again as a new payment, within NACHA's limits.

A reinitiation is a new payment for the same merchant, amount, currency and token, linked to
the original entry of its chain (``Payment.reinitiation_of``) with its number (1 or 2). The
rules, each refused with its name (``ReinitiationRefused.rule``):

- ``not_returned``: only a returned entry is reinitiated;
- ``return_dishonored``: a return whose dishonor stood gave the money back, and
  ``dishonor_pending``: one whose dishonor awaits its answer may yet, a request whose call
  failed with no answer included while the dishonor window is open (a contested dishonor, or a
  request the processor refused, leaves the return reinitiable; see
  ``payments.services.remedies``);
- ``not_latest_entry``: the chain goes on from its latest entry, so an entry already
  reinitiated is not reinitiated again;
- ``new_authorization_required``: never after R05, R07, R08, R10, R29 or R51 (unauthorized or
  stopped) unless the client states the new authorization's reference;
- ``return_code_not_reinitiable``: otherwise only after R01 or R09 (insufficient or
  uncollected funds);
- ``reinitiation_limit``: at most twice per original entry;
- ``reinitiation_window``: within 180 days of the original entry's settlement;
- ``notification_of_change_past_deadline``: not while the token has a notification of change
  open past its deadline;
- ``exposure_limit_exceeded``: not past one of the merchant's debit exposure limits
  (``payments.services.limits``; the refusal's ``param`` names the limit);
- ``account_blocked``: not from an account an R17 ``QUESTIONABLE`` return blocked, nor, without
  a new authorization's reference, one the merchant's unauthorized return blocked
  (``payments.services.fraud``).

The original entry's row is locked first, so two concurrent reinitiations of a chain are
decided one after the other, and the unique (original, number) constraint holds the limit
even against a path that skipped the lock.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from payments.exceptions import (
    AccountBlocked,
    ExposureLimitExceeded,
    NocPastDeadline,
    ReinitiationRefused,
)
from payments.models import DishonorRequestStatus, Payment, PaymentReturn, ReturnDishonor
from payments.services.create import payment_create
from payments.services.limits import EXPOSURE_LIMIT_EXCEEDED
from payments.services.remedies import DISHONOR_PENDING, RETURN_DISHONORED, dishonor_may_stand
from payments.services.writes import payment_lock, payments_lock


def _original_id(payment_id):
    """The original of the chain ``payment_id`` reinitiates (None for an original, or an
    unknown or malformed id, which ``payment_lock`` then refuses): read before any lock, since
    a payment's ``reinitiation_of`` never changes."""
    try:
        return (
            Payment.objects.filter(pk=payment_id)
            .values_list("reinitiation_of_id", flat=True)
            .first()
        )
    except ValidationError:
        return None


REINITIATION_LIMIT = 2
REINITIATION_WINDOW = timedelta(days=180)
REINITIABLE_CODES = ("R01", "R09")
NEW_AUTHORIZATION_CODES = ("R05", "R07", "R08", "R10", "R29", "R51")

RULES = (
    "not_returned",
    RETURN_DISHONORED,
    DISHONOR_PENDING,
    "not_latest_entry",
    "new_authorization_required",
    "return_code_not_reinitiable",
    "reinitiation_limit",
    "reinitiation_window",
    "notification_of_change_past_deadline",
    EXPOSURE_LIMIT_EXCEEDED,
)


def payment_reinitiate(
    *,
    payment_id,
    authorization_reference: str = "",
    caused_by: str = "",
    now: datetime | None = None,
) -> Payment:
    """Create the reinitiation of the returned payment ``payment_id``, or raise
    ``ReinitiationRefused`` naming the rule that forbids it (``PaymentNotFound`` for an unknown
    id). The new payment is written as ``payment_create`` writes one (pending, with its submit
    command), in the transaction that holds the original entry's row lock."""
    now = now or timezone.now()
    with transaction.atomic():
        original_id = _original_id(payment_id)
        if original_id is not None:
            # The entry and the chain's original, both debits, by id: the one lock order every
            # service and the worker's batches follow (``payments_lock``).
            payments_lock(payment_ids=[payment_id, original_id])
        entry = payment_lock(payment_id)
        original = entry if original_id is None else payment_lock(original_id)
        chain = list(original.reinitiations.order_by("reinitiation_number"))
        _check(entry, original, chain, authorization_reference, now)
        number = len(chain) + 1
        try:
            return payment_create(
                merchant_id=original.merchant_id,
                amount=original.amount,
                currency=original.currency,
                source_token=original.source_token,
                description=original.description,
                metadata=original.metadata,
                caused_by=caused_by,
                reinitiation_of=original,
                reinitiation_number=number,
                authorization_reference=authorization_reference,
            )
        except NocPastDeadline as exc:
            raise ReinitiationRefused("notification_of_change_past_deadline", str(exc)) from None
        except ExposureLimitExceeded as exc:
            raise ReinitiationRefused(exc.rule, str(exc), param=exc.limit) from None
        except AccountBlocked as exc:
            raise ReinitiationRefused(exc.rule, str(exc)) from None


def _check(
    entry: Payment,
    original: Payment,
    chain: list[Payment],
    authorization_reference: str,
    now: datetime,
) -> None:
    returned = PaymentReturn.objects.filter(payment=entry).first()
    if returned is None:
        raise ReinitiationRefused(
            "not_returned",
            f"payment {entry.id} has no return: only a returned entry is reinitiated",
        )
    _check_not_dishonored(entry, returned, now)
    latest = chain[-1] if chain else original
    if latest.id != entry.id:
        raise ReinitiationRefused(
            "not_latest_entry",
            f"payment {entry.id} was reinitiated already; the chain's latest entry is {latest.id}",
        )
    code = returned.reason_code
    if code in NEW_AUTHORIZATION_CODES:
        if not authorization_reference:
            raise ReinitiationRefused(
                "new_authorization_required",
                f"payment {entry.id} was returned {code} (unauthorized or stopped): it is "
                "reinitiated only under a new authorization; state its authorization_reference",
            )
    elif code not in REINITIABLE_CODES:
        raise ReinitiationRefused(
            "return_code_not_reinitiable",
            f"payment {entry.id} was returned {code or '(no code)'}: only an R01 or R09 return "
            "(or an unauthorized one under a new authorization) may be reinitiated",
        )
    if len(chain) >= REINITIATION_LIMIT:
        raise ReinitiationRefused(
            "reinitiation_limit",
            f"payment {original.id} was reinitiated {len(chain)} times already; NACHA allows "
            f"{REINITIATION_LIMIT}",
        )
    settled_at = _original_settled_at(original)
    if settled_at is not None and now > settled_at + REINITIATION_WINDOW:
        raise ReinitiationRefused(
            "reinitiation_window",
            f"payment {original.id} settled {settled_at.date().isoformat()}: a reinitiation must "
            f"be made within {REINITIATION_WINDOW.days} days of the original entry's settlement",
        )


def _check_not_dishonored(entry: Payment, returned: PaymentReturn, now: datetime) -> None:
    """A return whose dishonor stood gave the merchant the money back (the re-credit): sending
    the debit again would collect it twice. One that may still stand blocks it too
    (``payments.services.remedies``)."""
    dishonor = ReturnDishonor.objects.filter(ach_return=returned).first()
    rule = dishonor_may_stand(dishonor, now=now)
    if rule == RETURN_DISHONORED:
        raise ReinitiationRefused(
            rule,
            f"payment {entry.id}'s return was dishonored and the dishonor stood: the debit's "
            "money is back with the merchant, so it is not sent again",
        )
    if rule == DISHONOR_PENDING:
        state = (
            "failed with no answer from the processor (it may have taken it): send it again "
            "to learn the answer"
            if dishonor.request_status == DishonorRequestStatus.FAILED
            else f"{dishonor.request_status} and not yet answered"
        )
        raise ReinitiationRefused(
            rule,
            f"payment {entry.id}'s return has a dishonor {state}; if it stands the money comes "
            "back, so it is not reinitiated until the dishonor is answered",
        )


def _original_settled_at(original: Payment) -> datetime | None:
    """When the original entry settled; for one returned before it settled, when it came
    back (the network's last answer on it)."""
    returned = PaymentReturn.objects.filter(payment=original).first()
    if returned is None:
        return None
    return returned.settled_at or returned.returned_at
