"""The event log's invariants: each processor event applied at most once, in agreement with its
dedup record, and every payment's log a valid, ordered walk of the state machine."""

from collections import Counter, defaultdict

from chaos.invariants.report import Report


def check_events_applied_once(report: Report) -> None:
    from payments.models import EventKind, EventOutcome, PaymentEvent, ProcessedEvent

    check = "event_applied_at_most_once"
    applied = Counter(
        PaymentEvent.objects.filter(
            kind=EventKind.PROCESSOR_EVENT, outcome=EventOutcome.APPLIED
        ).values_list("processor_event_id", flat=True)
    )
    twice = sorted(eid for eid, n in applied.items() if n > 1)
    if twice:
        report.add(check, f"{len(twice)} processor event id(s) applied more than once", twice)
    processed = {
        row["processor_event_id"]: row
        for row in ProcessedEvent.objects.values("processor_event_id", "payment_id", "outcome")
    }
    # processor_event_id -> {(payment_id, outcome)} of the outcomes a dedup record is claimed
    # with: applied, stale, and recorded (a return kept for a payment that had already failed).
    logged = defaultdict(set)
    for eid, payment_id, outcome in PaymentEvent.objects.filter(
        kind=EventKind.PROCESSOR_EVENT,
        outcome__in=(EventOutcome.APPLIED, EventOutcome.STALE, EventOutcome.RECORDED),
    ).values_list("processor_event_id", "payment_id", "outcome"):
        logged[eid].add((payment_id, outcome))
    no_record = sorted(eid for eid in logged if eid not in processed)
    if no_record:
        report.add(
            check,
            f"{len(no_record)} event(s) in the log as applied/stale have no dedup record "
            "(ProcessedEvent): a redelivery would apply them again",
            no_record,
        )
    disagree = sorted(
        eid
        for eid, seen in logged.items()
        if eid in processed
        and (processed[eid]["payment_id"], processed[eid]["outcome"]) not in seen
    )
    if disagree:
        report.add(
            check,
            f"{len(disagree)} dedup record(s) disagree with the event log on payment or outcome",
            disagree,
        )
    unlogged = sorted(eid for eid in processed if eid not in logged)
    if unlogged:
        report.add(
            check,
            f"{len(unlogged)} dedup record(s) have no applied/stale row in the event log",
            unlogged,
        )
    report.checked[check] = {"events applied": len(applied), "dedup records": len(processed)}


def check_transitions(report: Report) -> None:
    from payments.models import EventKind, Payment, PaymentEvent

    check = "transitions_valid"
    problems: dict[str, list[str]] = defaultdict(list)  # problem -> payment ids
    states = dict(Payment.objects.values_list("id", "state"))
    rows = PaymentEvent.objects.order_by("payment_id", "id").values_list(
        "payment_id", "id", "kind", "outcome", "event_type", "from_state", "to_state"
    )
    replay = _Replay(problems)
    count = 0
    for row in rows.iterator(chunk_size=5000):
        count += 1
        payment_id, _, kind, _, _, _, to_state = row
        if payment_id not in replay.states:
            if kind != EventKind.CREATED:
                problems["the log does not start with the creation row"].append(str(payment_id))
            elif to_state != "pending":
                problems[f"created in state {to_state!r}, not pending"].append(str(payment_id))
            replay.states[payment_id] = to_state
        elif kind == EventKind.CREATED:
            problems["a second creation row"].append(str(payment_id))
        else:
            replay.step(*row)
    for payment_id, state in states.items():
        if payment_id not in replay.states:
            problems["a payment with no event log"].append(str(payment_id))
        elif replay.states[payment_id] != state:
            problems["the log ends in another state than the payment's"].append(
                f"{payment_id} (log {replay.states[payment_id]}, payment {state})"
            )
    for problem, ids in problems.items():
        report.add(check, f"{len(ids)} x {problem}", ids)
    report.checked[check] = {"payments replayed": len(replay.states), "log rows": count}


class _Replay:
    """Each payment's state as its log so far says, and the rows that do not follow from it."""

    def __init__(self, problems: dict[str, list[str]]) -> None:
        from payments.services import EVENT_TRANSITIONS, TRANSITIONS

        self.problems = problems
        self.states: dict = {}
        # payment -> the dishonor answers its log has recorded so far (facts, not states).
        self.facts: dict = defaultdict(set)
        self.allowed = {(str(a), str(b)) for a, b in TRANSITIONS}
        self.allowed_by_event = {(str(a), str(b)) for a, b in EVENT_TRANSITIONS}

    def step(self, payment_id, row_id, kind, outcome, event_type, from_state, to_state) -> None:
        from payments.models import EventKind, EventOutcome

        pid, current = str(payment_id), self.states[payment_id]
        if outcome == EventOutcome.APPLIED:
            if from_state != current:
                self.problems[
                    "an applied row starts in another state than the previous one ended "
                    "(out of order or lost update)"
                ].append(f"{pid} (row {row_id}: {from_state}->{to_state} after {current})")
            legal = self.allowed_by_event if kind == EventKind.PROCESSOR_EVENT else self.allowed
            if (from_state, to_state) not in legal:
                self.problems["a transition the state machine does not allow"].append(
                    f"{pid} (row {row_id}: {from_state}->{to_state} by {kind} {event_type})"
                )
            self.states[payment_id] = to_state
            return
        if from_state != current or to_state != current:
            self.problems[
                f"a {outcome} row written in another state than the payment was in"
            ].append(f"{pid} (row {row_id}: {from_state}->{to_state} while {current})")
        if kind == EventKind.PROCESSOR_EVENT and event_type in _dishonor_event_types():
            self._fact(pid, payment_id, row_id, outcome, event_type, current)
            return
        if kind == EventKind.PROCESSOR_EVENT and outcome == EventOutcome.STALE:
            if not _behind(event_type, current):
                self.problems[
                    "an event marked stale that was not behind the payment's state (dropped)"
                ].append(f"{pid} (row {row_id}: {event_type} while {current})")

    def _fact(self, pid, payment_id, row_id, outcome, event_type, current) -> None:
        """A dishonor answer moves no state: recorded once on a returned payment, stale only
        when the same answer was recorded before."""
        from payments.models import EventOutcome, PaymentState

        seen = event_type in self.facts[payment_id]
        if outcome == EventOutcome.RECORDED:
            if seen:
                self.problems["a dishonor answer recorded twice"].append(
                    f"{pid} (row {row_id}: {event_type})"
                )
            if current != PaymentState.RETURNED:
                self.problems["a dishonor answer recorded on a payment not returned"].append(
                    f"{pid} (row {row_id}: {event_type} while {current})"
                )
            self.facts[payment_id].add(event_type)
        elif outcome == EventOutcome.STALE and not seen:
            self.problems[
                "a dishonor answer marked stale that was never recorded before (dropped)"
            ].append(f"{pid} (row {row_id}: {event_type})")


def _dishonor_event_types() -> tuple[str, ...]:
    from payments.catalogue import EventTypeKind, event_type_names

    return event_type_names(EventTypeKind.FACT)


def _behind(event_type: str, current: str) -> bool:
    """The event's target state is the payment's state or one it has already passed."""
    from payments.events import event_target_state, transition_event_types
    from payments.models import STATE_RANK

    if event_type not in transition_event_types():
        return False
    target = event_target_state(event_type, current)
    return target is not None and (target == current or STATE_RANK[target] < STATE_RANK[current])
