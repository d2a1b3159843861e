"""Exposure limits enforced at create, and changed with an audit row.

Every create of money movement (a debit, a refund, a payout, a reinitiation) calls
``exposure_check`` inside its own transaction, after every other lock it takes: the check reads
the merchant's limits of the entry's direction and currency (its own ``ExposureLimit``, else
the default of ``PAYMENTS["EXPOSURE_LIMITS"]``) and, when there are any, takes the merchant's
exposure lock (``payments.kernel.locks.exposure_lock``) and sums what counts already in one
statement. The lock is held until the create commits or rolls back, so the next create of the
merchant in that direction and currency counts this one: concurrent creates never pass a limit
together. A merchant without limits pays one indexed read and no lock.

What counts: the merchant's entries of that direction and currency that are not failed or
canceled (a returned debit moved money and counts), by their effective banking day: the banking
day of their creation in Eastern time, or the next banking day when created on a weekend or a
Federal Reserve holiday (``payments.banking_days``), which is the earliest day an entry created
then can settle. The daily limit counts today's effective banking day; the window limit the last
``window_banking_days`` of them, today included.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import Decimal
from functools import lru_cache

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import connection, transaction
from django.db.models import Q, QuerySet, Sum
from django.utils import timezone

from payments import conf as payments_conf
from payments.banking_days import ach_date, end_of_banking_day, is_banking_day
from payments.exceptions import ExposureLimitExceeded
from payments.exposure_limits import (
    DIRECTIONS,
    NO_LIMITS,
    Limits,
    currency_code,
    limit_param,
    parse_exposure_limits,
)
from payments.kernel.locks import exposure_lock
from payments.kernel.totals import totals_rebuild
from payments.models import (
    ExposureLimit,
    ExposureLimitChange,
    Payment,
    PaymentPurpose,
    PaymentState,
)

logger = logging.getLogger(__name__)

EXPOSURE_LIMIT_EXCEEDED = ExposureLimitExceeded.rule
CHANGE_PERMISSION = "payments.change_exposure_limits"
# Entries that never moved money, and never will.
NOT_COUNTED = (PaymentState.FAILED, PaymentState.CANCELED)
HOLD = "hold"
REVIEW_REASON_MAX = 255
DEFAULT = "default"
MERCHANT = "merchant"


def effective_banking_day(moment: datetime) -> date:
    """The banking day an entry created at ``moment`` counts on: its Eastern date, or the next
    banking day after a weekend or a holiday."""
    day = ach_date(moment)
    while not is_banking_day(day):
        day += timedelta(days=1)
    return day


def _previous_banking_day(day: date) -> date:
    day -= timedelta(days=1)
    while not is_banking_day(day):
        day -= timedelta(days=1)
    return day


@lru_cache(maxsize=64)
def counted_since(today: date, banking_days: int) -> datetime:
    """The moment after which an entry's effective banking day lies within the last
    ``banking_days`` banking days up to ``today``: the end of the banking day before them
    (the weekend or holiday between counts forward, with the entries created on it). The
    calendar is fixed, so each day's answer is worked out once per process, not walked back
    day by day (thirty-one of them for the fraud rules' baseline) on every create."""
    first = today
    for _ in range(banking_days - 1):
        first = _previous_banking_day(first)
    return end_of_banking_day(_previous_banking_day(first))


def exposure_limits_for(
    *, merchant_id: str, direction: str, currency: str, rows: list[ExposureLimit] | None = None
) -> tuple[Limits, str]:
    """The limits that apply, and where they come from (``merchant`` or ``default``);
    ``rows``: the merchant's, as the caller read them (``exposure_limits_queryset``)."""
    if rows is None:
        rows = list(
            exposure_limits_queryset(
                merchant_id=merchant_id, direction=direction, currency=currency
            )
        )
    row = rows[0] if rows else None
    if row is not None:
        return limits_of(row), MERCHANT
    return default_limits().get((direction, currency), NO_LIMITS), DEFAULT


def exposure_limits_queryset(
    *, merchant_id: str, direction: str, currency: str
) -> QuerySet[ExposureLimit]:
    """The read of the merchant's own limits in ``direction`` and ``currency``."""
    return ExposureLimit.objects.filter(
        merchant_id=merchant_id, direction=direction, currency=currency
    ).order_by("pk")[:1]


def default_limits() -> dict[tuple[str, str], Limits]:
    return parse_exposure_limits(payments_conf.EXPOSURE_LIMITS)


def limits_of(row: ExposureLimit) -> Limits:
    return Limits(
        single=row.single_limit,
        daily=row.daily_limit,
        window=row.window_limit,
        window_banking_days=row.window_banking_days,
    )


@dataclass(frozen=True)
class Exposure:
    """What counts against a merchant's limits in one direction and currency on
    ``banking_day``, and what is left."""

    direction: str
    currency: str
    limits: Limits
    source: str
    banking_day: date
    used_today: Decimal
    used_window: Decimal | None

    @property
    def remaining_today(self) -> Decimal | None:
        return None if self.limits.daily is None else self.limits.daily - self.used_today

    @property
    def remaining_window(self) -> Decimal | None:
        if self.limits.window is None or self.used_window is None:
            return None
        return self.limits.window - self.used_window


# What the merchants' day totals (``MerchantDayTotal``) and the changes not yet folded into them
# (``MerchantDayAdjustment``, which the database's trigger appends for every entry that starts
# or stops counting) add up to over a span of Eastern calendar days: a few dozen rows, however
# many payments the merchant made. ``tests/payments/test_merchant_day_totals.py`` holds them to
# the sums over the payments.
_DAYS = """
    SELECT day, amount FROM payments_merchantdaytotal
    WHERE merchant_id = %(merchant_id)s AND direction = %(direction)s
        AND currency = %(currency)s AND day > %(after)s AND day <= %(through)s
    UNION ALL
    SELECT day, amount FROM {changes}
    WHERE {key} day > %(after)s AND day <= %(through)s"""
_SUMS = """(SELECT
    SUM(amount) FILTER (WHERE day > %(split)s), SUM(amount) FILTER (WHERE day <= %(split)s)
FROM ({days}) AS days)"""
_KEY = "merchant_id = %(merchant_id)s AND direction = %(direction)s AND currency = %(currency)s AND"
# The sums as a subquery (for ``FROM``): the changes read where the trigger appends them.
DAY_SUMS = _SUMS.format(days=_DAYS.format(changes="payments_merchantdayadjustment", key=_KEY))
# Under the merchant's exposure lock for the direction and currency, the one statement folds the
# changes into the totals first (``DAY_FOLD`` heads it; its sums then read the totals as they
# were and the changes it folded): only a reader holding that lock writes the totals, so the
# creates and the workers that append changes never wait on a total's row or on each other.
DAY_FOLD = """WITH folded AS (
    DELETE FROM payments_merchantdayadjustment
    WHERE merchant_id = %(merchant_id)s AND direction = %(direction)s
        AND currency = %(currency)s
    RETURNING day, amount, entries
), totals_kept AS (
    INSERT INTO payments_merchantdaytotal AS total
        (merchant_id, direction, currency, day, amount, entries)
    SELECT %(merchant_id)s, %(direction)s, %(currency)s, day, SUM(amount), SUM(entries)
    FROM folded GROUP BY day
    ON CONFLICT (merchant_id, direction, currency, day) DO UPDATE
        SET amount = total.amount + EXCLUDED.amount, entries = total.entries + EXCLUDED.entries
)
"""
DAY_SUMS_FOLDED = _SUMS.format(days=_DAYS.format(changes="folded", key=""))


def day_totals_rebuild() -> int:
    """Rebuild every merchant's day totals from the payments, as migration 0045 first filled
    them (``payments.kernel.totals``): creates wait meanwhile. Returns how many total rows it
    wrote (0 off PostgreSQL)."""
    return totals_rebuild(
        source="payments_payment",
        totals="payments_merchantdaytotal",
        changes="payments_merchantdayadjustment",
        migration="0045_merchant_day_totals",
    )


def day_totals_params(
    *,
    merchant_id: str,
    direction: str,
    currency: str,
    today: date,
    day_starts: datetime,
    since: datetime,
) -> dict:
    """The day sums' parameters (``DAY_SUMS``, ``DAY_FOLD``): the days after ``since``'s through
    ``today``, split after ``day_starts``'s (each the end of an Eastern calendar day)."""
    return {
        "merchant_id": merchant_id,
        "direction": direction,
        "currency": currency,
        "after": ach_date(since),
        "split": ach_date(day_starts),
        "through": today,
    }


def counted_sums(
    *,
    merchant_id: str,
    direction: str,
    currency: str,
    today: date,
    day_starts: datetime,
    since: datetime,
    locked: bool = False,
) -> tuple[Decimal, Decimal]:
    """What the merchant's entries of ``direction`` and ``currency`` that count (not failed or
    canceled, no micro-entries) add up to on ``today``'s banking day (created after
    ``day_starts``) and before it, since ``since``: one statement. On PostgreSQL it reads the
    day totals the database keeps (every bound is the end of an Eastern calendar day:
    ``counted_since``, ``end_of_banking_day``), and folds the changes appended since into them
    when the caller holds the merchant's exposure lock for ``direction`` and ``currency``
    (``locked``); elsewhere it sums the payments."""
    if connection.vendor == "postgresql":
        sql = (
            f"{DAY_FOLD} SELECT * FROM {DAY_SUMS_FOLDED} AS days"
            if locked
            else f"SELECT * FROM {DAY_SUMS} AS days"
        )
        with connection.cursor() as cursor:
            cursor.execute(
                sql,
                day_totals_params(
                    merchant_id=merchant_id,
                    direction=direction,
                    currency=currency,
                    today=today,
                    day_starts=day_starts,
                    since=since,
                ),
            )
            on_day, before = cursor.fetchone()
        return on_day or Decimal("0.00"), before or Decimal("0.00")
    sums = (
        Payment.objects.filter(
            merchant_id=merchant_id,
            direction=direction,
            currency=currency,
            created_at__gt=since,
            created_at__lte=end_of_banking_day(today),
        )
        .exclude(state__in=NOT_COUNTED)
        # A validation's micro-entries are no merchant's exposure, and no use of an account.
        .exclude(purpose=PaymentPurpose.MICRO_ENTRY)
        .aggregate(
            today=Sum("amount", filter=Q(created_at__gt=day_starts)),
            before=Sum("amount", filter=Q(created_at__lte=day_starts)),
        )
    )
    return sums["today"] or Decimal("0.00"), sums["before"] or Decimal("0.00")


def exposure_used(
    *,
    merchant_id: str,
    direction: str,
    currency: str,
    limits: Limits,
    now: datetime,
    locked: bool = False,
) -> tuple[date, Decimal, Decimal | None]:
    """Today's effective banking day, what counts on it, and what counts over the window (None
    without a window): one statement. ``locked``: the caller holds the merchant's exposure lock
    for ``direction`` and ``currency`` (``counted_sums``)."""
    today = effective_banking_day(now)
    day_starts = counted_since(today, 1)
    since = day_starts
    if limits.window_banking_days is not None:
        since = counted_since(today, limits.window_banking_days)
    used_today, before = counted_sums(
        merchant_id=merchant_id,
        direction=direction,
        currency=currency,
        today=today,
        day_starts=day_starts,
        since=since,
        locked=locked,
    )
    used_window = None
    if limits.window_banking_days is not None:
        used_window = used_today + before
    return today, used_today, used_window


def exposure_check(
    *,
    merchant_id: str,
    direction: str,
    currency: str,
    amount: Decimal,
    now: datetime | None = None,
    limit_rows: list[ExposureLimit] | None = None,
    locked: bool = False,
) -> None:
    """Refuse, with ``ExposureLimitExceeded`` naming the limit and by how much, a new entry of
    ``amount`` that would take the merchant past a limit. Call inside the create's transaction,
    after its other locks: the exposure lock taken here is held until it ends. ``limit_rows``:
    the merchant's limits as the caller read them, else read here; ``locked``: the caller
    holds the exposure lock already."""
    limits, _ = exposure_limits_for(
        merchant_id=merchant_id, direction=direction, currency=currency, rows=limit_rows
    )
    if limits.empty:
        return
    refusal = {"currency": currency, "merchant_id": merchant_id, "amount": amount}
    if limits.single is not None and amount > limits.single:
        raise ExposureLimitExceeded(
            limit=limit_param(direction, "single"),
            cap=limits.single,
            used=Decimal("0.00"),
            **refusal,
        )
    if limits.daily is None and limits.window is None:
        return
    if not locked:
        exposure_lock(merchant_id, direction, currency)
    _, used_today, used_window = exposure_used(
        merchant_id=merchant_id,
        direction=direction,
        currency=currency,
        limits=limits,
        now=now or timezone.now(),
        locked=True,
    )
    if limits.daily is not None and used_today + amount > limits.daily:
        raise ExposureLimitExceeded(
            limit=limit_param(direction, "daily"), cap=limits.daily, used=used_today, **refusal
        )
    if (
        limits.window is not None
        and used_window is not None
        and used_window + amount > limits.window
    ):
        raise ExposureLimitExceeded(
            limit=limit_param(direction, "window"), cap=limits.window, used=used_window, **refusal
        )


def exposure_decide(
    *,
    merchant_id: str,
    direction: str,
    currency: str,
    amount: Decimal,
    now: datetime | None = None,
    limit_rows: list[ExposureLimit] | None = None,
    locked: bool = False,
) -> ExposureLimitExceeded | None:
    """``exposure_check`` as ``PAYMENTS["OVER_LIMIT"]`` says: None within the limits; past one,
    raise (``refuse``) or return the refusal (``hold``), and the caller creates the entry held
    for review (``payments.services.fraud.hold_apply``). A held entry counts against the
    limits like any other until it is rejected."""
    try:
        exposure_check(
            merchant_id=merchant_id,
            direction=direction,
            currency=currency,
            amount=amount,
            now=now,
            limit_rows=limit_rows,
            locked=locked,
        )
    except ExposureLimitExceeded as exc:
        if payments_conf.OVER_LIMIT != HOLD:
            raise
        return exc
    return None


def merchant_exposure(
    *, merchant_id: str, currencies: tuple[str, ...], now: datetime | None = None
) -> list[Exposure]:
    """Each direction and currency the merchant has limits in (its own or the default's), or
    could pay in (``currencies``), with what counts today and what is left."""
    now = now or timezone.now()
    own = {
        (row.direction, row.currency): limits_of(row)
        for row in ExposureLimit.objects.filter(merchant_id=merchant_id)
    }
    defaults = default_limits()
    keys = {(d, c) for d in DIRECTIONS for c in currencies} | set(own) | set(defaults)
    answer = []
    for direction, currency in sorted(keys):
        if (direction, currency) in own:
            limits, source = own[(direction, currency)], MERCHANT
        else:
            limits, source = defaults.get((direction, currency), NO_LIMITS), DEFAULT
        today, used_today, used_window = exposure_used(
            merchant_id=merchant_id, direction=direction, currency=currency, limits=limits, now=now
        )
        answer.append(Exposure(direction, currency, limits, source, today, used_today, used_window))
    return answer


def exposure_limit_set(
    *, merchant_id: str, direction: str, currency: str, limits: Limits, user, note: str
) -> ExposureLimit:
    """Set a merchant's own limits in one direction and currency (every cap empty: none at
    all, the default no longer applies), with the audit row of the change, in one transaction
    under the merchant's exposure lock: a create in flight is counted against the limits it
    read, the next one against these. ``PermissionDenied`` without
    ``payments.change_exposure_limits``; ``ValidationError`` naming the field for a missing
    note, an unknown direction or a bad currency."""
    if not user.has_perm(CHANGE_PERMISSION):
        raise PermissionDenied(f"changing exposure limits needs {CHANGE_PERMISSION}")
    note = (note or "").strip()
    if not note or "\x00" in note:
        raise ValidationError({"note": "say why the limits change (no NUL characters)"})
    if direction not in DIRECTIONS:
        raise ValidationError({"direction": f"must be one of {', '.join(DIRECTIONS)}"})
    try:
        currency_code(currency)
    except ValueError as exc:
        raise ValidationError({"currency": str(exc)}) from None
    with transaction.atomic():
        exposure_lock(merchant_id, direction, currency)
        row = (
            ExposureLimit.objects.select_for_update()
            .filter(merchant_id=merchant_id, direction=direction, currency=currency)
            .first()
        )
        if row is None:
            old = {
                "source": DEFAULT,
                **default_limits().get((direction, currency), NO_LIMITS).as_dict(),
            }
            row = ExposureLimit(merchant_id=merchant_id, direction=direction, currency=currency)
        else:
            old = {"source": MERCHANT, **limits_of(row).as_dict()}
        row.single_limit = limits.single
        row.daily_limit = limits.daily
        row.window_limit = limits.window
        row.window_banking_days = limits.window_banking_days
        row.save()
        ExposureLimitChange.objects.create(
            merchant_id=merchant_id,
            direction=direction,
            currency=currency,
            changed_by=user,
            old=old,
            new={"source": MERCHANT, **limits.as_dict()},
            note=note,
        )
    logger.warning(
        "exposure limits of %s (%s %s) changed by %s: %s -> %s",
        merchant_id,
        direction,
        currency,
        user,
        old,
        limits.as_dict(),
    )
    return row
