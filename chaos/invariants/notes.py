"""What the report notes without counting it a violation: work still moving after the run, and
payments not final that no hold, dead letter or error puts in front of a person."""

from collections import Counter

from chaos.invariants.report import Report, ids_suffix


def notes_unfinished(report: Report) -> None:
    from callbacks.models import UNFINISHED_STATUSES, PaymentHold, ProcessingError, QueueMessage
    from payments.models import FINAL_STATES, OutboxMessage, Payment
    from triage.models import DeadLetter

    unfinished = QueueMessage.objects.filter(status__in=UNFINISHED_STATUSES).count()
    if unfinished:
        report.notes.append(f"{unfinished} queue message(s) still in progress or retrying")
    outbox = OutboxMessage.objects.filter(published_at__isnull=True).count()
    if outbox:
        report.notes.append(f"{outbox} outbox message(s) not yet published")
    in_triage = {str(p) for p in DeadLetter.objects.values_list("payment_id", flat=True) if p}
    in_triage |= set(
        PaymentHold.objects.filter(released_at__isnull=True).values_list("payment_id", flat=True)
    )
    in_triage |= set(ProcessingError.objects.values_list("payment_id", flat=True))
    open_states = Counter()
    unattended = []
    for pid, state in Payment.objects.exclude(state__in=FINAL_STATES).values_list("id", "state"):
        open_states[state] += 1
        if str(pid) not in in_triage:
            unattended.append(str(pid))
    if open_states:
        report.notes.append(
            "payments not final: "
            + ", ".join(f"{state} {n}" for state, n in sorted(open_states.items()))
            + f"; {len(unattended)} of them with no hold, dead letter or error"
            + ids_suffix(tuple(unattended))
        )
