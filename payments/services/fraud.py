"""Fraud monitoring at create, and the accounts a return blocks.

``hold_decide`` is the one decision a create of money movement (a debit, a refund, a payout)
makes about a person's review, inside its transaction and after its other locks: the exposure
limits first (``payments.services.limits.exposure_decide``: refused, or held with
``PAYMENTS["OVER_LIMIT"] = "hold"``), then the fraud rules (``payments.fraud_rules``) under the
merchant's exposure lock of the entry's direction and currency, so two creates racing each other
are judged one after the other (the second counts the first). The rules read the merchant's
history in one statement (``MerchantHistory``); a create pays that read and the lock, no more.
A flagged payment is written ``pending`` and held (``hold_apply``): the rule, every flag with the
figures that tripped it and the merchant's baseline are stored on it for the reviewer, and it
has no submit command until a person approves it (``payments.services.review``).

Account blocks (``AccountBlock``): an R17 return whose addenda say ``QUESTIONABLE`` (NACHA's 2024
rule: an account opened under false pretenses) blocks the account's debits for every merchant
and raises a high alert; an unauthorized return (R05, R07, R10, R11, R29, R51) blocks it for the
merchant. Both stay until a person with ``payments.clear_account_block`` clears them with a
note. A debit from a blocked account is refused (``AccountBlocked``, the API's 409
``account_blocked``).
"""

from __future__ import annotations

import copy
import functools
import logging
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, connection, transaction
from django.db.models import Count, Min, Q, QuerySet, Sum
from django.utils import timezone

from payments import conf as payments_conf
from payments.alerts import AlertSeverity, alert_raise
from payments.banking_days import end_of_banking_day
from payments.events import ProcessorEvent
from payments.exceptions import AccountBlocked
from payments.fraud_rules import Entry, Flag, FraudRule, parse_fraud_rules
from payments.kernel.locks import exposure_lock
from payments.metrics import REVIEW_HOLDS
from payments.models import (
    AccountBlock,
    AccountBlockScope,
    ExposureLimit,
    Payment,
    PaymentDirection,
    PaymentPurpose,
    PaymentState,
    ReviewStatus,
)
from payments.return_codes import UNAUTHORIZED_CODES
from payments.services.limits import (
    DAY_FOLD,
    DAY_SUMS_FOLDED,
    REVIEW_REASON_MAX,
    counted_since,
    day_totals_params,
    effective_banking_day,
    exposure_decide,
)

logger = logging.getLogger(__name__)

EXPOSURE_LIMIT_RULE = "exposure_limit"
RULE_FAILED = "rule_failed"
BASELINE_BANKING_DAYS = 30
NOT_COUNTED = (PaymentState.FAILED, PaymentState.CANCELED)
QUESTIONABLE = "QUESTIONABLE"
QUESTIONABLE_CODE = "R17"
CLEAR_PERMISSION = "payments.clear_account_block"


_parsed: tuple[object, tuple[FraudRule, ...]] | None = None


def fraud_rules() -> tuple[FraudRule, ...]:
    """The rules of the current ``PAYMENTS["FRAUD_RULES"]``, parsed once per value (a changed
    setting is seen at once)."""
    global _parsed
    value = payments_conf.FRAUD_RULES
    if _parsed is None or _parsed[0] != value:
        _parsed = (copy.deepcopy(value), parse_fraud_rules(value))
    return _parsed[1]


class MerchantHistory:
    """The merchant's figures the rules read (``payments.fraud_rules.History``), read on first
    use in one statement: its entries of the direction and currency today and over the trailing
    ``BASELINE_BANKING_DAYS`` banking days (by effective banking day, failed and canceled ones
    not counted), when it first used the account, and how many debits it drew from it."""

    def __init__(self, entry: Entry) -> None:
        self.entry = entry
        self._figures: dict[str, Any] | None = None

    def _read(self) -> dict[str, Any]:
        if self._figures is not None:
            return self._figures
        window = history_window(self.entry)
        if connection.vendor == "postgresql":
            sums = history_sums_sql(window)
        else:
            sums = history_sums_orm(window)
        trailing = sums["trailing"] or Decimal("0.00")
        self._figures = {
            "today_total": sums["today"] or Decimal("0.00"),
            "daily_mean": (trailing / BASELINE_BANKING_DAYS).quantize(Decimal("0.01")),
            "account_first_seen": sums["first_seen"],
            "account_debits": sums["account_debits"],
        }
        return self._figures

    @property
    def today_total(self) -> Decimal:
        return self._read()["today_total"]

    @property
    def daily_mean(self) -> Decimal:
        return self._read()["daily_mean"]

    @property
    def baseline_days(self) -> int:
        return BASELINE_BANKING_DAYS

    @property
    def account_first_seen(self) -> datetime | None:
        return self._read()["account_first_seen"]

    @property
    def account_debits(self) -> int:
        return self._read()["account_debits"]

    def baseline(self) -> dict[str, Any]:
        """What the reviewer compares the payment with (as read, or nothing if no rule read)."""
        if self._figures is None:
            return {}
        first_seen = self._figures["account_first_seen"]
        return {
            "direction": self.entry.direction,
            "today_total": f"{self._figures['today_total']:.2f}",
            "daily_mean": f"{self._figures['daily_mean']:.2f}",
            "baseline_banking_days": BASELINE_BANKING_DAYS,
            "account_first_seen": first_seen.isoformat() if first_seen else None,
            "account_debits": self._figures["account_debits"],
        }


