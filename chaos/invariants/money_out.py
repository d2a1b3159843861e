"""The money-out invariants: a credit (a refund, a payout) is sent at most once per key, refunds
never add up to more than their debit collected, a return after a refund was sent is never
silent, and every balance the module answers is the one its ledger entries make."""

from collections import defaultdict
from decimal import Decimal

from chaos.invariants.money import report_sent_twice
from chaos.invariants.report import Report
from chaos.invariants.validation import micro_entry_keys

ZERO = Decimal("0")
HOLDING = ("pending", "submitted", "confirmed")


def check_credits_sent(report: Report, stats: dict) -> None:
    """``credits_sent_at_most_once``: the processor sent each credit key (and each refund or
    payout) at most once, every key it sent is one of our credits, and none of our credits it
    sent is canceled."""
    from payments.models import Payment

    check = "credits_sent_at_most_once"
    sent = stats.get("credits_sent")
    if not isinstance(sent, dict):
        report.add(check, "the processor's stats have no 'credits_sent' map (key -> count)")
        return
    report_sent_twice(report, check, sent, stats.get("credits_sent_by_payment") or {}, verb="sent")
    credits = {
        str(key): (str(pid), state)
        for pid, key, state in Payment.objects.filter(direction="credit").values_list(
            "id", "idempotency_key", "state"
        )
    }
    # Micro-entries sent as the validation's own calls hold no payment, yet are ours.
    unknown = sorted(key for key in set(sent) - set(credits) - micro_entry_keys())
    if unknown:
        report.add(check, f"{len(unknown)} credit key(s) sent belong to no credit of ours", unknown)
    canceled = sorted(
        credits[key][0]
        for key, count in sent.items()
        if int(count) > 0 and key in credits and credits[key][1] == "canceled"
    )
    if canceled:
        report.add(
            check,
            f"{len(canceled)} credit(s) sent by the processor but canceled here (sent after all)",
            canceled,
        )
    report.checked[check] = {"credit keys sent": len(sent)}


def check_refunds_within_collected(report: Report) -> None:
    """``refunds_within_collected``: per debit, the refunds that hold money (not failed,
    canceled or returned) add up to no more than it collected, and only a debit that settled
    has any."""
    from payments.models import Payment

    check = "refunds_within_collected"
    held: dict = defaultdict(lambda: ZERO)
    for debit_id, amount in Payment.objects.filter(purpose="refund", state__in=HOLDING).values_list(
        "refund_of_id", "amount"
    ):
        held[debit_id] += amount
    debits = {
        row["id"]: row
        for row in Payment.objects.filter(id__in=list(held)).values("id", "amount", "state")
    }
    over = sorted(
        f"{pid} (refunds {total}, collected {debits[pid]['amount']})"
        for pid, total in held.items()
        if total > debits[pid]["amount"]
    )
    if over:
        report.add(check, f"{len(over)} debit(s) refunded more than they collected", over)
    unsettled = sorted(
        str(pid)
        for pid in held
        if debits[pid]["state"] not in ("confirmed", "returned")
        and Payment.objects.filter(refund_of_id=pid, state__in=("submitted", "confirmed")).exists()
    )
    if unsettled:
        report.add(check, f"{len(unsettled)} debit(s) never settled hold refunds sent", unsettled)
    report.checked[check] = {"debits refunded": len(held)}


