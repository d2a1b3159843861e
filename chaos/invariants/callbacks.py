"""Every callback the processor delivered is accounted for: it left a trace in the event log, a
parked message, a dead letter or an error row, with the payload it was delivered with. Every
callback it dropped (never delivered) was recovered by the pull of its events: it left such a
trace too."""

from collections import Counter, defaultdict
from decimal import Decimal, InvalidOperation
from typing import Any

from chaos.invariants.report import Report

# Where a delivered callback can end, best first: an event applied once and then redelivered
# counts as applied.
# "in flight": a worker has started it and not finished (only before the system settles).
TRACE_RANK = (
    "applied",
    "stale",
    "duplicate",
    "parked",
    "dead letter",
    "processing error",
    "in flight",
)


def _signature(body: Any) -> tuple[str, str, str] | None:
    """(payment id, event type, amount) of an event body; None when the body does not say."""
    if not isinstance(body, dict):
        return None
    try:
        amount = f"{Decimal(str(body['amount'])):.2f}"
        return (str(body["payment_id"]), str(body["event_type"]), amount)
    except (KeyError, InvalidOperation):
        return None


def _sent_callback(item: Any) -> tuple[str, tuple[str, str, str] | None]:
    if isinstance(item, dict):
        body = item.get("body", item)
        return str(body.get("processor_event_id", "")), _signature(body)
    return str(item), None


def _event_of(body: Any) -> Any:
    """The processor's event inside a queue envelope (nested under ``event``)."""
    if isinstance(body, dict) and isinstance(body.get("event"), dict):
        return body["event"]
    return body


def _callback_traces() -> dict[str, list[tuple[str, tuple[str, str, str] | None]]]:
    """processor_event_id -> every trace of it: (where it ended, what the recorded body says)."""
    from callbacks.models import UNFINISHED_STATUSES, ParkedMessage, ProcessingError, QueueMessage
    from payments.models import EventKind, PaymentEvent
    from triage.models import DeadLetter

    traces: dict[str, list] = defaultdict(list)
    for eid, outcome, payload in PaymentEvent.objects.filter(
        kind=EventKind.PROCESSOR_EVENT
    ).values_list("processor_event_id", "outcome", "payload"):
        where = outcome if outcome in TRACE_RANK else "applied"
        traces[eid].append((where, _signature(payload)))
    for envelope in ParkedMessage.objects.values_list("body", flat=True):
        body = _event_of(envelope)
        if isinstance(body, dict) and body.get("processor_event_id"):
            traces[str(body["processor_event_id"])].append(("parked", _signature(body)))
    for eid, body in DeadLetter.objects.exclude(processor_event_id="").values_list(
        "processor_event_id", "body"
    ):
        traces[eid].append(("dead letter", _signature(_event_of(body))))
    for envelope in QueueMessage.objects.filter(status__in=UNFINISHED_STATUSES).values_list(
        "body", flat=True
    ):
        body = _event_of(envelope)
        if isinstance(body, dict) and body.get("processor_event_id"):
            traces[str(body["processor_event_id"])].append(("in flight", _signature(body)))
    failed_messages = set(ProcessingError.objects.values_list("message_id", flat=True))
    for envelope in QueueMessage.objects.filter(message_id__in=failed_messages).values_list(
        "body", flat=True
    ):
        body = _event_of(envelope)
        if isinstance(body, dict) and body.get("processor_event_id"):
            traces[str(body["processor_event_id"])].append(("processing error", _signature(body)))
    return traces