def history_window(entry: Entry) -> dict[str, Any]:
    """What ``MerchantHistory`` reads the figures of: the entry's merchant, direction,
    currency and account, and the moments its banking days start and end."""
    today = effective_banking_day(entry.now)
    return {
        "merchant_id": entry.merchant_id,
        "direction": entry.direction,
        "currency": entry.currency,
        "account_token": entry.account_token,
        "today": today,
        "day_starts": counted_since(today, 1),
        "day_ends": end_of_banking_day(today),
        "since": counted_since(today, BASELINE_BANKING_DAYS + 1),
    }


def history_sums_orm(window: dict[str, Any]) -> dict[str, Any]:
    """``MerchantHistory``'s figures as the ORM reads them (the databases other than
    PostgreSQL): the merchant's entries of the last ``BASELINE_BANKING_DAYS`` banking days and
    the account's, less an account validation's micro-entries."""
    counted = ~Q(state__in=NOT_COUNTED)
    same = Q(direction=window["direction"], currency=window["currency"]) & counted
    account = Q(source_token=window["account_token"])
    since, day_starts = window["since"], window["day_starts"]
    return (
        Payment.objects.filter(merchant_id=window["merchant_id"])
        # An account validation's micro-entries are no use of the account by the merchant:
        # they must not make a first large debit look like the account's second.
        .exclude(purpose=PaymentPurpose.MICRO_ENTRY)
        .filter(Q(created_at__gt=since) | account)
        .aggregate(
            today=Sum(
                "amount",
                filter=same & Q(created_at__gt=day_starts, created_at__lte=window["day_ends"]),
            ),
            trailing=Sum(
                "amount", filter=same & Q(created_at__gt=since, created_at__lte=day_starts)
            ),
            first_seen=Min("created_at", filter=account),
            account_debits=Count(
                "id", filter=account & Q(direction=PaymentDirection.DEBIT) & counted
            ),
        )
    )


# ``history_sums_orm``'s figures in one statement written once: the day's and the trailing
# days' sums from the day totals the database keeps, folding in the changes appended since
# (``payments.services.limits.DAY_FOLD``: a few dozen rows however many payments the merchant
# made; summing the payments took 120 ms for a merchant of 10,000 debits a day), and the
# account's first use and debits from its own index. The rules read it under the merchant's
# exposure lock (``hold_decide``), which the fold needs. ``tests/payments/test_fraud_history.py``
# holds the two to the same figures.
_HISTORY_SQL = """{fold} SELECT days.on_day, days.before, account.first_seen, account.debits
FROM {days} AS days(on_day, before),
    (SELECT MIN(created_at), COUNT(id) FILTER (WHERE direction = %(debit)s AND {counted})
     FROM {table}
     WHERE merchant_id = %(merchant_id)s AND source_token = %(account_token)s
        AND NOT (purpose = %(micro_entry)s)) AS account(first_seen, debits)"""
_COUNTED = "NOT (state IN (%(failed)s, %(canceled)s))"
_HISTORY_CONSTANTS = {
    "debit": PaymentDirection.DEBIT.value,
    "micro_entry": PaymentPurpose.MICRO_ENTRY.value,
    "failed": PaymentState.FAILED.value,
    "canceled": PaymentState.CANCELED.value,
}


@functools.cache
def _history_sql() -> str:
    return _HISTORY_SQL.format(
        fold=DAY_FOLD,
        days=DAY_SUMS_FOLDED,
        table=connection.ops.quote_name(Payment._meta.db_table),
        counted=_COUNTED,
    )


def history_sums_sql(window: dict[str, Any]) -> dict[str, Any]:
    """``history_sums_orm``'s figures in its statement written once (PostgreSQL)."""
    days = day_totals_params(
        merchant_id=window["merchant_id"],
        direction=window["direction"],
        currency=window["currency"],
        today=window["today"],
        day_starts=window["day_starts"],
        since=window["since"],
    )
    with connection.cursor() as cursor:
        cursor.execute(
            _history_sql(),
            {**days, "account_token": window["account_token"], **_HISTORY_CONSTANTS},
        )
        today, trailing, first_seen, account_debits = cursor.fetchone()
    return {
        "today": today,
        "trailing": trailing,
        "first_seen": first_seen,
        "account_debits": account_debits,
    }