def check_double_losses(report: Report) -> None:
    """``double_losses_flagged``: every debit returned after settlement whose refunds were sent
    has one double loss per such refund (open, or closed by a person, or undone by the refund's
    failure or return), with its recovery owed in the ledger and its high alert; every refund
    of a returned debit that was not sent was canceled; no double loss without both. A refund
    that had failed before its debit's return (refused by the processor, or its credit failed)
    held no money when the return came: it needs no double loss."""
    from payments.models import DoubleLoss, LedgerEntry, Payment, PaymentEvent
    from triage.models import Alert

    check = "double_losses_flagged"
    losses = {
        row["refund_id"]: row
        for row in DoubleLoss.objects.values("refund_id", "payment_id", "amount", "status")
    }
    refunds = list(
        Payment.objects.filter(purpose="refund", refund_of__state="returned").values(
            "id", "refund_of_id", "state", "amount", "submission_started_at"
        )
    )
    first_at: dict = {}
    for payment_id, to_state, at in PaymentEvent.objects.filter(
        payment_id__in={r["id"] for r in refunds} | {r["refund_of_id"] for r in refunds},
        to_state__in=("failed", "returned"),
    ).values_list("payment_id", "to_state", "created_at"):
        key = (payment_id, to_state)
        first_at[key] = min(at, first_at.get(key, at))
    silent, stray = [], []
    for refund in refunds:
        loss = losses.get(refund["id"])
        failed_at = first_at.get((refund["id"], "failed"))
        returned_at = first_at.get((refund["refund_of_id"], "returned"))
        failed_first = failed_at is not None and (returned_at is None or failed_at < returned_at)
        sent = (
            refund["state"] != "canceled"
            and (refund["state"] != "pending" or refund["submission_started_at"] is not None)
            and not (failed_first and loss is None)
        )
        if sent and loss is None:
            silent.append(f"{refund['refund_of_id']} (refund {refund['id']}, {refund['state']})")
        if loss is not None and loss["payment_id"] != refund["refund_of_id"]:
            stray.append(str(refund["id"]))
    if silent:
        report.add(
            check,
            f"{len(silent)} refund(s) sent before their debit's return with no double loss "
            "recorded (the customer has the money twice, silently)",
            silent,
        )
    owed = set(
        LedgerEntry.objects.filter(kind="recovery_owed").values_list("payment_id", flat=True)
    )
    alerted = {
        key.rsplit(":", 1)[1]
        for key in Alert.objects.filter(key__startswith="payment.double_loss:").values_list(
            "key", flat=True
        )
    }
    unbooked = sorted(str(rid) for rid in losses if rid not in owed)
    if unbooked:
        report.add(check, f"{len(unbooked)} double loss(es) without their recovery owed", unbooked)
    unalerted = sorted(str(rid) for rid in losses if str(rid) not in alerted)
    if unalerted:
        report.add(check, f"{len(unalerted)} double loss(es) never alerted", unalerted)
    if stray:
        report.add(check, f"{len(stray)} double loss(es) on another debit than the refund's", stray)
    report.checked[check] = {"double losses": len(losses)}


def ledger_figures(merchant_id: str, now) -> dict[str, dict]:
    """The balance figures recomputed from the ledger rows in Python, per currency (the
    definitions of ``payments.selectors.merchant_money_figures``)."""
    from payments import conf as payments_conf
    from payments.banking_days import available_cutoff
    from payments.models import LedgerEntry

    cutoff = available_cutoff(now, payments_conf.AVAILABLE_AFTER_BANKING_DAYS)
    rows = list(
        LedgerEntry.objects.filter(merchant_id=merchant_id).values(
            "payment_id",
            "payment__purpose",
            "kind",
            "amount",
            "status",
            "created_at",
            "posted_at",
            "currency",
        )
    )
    # A payment's credit, wherever it was booked (a debit counts whole once it is past).
    credits = LedgerEntry.objects.filter(
        kind="credit", payment_id__in={r["payment_id"] for r in rows}
    ).values_list("payment_id", "posted_at", "created_at")
    past = {pid for pid, posted, created in credits if (posted or created) <= cutoff}
    figures: dict = defaultdict(lambda: defaultdict(lambda: ZERO))
    for r in rows:
        f = figures[r["currency"]]
        live, posted = r["status"] != "archived", r["status"] == "posted"
        f["pending"] += r["amount"] if live else ZERO
        f["posted"] += r["amount"] if posted else ZERO
        if _debit_side(r):
            f["available"] += r["amount"] if posted and r["payment_id"] in past else ZERO
        elif r["amount"] < 0:
            f["available"] += r["amount"] if live else ZERO
        else:
            f["available"] += r["amount"] if posted else ZERO
        if r["kind"] in ("refund", "payout", "refund_return", "payout_return") and live:
            f["money_out"] -= r["amount"]
    return {
        currency: {
            name: f"{f[name]:.2f}" for name in ("pending", "posted", "available", "money_out")
        }
        for currency, f in figures.items()
    }


