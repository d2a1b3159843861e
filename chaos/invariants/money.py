"""The money invariants: the processor charged each payment at most once, the ledger credits
exactly the settled payments, and every return is reversed exactly once."""

from collections import Counter
from decimal import Decimal

from chaos.invariants.report import Report
from chaos.invariants.validation import micro_entry_keys

ZERO = Decimal("0")
# A debit's entries (its payment row's); money out writes others, on its own rows.
COLLECTION_KINDS = ("credit", "reversal", "recredit", "recredit_reversal")


def report_sent_twice(
    report: Report, check: str, by_key: dict, by_payment: dict, *, verb: str
) -> None:
    """The keys, and the payments under different keys, the processor moved money for more than
    once (``verb``: charged, sent)."""
    twice = sorted(key for key, count in by_key.items() if int(count) > 1)
    if twice:
        report.add(
            check,
            f"{len(twice)} idempotency key(s) {verb} more than once "
            f"(counts {sorted({int(by_key[k]) for k in twice})})",
            twice,
        )
    payments_twice = sorted(pid for pid, count in by_payment.items() if int(count) > 1)
    if payments_twice:
        report.add(
            check,
            f"{len(payments_twice)} payment(s) {verb} more than once (under different keys)",
            payments_twice,
        )


def check_charges(report: Report, stats: dict) -> None:
    from payments.models import Payment

    check = "charged_at_most_once"
    charges = stats.get("charges")
    if not isinstance(charges, dict):
        report.add(check, "the processor's stats have no 'charges' map (idempotency key -> count)")
        return
    report_sent_twice(report, check, charges, stats.get("charges_by_payment") or {}, verb="charged")
    keys = {
        str(key): (str(pid), state)
        # Charges are debits: money out is credited, and counted apart (money_out checks). A
        # validation's offsetting micro-entry debit is a payment of ours too.
        for pid, key, state in Payment.objects.filter(
            purpose__in=("collection", "micro_entry"), direction="debit"
        ).values_list("id", "idempotency_key", "state")
    }
    # Micro-entries sent as the validation's own calls hold no payment, yet are ours.
    unknown = sorted(key for key in set(charges) - set(keys) - micro_entry_keys())
    if unknown:
        report.add(check, f"{len(unknown)} charged key(s) belong to no payment", unknown)
    _check_charged_as_recorded(report, charges, keys)
    report.checked[check] = {
        "keys charged": len(charges),
        "charges": sum(int(c) for c in charges.values()),
    }


def _check_charged_as_recorded(report: Report, charges: dict, keys: dict) -> None:
    """Money taken while we told the merchant the processor refused it, or credited without
    having been taken: both leave the books wrong whatever the state machine says."""
    from payments.models import EventKind, EventOutcome, PaymentEvent, PaymentState

    check = "charged_at_most_once"
    charged = {keys[key][0] for key, count in charges.items() if key in keys and int(count) > 0}
    rejected = set(
        PaymentEvent.objects.filter(
            kind=EventKind.SUBMISSION, outcome=EventOutcome.APPLIED, event_type="rejected"
        ).values_list("payment_id", flat=True)
    )
    charged_rejected = sorted(str(p) for p in rejected if str(p) in charged)
    if charged_rejected:
        report.add(
            check,
            f"{len(charged_rejected)} payment(s) charged by the processor but recorded as rejected",
            charged_rejected,
        )
    charged_canceled = sorted(
        pid for pid, state in keys.values() if state == PaymentState.CANCELED and pid in charged
    )
    if charged_canceled:
        report.add(
            check,
            f"{len(charged_canceled)} payment(s) charged by the processor but canceled before "
            "origination (the cancel and the submission both won)",
            charged_canceled,
        )
    uncharged = sorted(
        pid
        for pid, state in keys.values()
        if state == PaymentState.CONFIRMED and pid not in charged
    )
    if uncharged:
        report.add(
            check,
            f"{len(uncharged)} confirmed payment(s) the processor never charged",
            uncharged,
        )


def _payments() -> dict:
    from payments.models import Payment

    return {
        p["id"]: p
        for p in Payment.objects.filter(purpose="collection").values(
            "id", "state", "amount", "merchant_id"
        )
    }


