"""The ACH lifecycle's invariants beyond money: each notification of change recorded exactly once
for the payment its event named, and every reinitiation chain within NACHA's limits."""

from collections import Counter, defaultdict

from chaos.invariants.report import Report


def check_nocs(report: Report) -> None:
    """``nocs_recorded_once``: one NOC per recorded ``notification_of_change`` event, for its
    payment, and none without that event; a NOC moved no state. A NOC of a prenote answers no
    payment's event (the bank's file is applied to the validation): one per its id, which the
    unique constraint holds, so it is counted and left out of the payments' comparison."""
    from payments.catalogue import NOTIFICATION_OF_CHANGE
    from payments.models import EventKind, EventOutcome, NotificationOfChange, PaymentEvent

    check = "nocs_recorded_once"
    rows = PaymentEvent.objects.filter(
        kind=EventKind.PROCESSOR_EVENT, event_type=NOTIFICATION_OF_CHANGE.name
    ).values_list("processor_event_id", "payment_id", "outcome", "from_state", "to_state")
    recorded: dict[str, set] = defaultdict(set)
    moved = []
    for eid, payment_id, outcome, from_state, to_state in rows:
        if outcome == EventOutcome.RECORDED:
            recorded[eid].add(payment_id)
        if from_state != to_state:
            moved.append(f"{eid} ({from_state}->{to_state})")
    nocs = list(
        NotificationOfChange.objects.filter(payment__isnull=False).values_list(
            "processor_event_id", "payment_id"
        )
    )
    of_prenotes = NotificationOfChange.objects.filter(payment__isnull=True).count()
    counts = Counter(eid for eid, _ in nocs)
    twice = sorted(eid for eid, n in recorded.items() if len(n) > 1 or counts[eid] > 1)
    if twice:
        report.add(check, f"{len(twice)} NOC event(s) recorded more than once", twice)
    missing = sorted(eid for eid in recorded if counts[eid] == 0)
    if missing:
        report.add(check, f"{len(missing)} recorded NOC event(s) without their NOC", missing)
    orphan = sorted(eid for eid, payment_id in nocs if payment_id not in recorded.get(eid, ()))
    if orphan:
        report.add(
            check,
            f"{len(orphan)} NOC(s) without a recorded event for their payment in the log",
            orphan,
        )
    if moved:
        report.add(check, f"{len(moved)} NOC event row(s) that moved a state", sorted(moved))
    report.checked[check] = {
        "NOCs": len(nocs),
        "NOC events recorded": len(recorded),
        "NOCs of prenotes": of_prenotes,
    }


def check_reinitiations(report: Report) -> None:
    """``reinitiations_within_limits``: at most two reinitiations per original entry, numbered
    1 and 2, each for the original's merchant, amount, currency and token, and each made after
    the entry before it came back."""
    from payments.models import Payment, PaymentReturn
    from payments.services.reinitiation import REINITIATION_LIMIT

    check = "reinitiations_within_limits"
    fields = ("merchant_id", "amount", "currency", "source_token")
    chains: dict = defaultdict(list)
    for row in Payment.objects.filter(reinitiation_of__isnull=False).values(
        "id", "reinitiation_of_id", "reinitiation_number", "created_at", *fields
    ):
        chains[row["reinitiation_of_id"]].append(row)
    originals = {
        row["id"]: row for row in Payment.objects.filter(id__in=list(chains)).values("id", *fields)
    }
    returned = dict(
        PaymentReturn.objects.filter(
            payment_id__in=[*chains, *(r["id"] for c in chains.values() for r in c)]
        ).values_list("payment_id", "created_at")
    )
    over, unlike, unreturned = [], [], []
    for original_id, entries in chains.items():
        entries.sort(key=lambda row: row["reinitiation_number"])
        numbers = [row["reinitiation_number"] for row in entries]
        if len(entries) > REINITIATION_LIMIT or numbers != list(range(1, len(entries) + 1)):
            over.append(f"{original_id} ({numbers})")
        original = originals[original_id]
        unlike += [str(row["id"]) for row in entries if any(row[f] != original[f] for f in fields)]
        before = [original_id, *(row["id"] for row in entries)]
        for previous, row in zip(before, entries, strict=False):
            came_back = returned.get(previous)
            if came_back is None or came_back > row["created_at"]:
                unreturned.append(str(row["id"]))
    if over:
        report.add(check, f"{len(over)} chain(s) beyond the reinitiation limit", over)
    if unlike:
        report.add(
            check,
            f"{len(unlike)} reinitiation(s) for another merchant, amount or token",
            unlike,
        )
    if unreturned:
        report.add(
            check,
            f"{len(unreturned)} reinitiation(s) made before the entry before them came back",
            unreturned,
        )
    report.checked[check] = {
        "chains": len(chains),
        "reinitiations": sum(len(c) for c in chains.values()),
    }