def check_balances(report: Report) -> None:
    """``balances_match_entries``: every merchant's balance as the API answers it equals the
    one recomputed from its ledger rows, and so does the available balance a payout reads from
    the day totals the database keeps (``payments.services.available``)."""
    from django.utils import timezone

    from payments.models import LedgerEntry
    from payments.selectors import merchant_money_figures
    from payments.services.available import merchant_available

    check = "balances_match_entries"
    merchants = sorted(set(LedgerEntry.objects.values_list("merchant_id", flat=True)))
    off, totals_off = [], []
    for merchant in merchants:
        now = timezone.now()
        answered = merchant_money_figures(merchant_id=merchant, now=now)
        recomputed = ledger_figures(merchant, now)
        if answered != recomputed:
            off.append(f"{merchant} (answered {answered}, entries make {recomputed})")
        for currency, figures in sorted(recomputed.items()):
            kept = merchant_available(merchant_id=merchant, currency=currency, now=now)
            if f"{kept:.2f}" != figures["available"]:
                totals_off.append(
                    f"{merchant} {currency} (day totals make {kept:.2f} available, "
                    f"entries make {figures['available']})"
                )
    if off:
        report.add(check, f"{len(off)} merchant balance(s) differ from their entries", off)
    if totals_off:
        report.add(
            check,
            f"{len(totals_off)} payout's available balance(s) from the day totals differ "
            "from the entries (after maintenance with triggers off: "
            "manage.py totals_rebuild)",
            totals_off,
        )
    report.checked[check] = {"merchants": len(merchants)}


def check_payouts(report: Report) -> None:
    """``payouts_never_overdraw``: each payout was covered, when it was made, by the merchant's
    available balance as its ledger stood then: replayed from the entries written before it
    (a debit counted once its credit was past the reserve at that moment; money out held
    unless its payment had failed or been canceled before; money back and recoveries once
    posted before)."""
    from payments import conf as payments_conf
    from payments.banking_days import available_cutoff
    from payments.models import LedgerEntry

    check = "payouts_never_overdraw"
    days = payments_conf.AVAILABLE_AFTER_BANKING_DAYS
    entries = list(
        LedgerEntry.objects.select_related("payment")
        .order_by("id")
        .values(
            "id",
            "merchant_id",
            "currency",
            "kind",
            "amount",
            "created_at",
            "posted_at",
            "payment_id",
            "payment__purpose",
            "payment__state",
            "payment__state_changed_at",
        )
    )
    by_merchant: dict = defaultdict(list)
    for entry in entries:
        by_merchant[(entry["merchant_id"], entry["currency"])].append(entry)
    overdrawn, payouts = [], 0
    for rows in by_merchant.values():
        for i, payout in enumerate(rows):
            if payout["kind"] != "payout":
                continue
            payouts += 1
            at = payout["created_at"]
            available = _available_then(rows[:i], at, available_cutoff(at, days))
            if -payout["amount"] > available:
                overdrawn.append(
                    f"{payout['payment_id']} ({-payout['amount']} with {available} available)"
                )
    if overdrawn:
        report.add(
            check, f"{len(overdrawn)} payout(s) made beyond the available balance", overdrawn
        )
    report.checked[check] = {"payouts": payouts}


def _debit_side(row: dict) -> bool:
    """A debit's entry (a collection's, or a micro-entry round's offsetting debit): available
    once its credit is past the return reserve, as the balance's selector counts it."""
    if row["payment__purpose"] == "collection":
        return True
    return row["payment__purpose"] == "micro_entry" and row["kind"] in (
        "credit",
        "reversal",
        "recredit",
        "recredit_reversal",
    )


def _available_then(before: list[dict], at, cutoff) -> Decimal:
    past = {
        r["payment_id"]
        for r in before
        if r["kind"] == "credit" and (r["posted_at"] or r["created_at"]) <= cutoff
    }
    available = ZERO
    for r in before:
        if _debit_side(r):
            available += r["amount"] if r["payment_id"] in past else ZERO
        elif r["amount"] < 0:
            gone_before = (
                r["payment__state"] in ("failed", "canceled")
                and r["payment__state_changed_at"] <= at
            )
            available += ZERO if gone_before else r["amount"]
        elif r["posted_at"] is not None and r["posted_at"] <= at:
            available += r["amount"]
    return available
