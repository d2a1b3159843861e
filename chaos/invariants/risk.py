"""The risk-control invariants: no merchant's entries pass an exposure limit that was in force
when they were made, and no payment held for review reaches the processor before a person
approved it.

Each says how much it checked. A run configured with limits (``expected``) whose entries met
none, or configured with holds that held nothing, fails its check: a pass over nothing proves
nothing, and a run whose load no longer reaches its limits must say so, not pass."""

from __future__ import annotations

from collections import Counter, defaultdict
from decimal import Decimal

from django.db.models import Min

from chaos.invariants.report import Report

NOT_COUNTED = ("failed", "canceled")
UNHELD = ""


def check_limits(report: Report, *, expected: bool = False) -> None:
    """``limits_never_exceeded``: replaying each merchant's entries of a direction and currency
    in creation order, none that was not held for review passes the single-entry cap in force
    when it was made (the limit's last change before it, else the setting's default), nor takes
    the entries of its effective banking day, or of the window's banking days, past the daily or
    window cap. Entries failed or canceled since, and held ones, are left out of the sums: at
    their create they counted, so leaving them out can only hide an excess, never invent one.
    Counts the entries checked against a limit, and the banking days that ran into a daily cap
    (their total within the largest entry of that merchant's direction of the cap: the next
    such entry would not fit); ``expected`` (the run set limits) fails a check of no entry.
    And the day totals the limits read from (``MerchantDayTotal`` and its changes) add up, day
    by day, to what the payments that count add up to."""
    from payments.models import ExposureLimitChange, Payment
    from payments.services.limits import default_limits

    check = "limits_never_exceeded"
    changes: dict = defaultdict(list)
    for change in ExposureLimitChange.objects.order_by("changed_at", "id"):
        changes[(change.merchant_id, change.direction, change.currency)].append(change)
    defaults = default_limits()
    entries: dict = defaultdict(list)
    rows = (
        Payment.objects.exclude(state__in=NOT_COUNTED)
        .filter(review_status=UNHELD)
        .order_by("created_at", "id")
        .values_list("id", "merchant_id", "direction", "currency", "amount", "created_at")
    )
    for pid, merchant, direction, currency, amount, created in rows:
        entries[(merchant, direction, currency)].append((pid, amount, created))
    over: list[str] = []
    counted = 0
    near: set = set()
    for key, made in entries.items():
        history = changes.get(key, [])
        default = defaults.get((key[1], key[2]))
        if not history and default is None:
            continue
        largest = max(amount for _, amount, _ in made)
        for index, (pid, amount, created) in enumerate(made):
            caps = _caps_at(history, default, created)
            if caps is None:
                continue
            counted += 1
            over += _excess(pid, amount, created, made[: index + 1], caps)
            if _near_daily_cap(created, made[: index + 1], caps, largest):
                near.add((key, _day(created)))
    if over:
        report.add(check, f"{len(over)} entr(ies) past an exposure limit in force", over)
    drifted = _day_totals_drift()
    if drifted:
        report.add(
            check,
            f"{len(drifted)} day total(s) the limits read differ from the payments that count "
            "(after maintenance with triggers off: manage.py totals_rebuild)",
            drifted,
        )
    if expected and not counted:
        report.add(
            check,
            "the run set exposure limits, yet no entry was made under one: the check proved "
            "nothing",
        )
    report.checked[check] = {
        "entries with limits": counted,
        "banking days run into a daily cap": len(near),
    }


