"""Payouts: a merchant's own money sent to its own bank account, from its available balance,
exactly once.

A payout is a payment of its own (``purpose=payout``, ``direction=credit``): its own
idempotency key, the same states, outbox, queue, worker and event log as every payment. Its
``source_token`` is the account the credit goes to: a processor token on the reference backend,
a vault token held for the merchant on the bank backend.

The balance check and the hold on the money happen in one transaction, under a lock per
merchant: the available balance (as ``payments.selectors.merchant_money_figures`` defines it,
read from the day totals of ``payments.services.available``) is read, the payout refused if it
would go below zero, and its pending ``payout`` entry written before the lock is let go. So no
two concurrent payouts overdraw. A payout that fails or is canceled archives its entry; one that
comes back puts the money back, once.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from decimal import Decimal

from django.core.exceptions import ValidationError

from payments import conf as payments_conf
from payments import originator
from payments.exceptions import MoneyOutRefused
from payments.kernel.locks import money_out_lock_sql
from payments.models import (
    Payment,
    PaymentDirection,
    PaymentPurpose,
)
from payments.processor.backend import get_backend
from payments.services.available import (
    available_after_locks,
    available_of,
    merchant_available,
)
from payments.services.create import (
    SUPPORTED_CURRENCIES,
    create_locks_take,
    create_transaction,
    payment_build,
    validate_source_token,
)
from payments.services.fraud import hold_decide
from payments.services.refunds import CREDITS_UNSUPPORTED

logger = logging.getLogger(__name__)

INSUFFICIENT_AVAILABLE_BALANCE = "insufficient_available_balance"
RULES = (INSUFFICIENT_AVAILABLE_BALANCE, CREDITS_UNSUPPORTED)


def payout_create(
    *,
    merchant_id: str,
    amount: Decimal,
    destination_token: str,
    currency: str = "USD",
    description: str = "",
    metadata: Mapping[str, str] | None = None,
    payroll: bool = False,
    caused_by: str = "",
    carried: Mapping[str, str] | None = None,
) -> Payment:
    """Pay ``amount`` out of the merchant's available balance to ``destination_token``,
    described ``PAYOUT``, or ``PAYROLL`` for wages (``payroll``), in the account's class (a WEB
    one as PPD; ``PAYMENTS["DEFAULT_SEC_CODE"]`` when the backend knows none).

    Raises ``ValidationError`` naming the field for a currency, amount or token the module does
    not take (a vault token not held for this merchant is "unknown"), and ``MoneyOutRefused``
    (``insufficient_available_balance``: nothing written) when the available balance, read under
    the merchant's lock, is less than ``amount`` or already negative, and
    ``ExposureLimitExceeded`` when it would take the merchant past a credit limit (refunds and
    payouts count together).
    """
    if currency not in SUPPORTED_CURRENCIES:
        raise ValidationError({"currency": f"unsupported currency {currency!r}; use USD"})
    if amount <= 0:
        raise ValidationError({"amount": "must be greater than zero"})
    try:
        validate_source_token(destination_token)
    except ValidationError as exc:
        raise ValidationError({"destination_token": exc.messages}) from None
    backend = get_backend()
    checked = backend.source_token_check(token=destination_token, merchant_id=merchant_id)
    if checked.refused is not None:
        raise ValidationError({"destination_token": checked.refused})
    sec_code = originator.credit_sec_code(checked.sec_code or payments_conf.DEFAULT_SEC_CODE)
    if not backend.supports_credits:
        raise MoneyOutRefused(
            CREDITS_UNSUPPORTED,
            f"the processor backend {type(backend).__name__} cannot send credits, so nothing "
            "can be paid out through it",
        )
    with create_transaction():
        # The merchant's money-out lock, exclusive (its exposure lock after it, as the last),
        # then, in the same statement once they are held, the available balance: the day totals
        # PostgreSQL keeps, folded under the lock, the same figure as merchant_money_figures's
        # without reading the merchant's every entry.
        balance = available_after_locks(merchant_id=merchant_id, currency=currency)
        locks = create_locks_take(
            merchant_id=merchant_id,
            direction=PaymentDirection.CREDIT,
            currency=currency,
            first=money_out_lock_sql(merchant_id),
            after_locks=[balance] if balance is not None else [],
        )
        if balance is not None:
            available = available_of(locks.after[0])
        else:
            available = merchant_available(merchant_id=merchant_id, currency=currency, locked=True)
        if amount > available:
            raise MoneyOutRefused(
                INSUFFICIENT_AVAILABLE_BALANCE,
                f"a payout of {amount:.2f} {currency} exceeds the {available:.2f} {currency} "
                f"available to merchant {merchant_id}",
            )
        hold = hold_decide(
            merchant_id=merchant_id,
            direction=PaymentDirection.CREDIT,
            purpose=PaymentPurpose.PAYOUT,
            currency=currency,
            amount=amount,
            account_token=destination_token,
            account_changed_at=checked.changed_at,
            limit_rows=locks.limits,
            exposure_locked=locks.exposure_locked,
        )
        payout = payment_build(
            merchant_id=merchant_id,
            amount=amount,
            currency=currency,
            account_token=destination_token,
            sec_code=sec_code,
            entry_description=originator.PAYROLL if payroll else originator.PAYOUT,
            direction=PaymentDirection.CREDIT,
            purpose=PaymentPurpose.PAYOUT,
            description=description,
            metadata=metadata,
            hold=hold,
            caused_by=caused_by,
            carried=carried,
        )
    logger.info(
        "payout %s of %s %s created for merchant %s (%s available before)",
        payout.id,
        amount,
        currency,
        merchant_id,
        available,
        extra={"payment_id": str(payout.id)},
    )
    return payout