@dataclass(frozen=True)
class Hold:
    """Why a new payment waits for a person: the first flag's rule, and every flag."""

    flags: tuple[Flag, ...]
    baseline: dict[str, Any] = field(default_factory=dict)

    @property
    def rule(self) -> str:
        return self.flags[0].rule

    @property
    def reason(self) -> str:
        # An exposure limit's summary names the limit already (``debit_daily_limit: ...``).
        parts = [
            flag.summary if flag.rule == EXPOSURE_LIMIT_RULE else f"{flag.rule}: {flag.summary}"
            for flag in self.flags
        ]
        return "; ".join(parts)[:REVIEW_REASON_MAX]

    @property
    def evidence(self) -> dict[str, Any]:
        return {"flags": [flag.as_dict() for flag in self.flags], "baseline": self.baseline}


def hold_decide(
    *,
    merchant_id: str,
    direction: str,
    purpose: str,
    currency: str,
    amount: Decimal,
    account_token: str,
    account_changed_at: datetime | None = None,
    now: datetime | None = None,
    limit_rows: list[ExposureLimit] | None = None,
    exposure_locked: bool = False,
) -> Hold | None:
    """Whether the new entry is held for review, and why; None to send it. Raises
    ``ExposureLimitExceeded`` past a limit unless ``OVER_LIMIT`` is ``hold``. Call inside the
    create's transaction, after its other locks: the exposure lock taken here is held until it
    ends. ``limit_rows``: the merchant's limits as the caller read them
    (``payments.services.limits.exposure_limits_queryset``), else read here;
    ``exposure_locked``: the caller took the exposure lock already, in its own statement
    (``payments.kernel.locks.exposure_lock_sql``)."""
    flags: list[Flag] = []
    over_limit = exposure_decide(
        merchant_id=merchant_id,
        direction=direction,
        currency=currency,
        amount=amount,
        now=now,
        limit_rows=limit_rows,
        locked=exposure_locked,
    )
    if over_limit is not None:
        flags.append(
            Flag(
                EXPOSURE_LIMIT_RULE,
                f"{over_limit.limit}: {over_limit}",
                {
                    "limit": over_limit.limit,
                    "cap": f"{over_limit.cap:.2f}",
                    "used": f"{over_limit.used:.2f}",
                    "amount": f"{amount:.2f}",
                    "over": f"{over_limit.over:.2f}",
                },
            )
        )
    rules = fraud_rules()
    if not rules:
        return Hold(tuple(flags)) if flags else None
    if not exposure_locked:
        exposure_lock(merchant_id, direction, currency)
    entry = Entry(
        merchant_id=merchant_id,
        direction=direction,
        purpose=purpose,
        amount=amount,
        currency=currency,
        account_token=account_token,
        now=now or timezone.now(),
        account_changed_at=account_changed_at,
    )
    history = MerchantHistory(entry)
    for rule in rules:
        flag = _rule_checked(rule, entry, history)
        if flag is not None:
            flags.append(flag)
    if not flags:
        return None
    return Hold(tuple(flags), history.baseline())


def _rule_checked(rule, entry: Entry, history: MerchantHistory) -> Flag | None:
    """A rule's finding; a rule that fails holds the payment (a person decides what it could
    not), logged with its traceback."""
    try:
        return rule.check(entry, history)
    except Exception as exc:
        logger.exception("fraud rule %s failed on a payment of %s", rule.name, entry.merchant_id)
        return Flag(
            rule.name or RULE_FAILED,
            f"the rule failed ({type(exc).__name__}): held for a person to decide",
            {"error": type(exc).__name__},
        )


def hold_apply(payment: Payment, hold: Hold) -> dict[str, Any]:
    """Mark the new, unsaved ``payment`` held for review; the audit row's payload fields that
    say so. Counted per rule once the create commits."""
    payment.review_status = ReviewStatus.HELD
    payment.review_reason = hold.reason
    payment.review_rule = hold.rule
    payment.review_evidence = hold.evidence
    rule = hold.rule
    transaction.on_commit(lambda: REVIEW_HOLDS.labels(rule).inc(), robust=True)
    logger.warning(
        "payment %s held for review: %s",
        payment.id,
        payment.review_reason,
        extra={"payment_id": str(payment.id)},
    )
    return {
        "review_status": ReviewStatus.HELD,
        "review_reason": payment.review_reason,
        "review_rule": rule,
    }