def _totals_by_merchant(queryset) -> dict:
    """merchant id -> the sum of ``amount`` over ``queryset``."""
    from django.db.models import Sum

    return {
        row["merchant_id"]: row["total"]
        for row in queryset.values("merchant_id").annotate(total=Sum("amount"))
    }


def _entry_mismatches(entries: list[dict], payments: dict, *, sign: int, name: str, to: str):
    """The entries whose amount is not ``sign`` x the payment's, and those booked to another
    merchant than the payment's."""
    wrong_amount, wrong_merchant = [], []
    for entry in entries:
        payment = payments[entry["payment_id"]]
        pid = str(entry["payment_id"])
        if entry["amount"] != sign * payment["amount"]:
            wrong_amount.append(f"{pid} ({name} {entry['amount']}, payment {payment['amount']})")
        if entry["merchant_id"] != payment["merchant_id"]:
            wrong_merchant.append(
                f"{pid} ({name} {to} {entry['merchant_id']}, payment of {payment['merchant_id']})"
            )
    return wrong_amount, wrong_merchant


def check_ledger(report: Report) -> None:
    from payments.models import LedgerEntry, LedgerEntryKind, Payment, PaymentState

    check = "ledger_matches_confirmed"
    settled_states = (PaymentState.CONFIRMED, PaymentState.RETURNED)
    payments = _payments()
    entries = list(
        # The collections' credits: a micro-entry debit's is the round's (its own account).
        LedgerEntry.objects.filter(
            kind=LedgerEntryKind.CREDIT, payment__purpose="collection"
        ).values("id", "payment_id", "merchant_id", "kind", "amount")
    )
    _check_credits_confirmed(report, entries, payments, settled_states)
    credits_per_payment = Counter(e["payment_id"] for e in entries)
    settled = [pid for pid, p in payments.items() if p["state"] in settled_states]
    missing = sorted(str(pid) for pid in settled if credits_per_payment[pid] == 0)
    if missing:
        report.add(
            check, f"{len(missing)} confirmed (or returned) payment(s) without a credit", missing
        )
    several = sorted(str(pid) for pid, n in credits_per_payment.items() if n > 1)
    if several:
        report.add(check, f"{len(several)} payment(s) credited more than once", several)

    ledger = _totals_by_merchant(
        LedgerEntry.objects.filter(kind=LedgerEntryKind.CREDIT, payment__purpose="collection")
    )
    # Every payment that settled, whether it was returned afterwards or not.
    expected = _totals_by_merchant(
        Payment.objects.filter(purpose="collection", state__in=settled_states)
    )
    off = sorted(
        f"{m} (credits {ledger.get(m, ZERO)}, confirmed {expected.get(m, ZERO)})"
        for m in set(ledger) | set(expected)
        if ledger.get(m, ZERO) != expected.get(m, ZERO)
    )
    if off:
        report.add(
            check,
            f"{len(off)} merchant(s) whose ledger credits differ from their confirmed total "
            "(returned payments included: they were confirmed first)",
            off,
        )
    report.checked[check] = {
        "merchants": len(set(ledger) | set(expected)),
        "credits": len(entries),
        "confirmed": len(settled),
        "credited total": str(sum(ledger.values(), ZERO)),
    }


def _check_credits_confirmed(
    report: Report, entries: list[dict], payments: dict, settled_states: tuple
) -> None:
    """Each credit is for a settled payment whose log confirms it, for its amount and merchant:
    an applied move to ``confirmed``, or the settlement that returned a payment which had failed
    by a later return (``settle_before_return``)."""
    from django.db.models import Q

    from payments.models import EventOutcome, PaymentEvent, PaymentState

    check = "ledger_matches_confirmed"
    confirmed_in_log = set(
        PaymentEvent.objects.filter(outcome=EventOutcome.APPLIED)
        .filter(
            Q(to_state=PaymentState.CONFIRMED)
            | Q(
                from_state=PaymentState.FAILED,
                to_state=PaymentState.RETURNED,
                event_type="settled",
            )
        )
        .values_list("payment_id", flat=True)
    )
    unconfirmed, not_in_log = [], []
    for entry in entries:
        payment = payments[entry["payment_id"]]
        if payment["state"] not in settled_states:
            unconfirmed.append(f"{entry['payment_id']} ({payment['state']})")
        elif entry["payment_id"] not in confirmed_in_log:
            not_in_log.append(str(entry["payment_id"]))
    wrong_amount, wrong_merchant = _entry_mismatches(
        entries, payments, sign=1, name="credit", to="to"
    )
    if unconfirmed:
        report.add(
            check,
            f"{len(unconfirmed)} credit(s) for payments that are not confirmed (nor returned "
            "after settlement)",
            unconfirmed,
        )
    if not_in_log:
        report.add(
            check,
            f"{len(not_in_log)} credit(s) with no confirmation in the payment's event log",
            not_in_log,
        )
    if wrong_amount:
        report.add(check, f"{len(wrong_amount)} credit(s) for another amount", wrong_amount)
    if wrong_merchant:
        report.add(check, f"{len(wrong_merchant)} credit(s) to another merchant", wrong_merchant)