def _day_totals_drift() -> list[str]:
    """The merchant days whose total the limits read (the day totals the database keeps, and
    the changes not yet folded into them) differs from what the payments that count add up to
    on that Eastern calendar day; PostgreSQL only (elsewhere the limits sum the payments)."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return []
    kept = "SELECT merchant_id, direction, currency, day, amount, entries FROM {table}"
    with connection.cursor() as cursor:
        cursor.execute(
            f"""WITH kept AS (
                SELECT merchant_id, direction, currency, day,
                    SUM(amount) AS amount, SUM(entries) AS entries
                FROM ({kept.format(table="payments_merchantdaytotal")}
                    UNION ALL {kept.format(table="payments_merchantdayadjustment")}) AS rows
                GROUP BY 1, 2, 3, 4
            ), made AS (
                SELECT merchant_id, direction, currency,
                    (created_at AT TIME ZONE 'America/New_York')::date AS day,
                    SUM(amount) AS amount, COUNT(*) AS entries
                FROM payments_payment
                WHERE state <> ALL(%s) AND purpose <> 'micro_entry'
                GROUP BY 1, 2, 3, 4
            )
            SELECT merchant_id, direction, currency, day,
                COALESCE(kept.amount, 0), COALESCE(kept.entries, 0),
                COALESCE(made.amount, 0), COALESCE(made.entries, 0)
            FROM kept FULL JOIN made USING (merchant_id, direction, currency, day)
            WHERE COALESCE(kept.amount, 0) <> COALESCE(made.amount, 0)
                OR COALESCE(kept.entries, 0) <> COALESCE(made.entries, 0)
            ORDER BY 1, 2, 3, 4""",
            [list(NOT_COUNTED)],
        )
        return [
            f"{merchant} {direction} {currency} {day} (totals make {kept_amount:.2f} in "
            f"{kept_entries}, the payments {made_amount:.2f} in {made_entries})"
            for (
                merchant,
                direction,
                currency,
                day,
                kept_amount,
                kept_entries,
                made_amount,
                made_entries,
            ) in cursor.fetchall()
        ]


def _day(created):
    from payments.services.limits import effective_banking_day

    return effective_banking_day(created)


def _near_daily_cap(created, made: list, caps: dict, largest: Decimal) -> bool:
    """Whether the entries of ``created``'s banking day, up to it, came within ``largest`` of
    the daily cap in force."""
    from payments.services.limits import counted_since

    daily = caps.get("daily")
    if daily is None:
        return False
    since = counted_since(_day(created), 1)
    total = sum((a for _, a, c in made if since < c <= created), Decimal("0"))
    return total > Decimal(daily) - largest


def _caps_at(history: list, default, created) -> dict | None:
    """The caps in force at ``created``: the last change before it, else the default."""
    in_force = None
    for change in history:
        if change.changed_at <= created:
            in_force = change.new
    if in_force is None:
        if default is None:
            return None
        return default.as_dict()
    return in_force


def _excess(pid, amount: Decimal, created, made: list, caps: dict) -> list[str]:
    from payments.services.limits import counted_since, effective_banking_day

    found = []
    single, daily, window = (caps.get(k) for k in ("single", "daily", "window"))
    if single is not None and amount > Decimal(single):
        found.append(f"{pid} ({amount} over the single-entry cap {single})")
    day = effective_banking_day(created)
    if daily is not None:
        since = counted_since(day, 1)
        total = sum((a for _, a, c in made if since < c <= created), Decimal("0"))
        if total > Decimal(daily):
            found.append(f"{pid} (its day adds up to {total}, daily cap {daily})")
    days = caps.get("window_banking_days")
    if window is not None and days:
        since = counted_since(day, int(days))
        total = sum((a for _, a, c in made if since < c <= created), Decimal("0"))
        if total > Decimal(window):
            found.append(f"{pid} (its {days} banking days add up to {total}, cap {window})")
    return found


def check_held_never_sent(report: Report, stats: dict, *, expected: bool = False) -> None:
    """``held_payments_never_sent_unapproved``: a payment held for review (still held, or
    rejected) has no processor attempt, no submission started and no processor id, and the
    processor charged or credited none of its keys; an approved one's first attempt came after
    its approval. Counts them by decision, and the approved ones sent; ``expected`` (the run
    turned on a rule that holds) fails a check of no held payment."""
    from payments.models import EventKind, Payment, PaymentEvent, ProcessorAttempt

    check = "held_payments_never_sent_unapproved"
    reviewed = {
        row["id"]: row
        for row in Payment.objects.exclude(review_status=UNHELD).values(
            "id",
            "idempotency_key",
            "review_status",
            "submission_started_at",
            "processor_id",
            "state",
        )
    }
    # Grouped, not DISTINCT ON: the demo runs this check on SQLite.
    first_attempt = dict(
        ProcessorAttempt.objects.filter(payment_id__in=list(reviewed))
        .values("payment_id")
        .annotate(first=Min("started_at"))
        .order_by()
        .values_list("payment_id", "first")
    )
    approved_at = dict(
        PaymentEvent.objects.filter(
            payment_id__in=list(reviewed), kind=EventKind.REVIEW, event_type="approved"
        ).values_list("payment_id", "created_at")
    )
    processor_keys = set(stats.get("charges") or {}) | set(stats.get("credits_sent") or {})
    sent_unapproved = []
    for pid, row in reviewed.items():
        if row["review_status"] == "approved":
            approval = approved_at.get(pid)
            attempt = first_attempt.get(pid)
            if approval is None or (attempt is not None and attempt < approval):
                sent_unapproved.append(f"{pid} (attempted before its approval)")
            continue
        signs = [
            name
            for name, present in (
                ("an attempt", pid in first_attempt),
                ("a submission started", row["submission_started_at"] is not None),
                ("a processor id", bool(row["processor_id"])),
                ("its key at the processor", str(row["idempotency_key"]) in processor_keys),
            )
            if present
        ]
        if signs:
            sent_unapproved.append(f"{pid} ({row['review_status']}, with {', '.join(signs)})")
    if sent_unapproved:
        report.add(
            check,
            f"{len(sent_unapproved)} payment(s) held for review sent without an approval",
            sorted(sent_unapproved),
        )
    if expected and not reviewed:
        report.add(
            check,
            "the run turned on a rule that holds, yet no payment was held for review: the check "
            "proved nothing",
        )
    decisions = Counter(row["review_status"] for row in reviewed.values())
    report.checked[check] = {
        "payments held for review": len(reviewed),
        "approved": decisions["approved"],
        "approved and attempted": sum(
            1
            for pid, row in reviewed.items()
            if row["review_status"] == "approved" and pid in first_attempt
        ),
        "rejected": decisions["rejected"],
        "canceled by the merchant while held": sum(
            1
            for row in reviewed.values()
            if row["review_status"] == "held" and row["state"] == "canceled"
        ),
        "still held": sum(
            1
            for row in reviewed.values()
            if row["review_status"] == "held" and row["state"] != "canceled"
        ),
    }