def account_block_check(
    *,
    merchant_id: str,
    account_token: str,
    new_authorization: bool = False,
    blocks: list[AccountBlock] | None = None,
) -> None:
    """Refuse (``AccountBlocked``) a debit from an account blocked for every merchant or for
    this one: one indexed read, none when the caller read it (``blocks``, from
    ``account_blocks_queryset``). A reinitiation under a new authorization the client states
    (``new_authorization``: what NACHA asks after an unauthorized return) passes the merchant's
    own block, never a ``QUESTIONABLE`` one."""
    if blocks is None:
        blocks = list(
            account_blocks_queryset(
                merchant_id=merchant_id,
                account_token=account_token,
                new_authorization=new_authorization,
            )
        )
    block = blocks[0] if blocks else None
    if block is None:
        return
    whose = "every merchant" if block.scope == AccountBlockScope.ALL_MERCHANTS else "you"
    raise AccountBlocked(
        block_id=block.id,
        return_code=block.return_code,
        message=(
            f"source_token: the account is blocked for debits from {whose} since "
            f"{block.opened_at:%Y-%m-%d} after a {block.return_code} return; an operator "
            "clears it once the account holder's authorization is confirmed"
        ),
    )


def account_blocks_queryset(
    *, merchant_id: str, account_token: str, new_authorization: bool = False
) -> QuerySet[AccountBlock]:
    """The read of the account's open block that ``account_block_check`` makes."""
    scopes = Q(scope=AccountBlockScope.ALL_MERCHANTS)
    if not new_authorization:
        scopes |= Q(merchant_id=merchant_id)
    return (
        AccountBlock.objects.filter(account_token=account_token, cleared_at__isnull=True)
        .filter(scopes)
        .order_by("pk")
        .only("id", "return_code", "scope", "opened_at")[:1]
    )


def questionable(event: ProcessorEvent) -> bool:
    """An R17 return whose addenda information says ``QUESTIONABLE`` (the bank's word that the
    account was opened or used under false pretenses)."""
    if event.reason_code != QUESTIONABLE_CODE:
        return False
    texts = [event.message, str(event.details.get("addenda_information", ""))]
    return any(QUESTIONABLE in text.upper() for text in texts)


def account_blocks_on_return(*, payment: Payment, event: ProcessorEvent) -> AccountBlock | None:
    """Block the returned debit's account when its return calls for it, in the return's
    transaction; the alert after commit. A block already open for it stands (one row)."""
    if payment.direction != PaymentDirection.DEBIT:
        return None
    if questionable(event):
        scope, severity = AccountBlockScope.ALL_MERCHANTS, AlertSeverity.HIGH
        reason = "R17 return marked QUESTIONABLE: opened or used under false pretenses"
    elif event.reason_code in UNAUTHORIZED_CODES:
        scope, severity = AccountBlockScope.MERCHANT, AlertSeverity.MEDIUM
        reason = f"unauthorized return {event.reason_code}"
    else:
        return None
    try:
        with transaction.atomic():
            block = AccountBlock.objects.create(
                merchant_id=payment.merchant_id,
                account_token=payment.source_token,
                scope=scope,
                reason=reason,
                return_code=event.reason_code[:4],
                payment=payment,
            )
    except IntegrityError:
        return None  # already blocked: the open block stands
    whose = "every merchant" if scope == AccountBlockScope.ALL_MERCHANTS else payment.merchant_id
    summary = (
        f"account {payment.source_token} blocked for debits from {whose}: {reason} "
        f"(payment {payment.id} of {payment.merchant_id})"
    )
    transaction.on_commit(
        lambda: alert_raise(
            severity=severity,
            key=f"payments.account_blocked:{block.pk}",
            summary=summary,
            details={"return_code": event.reason_code, "scope": scope},
            payment_id=payment.id,
        ),
        robust=True,
    )
    return block


def account_block_clear(*, block_id: int, user, note: str) -> AccountBlock:
    """Clear an open block, with the note saying why, under its row lock: cleared once.
    ``PermissionDenied`` without ``payments.clear_account_block``; ``ValidationError`` naming
    ``note`` (missing, NUL) or ``block`` (unknown, already cleared)."""
    if not user.has_perm(CLEAR_PERMISSION):
        raise PermissionDenied(f"clearing an account block needs {CLEAR_PERMISSION}")
    note = (note or "").strip()
    if not note or "\x00" in note:
        raise ValidationError({"note": "say why the block is cleared (no NUL characters)"})
    with transaction.atomic():
        block = AccountBlock.objects.select_for_update().filter(pk=block_id).first()
        if block is None:
            raise ValidationError({"block": f"no account block {block_id}"})
        if block.cleared_at is not None:
            raise ValidationError({"block": f"block {block_id} was cleared already"})
        block.cleared_at = timezone.now()
        block.cleared_by = user
        block.note = note[:2000]
        block.save(update_fields=["cleared_at", "cleared_by", "note"])
    logger.warning(
        "account block %s (%s) cleared by %s: %s",
        block.pk,
        block.account_token,
        user,
        note,
    )
    return block