def check_returns_reversed(report: Report) -> None:
    from payments.models import LedgerEntry, LedgerEntryKind, Payment, PaymentState

    check = "returns_reversed"
    payments = _payments()
    reversals = list(
        LedgerEntry.objects.filter(
            kind=LedgerEntryKind.REVERSAL, payment__purpose="collection"
        ).values("payment_id", "merchant_id", "amount")
    )
    per_payment = Counter(r["payment_id"] for r in reversals)
    returned = [pid for pid, p in payments.items() if p["state"] == PaymentState.RETURNED]
    missing = sorted(str(pid) for pid in returned if per_payment[pid] == 0)
    if missing:
        report.add(check, f"{len(missing)} returned payment(s) without a reversal", missing)
    several = sorted(str(pid) for pid, n in per_payment.items() if n > 1)
    if several:
        report.add(check, f"{len(several)} payment(s) reversed more than once", several)
    orphans = [
        f"{r['payment_id']} ({payments[r['payment_id']]['state']})"
        for r in reversals
        if payments[r["payment_id"]]["state"] != PaymentState.RETURNED
    ]
    wrong_amount, wrong_merchant = _entry_mismatches(
        reversals, payments, sign=-1, name="reversal", to="of"
    )
    if orphans:
        report.add(check, f"{len(orphans)} reversal(s) without a return", orphans)
    if wrong_amount:
        report.add(check, f"{len(wrong_amount)} reversal(s) for another amount", wrong_amount)
    if wrong_merchant:
        report.add(check, f"{len(wrong_merchant)} reversal(s) of another merchant", wrong_merchant)

    reversed_total = {
        m: -total
        for m, total in _totals_by_merchant(
            LedgerEntry.objects.filter(kind=LedgerEntryKind.REVERSAL, payment__purpose="collection")
        ).items()
    }
    returned_total = _totals_by_merchant(
        Payment.objects.filter(purpose="collection", state=PaymentState.RETURNED)
    )
    # The debits' own entries: money out's are checked apart (money_out).
    net = _totals_by_merchant(
        LedgerEntry.objects.filter(kind__in=COLLECTION_KINDS, payment__purpose="collection")
    )
    _check_merchant_nets(report, net, reversed_total, returned_total)
    report.checked[check] = {
        "returned": len(returned),
        "reversals": len(reversals),
        "reversed total": str(sum(reversed_total.values(), ZERO)),
        "ledger net": str(sum(net.values(), ZERO)),
    }


def _check_merchant_nets(report: Report, net: dict, reversed_total: dict, returned_total: dict):
    """Each merchant's reversals add up to its returned payments, so its ledger net (credits
    minus reversals) is its confirmed total minus its returned total."""
    off = sorted(
        f"{m} (ledger net {net.get(m, ZERO)}, reversals {reversed_total.get(m, ZERO)}, "
        f"returned {returned_total.get(m, ZERO)})"
        for m in set(reversed_total) | set(returned_total)
        if reversed_total.get(m, ZERO) != returned_total.get(m, ZERO)
    )
    if off:
        report.add(
            "returns_reversed",
            f"{len(off)} merchant(s) whose ledger net differs from confirmed total - returned "
            "total: their reversals do not add up to their returned payments",
            off,
        )
