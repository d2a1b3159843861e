"""The risk report the annual review of a Third-Party Sender's risk controls reads
(``manage.py risk_report``): for each merchant over a period of days (UTC, both ends included),

- ``rule`` records: per rule (every fraud rule on now, ``exposure_limit``, and any rule that
  held a payment of the period), the payments checked (the merchant's creates: every rule on at
  the time saw each one), held, approved, rejected, and still held;
- ``returns`` records: its debits the network answered and their returns, by category, with the
  rate against NACHA's threshold (unauthorized 0.5 %, administrative 3 %, overall 15 %), read
  from the per-day counters the returns write (``MerchantReturnDay``);
- ``limit_change`` records: each change of its exposure limits, who made it, before, after, why.

What the report does not do is the host's duty: the written policy, knowing the merchants
(KYB), and the review itself.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

from django.db.models import Count, Sum

from payments.models import ExposureLimitChange, MerchantReturnDay, Payment, ReviewStatus
from payments.services.fraud import fraud_rules

EXPOSURE_LIMIT_RULE = "exposure_limit"
# NACHA's return-rate thresholds, in percent of the debits the network answered.
NACHA_THRESHOLDS = {
    "unauthorized": Decimal("0.5"),
    "administrative": Decimal("3.0"),
    "overall": Decimal("15.0"),
}
_RETURN_FIELDS = {
    "unauthorized": "unauthorized_returns",
    "administrative": "administrative_returns",
    "overall": "returns",
}
# Every column a record may have, in the CSV's order.
COLUMNS = (
    "record",
    "merchant_id",
    "rule",
    "checked",
    "held",
    "approved",
    "rejected",
    "still_held",
    "category",
    "debits",
    "returns",
    "rate_percent",
    "threshold_percent",
    "over_threshold",
    "changed_at",
    "changed_by",
    "direction",
    "currency",
    "old",
    "new",
    "note",
)


def _bounds(start: date, end: date) -> tuple[datetime, datetime]:
    return (
        datetime.combine(start, time.min, tzinfo=UTC),
        datetime.combine(end + timedelta(days=1), time.min, tzinfo=UTC),
    )


def risk_report_records(*, start: date, end: date) -> Iterator[dict[str, Any]]:
    """The report's records, merchant by merchant (in order of merchant id)."""
    since, until = _bounds(start, end)
    created = Payment.objects.filter(created_at__gte=since, created_at__lt=until)
    checked = {
        row["merchant_id"]: row["n"]
        for row in created.values("merchant_id").annotate(n=Count("id")).order_by()
    }
    decisions: dict[str, dict[str, dict[str, int]]] = defaultdict(lambda: defaultdict(dict))
    rows = (
        created.exclude(review_status=ReviewStatus.NONE)
        .values("merchant_id", "review_rule", "review_status")
        .annotate(n=Count("id"))
        .order_by()
    )
    for row in rows:
        rule = row["review_rule"] or EXPOSURE_LIMIT_RULE
        decisions[row["merchant_id"]][rule][row["review_status"]] = row["n"]
    returns = {
        row["merchant_id"]: row
        for row in MerchantReturnDay.objects.filter(day__gte=start, day__lte=end)
        .values("merchant_id")
        .annotate(
            debits=Sum("debits"),
            returns=Sum("returns"),
            unauthorized_returns=Sum("unauthorized_returns"),
            administrative_returns=Sum("administrative_returns"),
        )
        .order_by()
    }
    changes: dict[str, list[ExposureLimitChange]] = defaultdict(list)
    for change in (
        ExposureLimitChange.objects.filter(changed_at__gte=since, changed_at__lt=until)
        .select_related("changed_by")
        .order_by("changed_at", "id")
    ):
        changes[change.merchant_id].append(change)
    rules_on = [EXPOSURE_LIMIT_RULE, *(rule.name for rule in fraud_rules())]
    for merchant_id in sorted(set(checked) | set(decisions) | set(returns) | set(changes)):
        held_by = decisions.get(merchant_id, {})
        for rule in [*rules_on, *sorted(set(held_by) - set(rules_on))]:
            yield _rule_record(
                merchant_id, rule, checked.get(merchant_id, 0), held_by.get(rule, {})
            )
        if merchant_id in returns:
            yield from _return_records(merchant_id, returns[merchant_id])
        for change in changes.get(merchant_id, []):
            yield _change_record(change)


def _rule_record(merchant_id: str, rule: str, checked: int, counts: dict[str, int]) -> dict:
    still_held = counts.get(ReviewStatus.HELD, 0)
    approved = counts.get(ReviewStatus.APPROVED, 0)
    rejected = counts.get(ReviewStatus.REJECTED, 0)
    return {
        "record": "rule",
        "merchant_id": merchant_id,
        "rule": rule,
        "checked": checked,
        "held": still_held + approved + rejected,
        "approved": approved,
        "rejected": rejected,
        "still_held": still_held,
    }


def _return_records(merchant_id: str, sums: dict) -> Iterator[dict]:
    debits = sums["debits"] or 0
    for category, field in _RETURN_FIELDS.items():
        count = sums[field] or 0
        rate = (Decimal(count) * 100 / debits).quantize(Decimal("0.01")) if debits else None
        threshold = NACHA_THRESHOLDS[category]
        yield {
            "record": "returns",
            "merchant_id": merchant_id,
            "category": category,
            "debits": debits,
            "returns": count,
            "rate_percent": None if rate is None else str(rate),
            "threshold_percent": str(threshold),
            "over_threshold": rate is not None and rate > threshold,
        }


def _change_record(change: ExposureLimitChange) -> dict:
    return {
        "record": "limit_change",
        "merchant_id": change.merchant_id,
        "changed_at": change.changed_at.isoformat(),
        "changed_by": change.changed_by.get_username(),
        "direction": change.direction,
        "currency": change.currency,
        "old": change.old,
        "new": change.new,
        "note": change.note,
    }
