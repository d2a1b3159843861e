"""Every payment's final state agrees with the processor's own list of its events.

The processor's list is what it made, delivered or dropped (the sandbox records both), never the
events the run injected on purpose (conflicting payloads, amounts of other payments). A payment
a person has had in front of them (a dead letter, open or closed: they may have discarded an
event), one behind a hold, or one with a message still in hand is left out: its state is a
person's or the pipeline's to settle. A payment whose retries left error rows and then went
through is compared like any other.
"""

from collections import defaultdict
from datetime import datetime
from typing import Any

from chaos.invariants.report import Report
from chaos.invariants.validation import micro_entry_keys

CHECK = "final_states_match_processor"

# The processor's events that move a debit, in the order a tie on the timestamp is read.
LIFECYCLE = ("submitted", "settled", "failed", "returned")


def processor_final_states(events: list[Any]) -> dict[str, str]:
    """payment id -> the state the processor's own events put it in: ``submitted``,
    ``confirmed``, ``failed``, or ``returned`` (``failed`` for a return before settlement).

    The events are ordered by when the processor made them (their timestamps, read as times:
    never as text, nor by where they sit in the list, since a dropped settlement is listed
    after the return that followed it); every event must carry its timestamp."""
    by_payment: dict[str, list[tuple[datetime, int, str]]] = defaultdict(list)
    for item in events:
        body = item.get("body", item) if isinstance(item, dict) else None
        if not isinstance(body, dict) or body.get("event_type") not in LIFECYCLE:
            continue
        event_type = body["event_type"]
        by_payment[str(body.get("payment_id"))].append(
            (_when(body), LIFECYCLE.index(event_type), event_type)
        )
    states = {}
    for payment_id, seen in by_payment.items():
        seen.sort()
        settled = any(event_type == "settled" for *_, event_type in seen)
        # A "submitted" never follows a settlement or a failure: one that does is stale.
        moved = [event_type for *_, event_type in seen if event_type != "submitted"]
        last = moved[-1] if moved else "submitted"
        states[payment_id] = {
            "submitted": "submitted",
            "settled": "confirmed",
            "failed": "failed",
            "returned": "returned" if settled else "failed",
        }[last]
    return states


def _when(body: dict) -> datetime:
    stamp = body.get("timestamp")
    if not isinstance(stamp, str):
        raise ValueError(f"processor event {body.get('processor_event_id')} has no timestamp")
    when = datetime.fromisoformat(stamp)
    if when.tzinfo is None:
        raise ValueError(f"processor event timestamp {stamp!r} has no offset")
    return when


def check_final_states(report: Report, processor_events: list | None) -> None:
    """``final_states_match_processor``: each payment the processor made events for, and no
    person or message in hand has, is in the state those events say."""
    from callbacks.models import UNFINISHED_STATUSES, PaymentHold, QueueMessage
    from payments.models import Payment
    from triage.models import DeadLetter

    if processor_events is None:
        report.checked[CHECK] = {"processor events": "not recorded"}
        return
    expected = processor_final_states(processor_events)
    attended = {str(p) for p in DeadLetter.objects.values_list("payment_id", flat=True) if p}
    attended |= {
        str(p)
        for p in PaymentHold.objects.filter(released_at__isnull=True).values_list(
            "payment_id", flat=True
        )
    }
    attended |= {
        str(g)
        for g in QueueMessage.objects.filter(status__in=UNFINISHED_STATUSES).values_list(
            "group_id", flat=True
        )
    }
    actual = {
        str(pid): state
        for pid, state in Payment.objects.filter(id__in=list(expected)).values_list("id", "state")
    }
    # Micro-entries sent as the validation's own calls name their key as the payment: no
    # payment of ours holds them (their validation does).
    micro_entries = micro_entry_keys()
    wrong, unknown, compared = [], [], 0
    for payment_id, state in sorted(expected.items()):
        if payment_id not in actual and payment_id in micro_entries:
            continue
        if payment_id not in actual:
            unknown.append(payment_id)
            continue
        if payment_id in attended:
            continue
        compared += 1
        if actual[payment_id] != state:
            wrong.append(f"{payment_id} ({actual[payment_id]}, the processor says {state})")
    if wrong:
        report.add(
            CHECK,
            f"{len(wrong)} payment(s) in another state than the processor's events say",
            wrong,
        )
    if unknown:
        report.add(CHECK, f"{len(unknown)} processor event payment(s) unknown here", unknown)
    report.checked[CHECK] = {
        "payments": len(expected),
        "compared": compared,
        "with a person or in hand": len(expected) - compared - len(unknown),
    }