def check_callbacks(report: Report, stats: dict, callbacks_sent: list | None) -> None:
    """A delivery is accounted for by a trace of its event id whose recorded body agrees with
    it (payment, type, amount): a redelivery of a known id with another payload is a conflict,
    and finding only the first payload's trace means the conflict was dropped."""
    check = "callbacks_accounted"
    traces = _callback_traces()
    if callbacks_sent is None:
        _check_callbacks_by_count(report, stats, traces)
        return
    sent = {_sent_callback(item) for item in callbacks_sent}
    sent.discard(("", None))
    missing, conflicts = [], []
    where: Counter = Counter()
    for eid, signature in sorted(sent, key=lambda s: (s[0], s[1] or ())):
        found = [
            w
            for w, recorded in traces.get(eid, ())
            if signature is None or recorded is None or recorded == signature
        ]
        if found:
            where[min(found, key=TRACE_RANK.index)] += 1
        elif eid in traces:
            conflicts.append(f"{eid} ({' '.join(signature or ())})")
        else:
            missing.append(eid)
    if missing:
        report.add(
            check,
            f"{len(missing)} delivered callback(s) left no trace (not applied, stale, duplicate, "
            "parked or in triage): lost",
            missing,
        )
    if conflicts:
        report.add(
            check,
            f"{len(conflicts)} delivered callback(s) reused a known processor_event_id with "
            "another payload and left no trace of their own: a conflict dropped instead of "
            "going to a human",
            conflicts,
        )
    report.checked[check] = {
        "delivered": len(callbacks_sent),
        "distinct events": len(sent),
        **{k: where[k] for k in TRACE_RANK},
        "missing": len(missing),
        "conflicts dropped": len(conflicts),
    }


def _check_callbacks_by_count(report: Report, stats: dict, traces: dict) -> None:
    """Without the list of delivered event ids: each accepted debit sends two events (submitted,
    then settled or returned), three when a settled debit is returned afterwards (the
    processor's ``events`` count says how many it created); those the processor gave up on may
    never have reached us. So at least events - given up distinct events must have left a
    trace."""
    check = "callbacks_accounted"
    debits = int(stats.get("debits", len(stats.get("charges") or {})))
    given_up = int(stats.get("callbacks_given_up", 0))
    pending = int(stats.get("callbacks_pending", 0))
    events = int(stats["events"]) if "events" in stats else 2 * debits
    floor = events - given_up - pending
    if len(traces) < floor:
        report.add(
            check,
            f"only {len(traces)} distinct processor events left a trace, but the processor "
            f"delivered at least {floor} ({events} events of {debits} debits - {given_up} given "
            f"up - {pending} pending): at least "
            f"{floor - len(traces)} lost (by count; the processor's stats list no event ids)",
        )
    report.checked[check] = {
        "by count only": "yes",
        "events traced": len(traces),
        "expected at least": floor,
        "deliveries": int(stats.get("callbacks_sent", 0)),
    }


def check_dropped_callbacks(report: Report, callbacks_dropped: list | None) -> None:
    """Each callback the processor dropped reached us anyway, through the events pull: its
    event id left a trace (applied, stale, duplicate, parked, in triage) with the payload the
    processor made."""
    check = "dropped_callbacks_recovered"
    if callbacks_dropped is None:
        report.checked[check] = {"dropped": "not recorded"}
        return
    traces = _callback_traces()
    dropped = {_sent_callback(item) for item in callbacks_dropped}
    dropped.discard(("", None))
    missing = []
    where: Counter = Counter()
    for eid, signature in sorted(dropped, key=lambda s: (s[0], s[1] or ())):
        found = [
            w
            for w, recorded in traces.get(eid, ())
            if signature is None or recorded is None or recorded == signature
        ]
        if found:
            where[min(found, key=TRACE_RANK.index)] += 1
        else:
            missing.append(eid)
    if missing:
        report.add(
            check,
            f"{len(missing)} callback(s) the processor never delivered were not recovered by "
            "the events pull (no trace of them, or only with another payload)",
            missing,
        )
    report.checked[check] = {
        "dropped": len(dropped),
        "recovered": len(dropped) - len(missing),
        **{k: where[k] for k in TRACE_RANK if where[k]},
        "missing": len(missing),
    }
