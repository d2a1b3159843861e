"""The dishonor invariant: each returned payment's dishonor entries are what its event log
says, whatever order the processor's answers came in and however often.

A payment's log is its history: the ``return_dishonored`` and ``dishonor_contested`` rows
recorded on it (stale and duplicate ones moved nothing). From them alone, without the
module's own rule: a returned payment whose dishonor is recorded holds one re-credit of its
amount; one whose contest is recorded too holds one reversal of that re-credit; nothing else
holds either. So each merchant's dishonor entries add up to its returned payments dishonored
and not contested, and (with the credit and reversal checks) its ledger net is its confirmed
total plus those.
"""

from collections import Counter, defaultdict
from decimal import Decimal

from chaos.invariants.report import Report

ZERO = Decimal("0")
CHECK = "dishonors_booked"
DISHONORED, CONTESTED = "return_dishonored", "dishonor_contested"


def check_dishonors(report: Report) -> None:
    from payments import conf as payments_conf
    from payments.models import (
        EventKind,
        EventOutcome,
        LedgerEntry,
        Payment,
        PaymentEvent,
        PaymentState,
        ReturnDishonor,
    )
    from payments.services.credits import HOUSE_ACCOUNT

    payments = {
        p["id"]: p
        for p in Payment.objects.values("id", "state", "amount", "merchant_id", "purpose")
    }

    def account_of(payment: dict) -> str:
        # An account validation's micro-entries are booked where the run's MICRO_ENTRY_COST
        # says (the house's by default), their returns and dishonors with them.
        if payment["purpose"] == "micro_entry" and payments_conf.MICRO_ENTRY_COST == "house":
            return HOUSE_ACCOUNT
        return payment["merchant_id"]

    facts: dict = defaultdict(set)
    for pid, event_type in PaymentEvent.objects.filter(
        kind=EventKind.PROCESSOR_EVENT,
        outcome=EventOutcome.RECORDED,
        event_type__in=(DISHONORED, CONTESTED),
    ).values_list("payment_id", "event_type"):
        facts[pid].add(event_type)
    entries = list(
        LedgerEntry.objects.filter(kind__in=("recredit", "recredit_reversal")).values(
            "payment_id", "merchant_id", "kind", "amount"
        )
    )
    held = Counter((e["payment_id"], e["kind"]) for e in entries)

    def wanted(pid) -> set[str]:
        said = facts.get(pid, set())
        if payments[pid]["state"] != PaymentState.RETURNED or DISHONORED not in said:
            return set()
        return {"recredit", "recredit_reversal"} if CONTESTED in said else {"recredit"}

    missing, orphans, several, wrong = [], [], [], []
    for pid in set(facts) | {pid for pid, _ in held}:
        want = wanted(pid)
        for kind in ("recredit", "recredit_reversal"):
            n = held[(pid, kind)]
            if kind in want and n == 0:
                missing.append(f"{pid} ({kind})")
            elif kind not in want and n:
                orphans.append(f"{pid} ({kind}; log says {sorted(facts.get(pid, ())) or 'none'})")
            if n > 1:
                several.append(f"{pid} ({n} x {kind})")
    for entry in entries:
        payment = payments[entry["payment_id"]]
        sign = 1 if entry["kind"] == "recredit" else -1
        if entry["amount"] != sign * payment["amount"] or (
            entry["merchant_id"] != account_of(payment)
        ):
            wrong.append(
                f"{entry['payment_id']} ({entry['kind']} {entry['amount']} to "
                f"{entry['merchant_id']}, payment {payment['amount']} of {payment['merchant_id']})"
            )
    for ids, what in (
        (missing, "dishonor(s) the log records without their ledger entry"),
        (orphans, "dishonor ledger entr(y/ies) the log does not call for"),
        (several, "dishonor ledger entr(y/ies) written more than once"),
        (wrong, "dishonor ledger entr(y/ies) for another amount or merchant"),
    ):
        if ids:
            report.add(CHECK, f"{len(ids)} {what}", sorted(ids))

    _check_records(report, facts, ReturnDishonor)
    # Each merchant's dishonor entries add up to its returned payments dishonored and not
    # contested: with the credits and reversals the checks above hold to their payments, its
    # ledger net is what its payments' histories say they are worth to it.
    expected: dict = defaultdict(lambda: ZERO)
    for pid, p in payments.items():
        if wanted(pid) == {"recredit"}:
            expected[account_of(p)] += p["amount"]
    net: dict = defaultdict(lambda: ZERO)
    for entry in entries:
        net[entry["merchant_id"]] += entry["amount"]
    off = sorted(
        f"{m} (dishonor entries {net.get(m, ZERO)}, dishonored and not contested "
        f"{expected.get(m, ZERO)})"
        for m in set(net) | set(expected)
        if net.get(m, ZERO) != expected.get(m, ZERO)
    )
    if off:
        report.add(
            CHECK,
            f"{len(off)} merchant(s) whose ledger net differs from what their payments' "
            "histories say: their dishonor entries do not add up to their returned payments "
            "dishonored and not contested",
            off,
        )
    report.checked[CHECK] = {
        "payments with answers": len(facts),
        "dishonored": sum(DISHONORED in f for f in facts.values()),
        "contested": sum(CONTESTED in f for f in facts.values()),
        "entries": len(entries),
    }


def _check_records(report: Report, facts: dict, model) -> None:
    """The dishonor records name the same facts as the log."""
    disagree = []
    for pid, dishonored, contested in model.objects.values_list(
        "payment_id", "dishonored_event_id", "contested_event_id"
    ):
        said = facts.get(pid, set())
        if bool(dishonored) != (DISHONORED in said) or bool(contested) != (CONTESTED in said):
            disagree.append(str(pid))
    missing = [str(pid) for pid in facts if not model.objects.filter(payment_id=pid).exists()]
    if disagree or missing:
        report.add(
            CHECK,
            f"{len(disagree) + len(missing)} dishonor record(s) that disagree with the log",
            sorted(disagree + missing),
        )
