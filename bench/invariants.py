"""The invariants an exactly-once payments pipeline must keep, checked against the database and
the processor's own record of what it charged and which callbacks it delivered.

``check_invariants(sandbox_stats=..., callbacks_sent=...)`` returns a ``Report``; ``python -m
bench.invariants`` prints it and exits 1 on any violation. The checks:

- ``charged_at_most_once``: the processor charged each idempotency key (and each payment) at
  most once, every charged key belongs to one of our payments, no payment it charged is
  recorded as rejected, and every confirmed payment was charged;
- ``event_applied_at_most_once``: each processor_event_id has at most one ``applied`` row in the
  event log, and the dedup record (ProcessedEvent) agrees with the log;
- ``transitions_valid``: replaying each payment's event log in order, every applied row starts
  where the previous one ended and is an allowed transition, every other row was written in the
  state the payment was in, a row marked stale really was stale, and the last state is the
  payment's state;
- ``ledger_matches_confirmed``: one credit per settled payment (confirmed, or returned after
  settlement) for its amount and merchant, no credit without confirmation, and each merchant's
  credits equal its settled total;
- ``returns_reversed``: every returned payment has exactly one reversal, for its amount and
  merchant; no reversal exists without a return; and so each merchant's ledger net (credits
  minus reversals) equals its confirmed total minus its returned total (checked as the
  reversals equal to the returned total, so a wrong credit fails the check above and a wrong
  reversal this one);
- ``callbacks_accounted``: every callback the processor delivered left a trace: applied, stale,
  dropped as duplicate, parked behind a hold, or in triage (dead letter or processing error), or
  (before the system has settled) started by a worker and not finished;
- ``dead_letters_have_history``: every dead letter carries its error history (ProcessingError
  rows for its message or the error its dead-letter envelope carries);
- ``dead_letters_have_error_rows``: every message SQS's RedrivePolicy moved to the DLQ (no
  dead-letter envelope of the worker's) has a ProcessingError row of its own: none got there
  through receives that did no work (a wait for the processor, a database outage);
- ``no_outage_dead_letters``: no dead letter whose only errors are processor-unavailability
  errors raised while the processor's circuit breaker was open (an outage is one incident, not
  a dead letter per payment).

Besides violations, the report lists notes: payments not in a final state and not in front of a
human, messages still unfinished, outbox rows unpublished. After a run has gone quiet these are
worth a look, but the processor may simply not have sent a final callback yet, so they are not
counted as violations.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

CHECKS = (
    "charged_at_most_once",
    "event_applied_at_most_once",
    "transitions_valid",
    "ledger_matches_confirmed",
    "returns_reversed",
    "callbacks_accounted",
    "dead_letters_have_history",
    "dead_letters_have_error_rows",
    "no_outage_dead_letters",
)
# Errors that say "the processor is unavailable", not "this message is wrong".
UNAVAILABILITY_ERRORS = (
    "payments.exceptions.ProcessorUnavailable",
    "payments.exceptions.ProcessorCircuitOpen",
)
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
# How many offending ids a violation lists before it summarises the rest.
MAX_IDS = 10


@dataclass(frozen=True)
class Violation:
    check: str
    detail: str
    ids: tuple[str, ...] = ()

    def __str__(self) -> str:
        return f"{self.check}: {self.detail}{_ids_suffix(self.ids)}"


@dataclass
class Report:
    violations: list[Violation] = field(default_factory=list)
    # check name -> what was checked (counts shown in the report)
    checked: dict[str, dict[str, Any]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def violations_of(self, check: str) -> list[Violation]:
        return [v for v in self.violations if v.check == check]

    def add(self, check: str, detail: str, ids: list[str] | tuple[str, ...] = ()) -> None:
        self.violations.append(Violation(check, detail, tuple(str(i) for i in ids)))

    def render(self) -> str:
        lines = ["invariant check"]
        for check in CHECKS:
            failed = self.violations_of(check)
            counts = ", ".join(f"{k} {v}" for k, v in self.checked.get(check, {}).items())
            status = "FAIL" if failed else "ok"
            lines.append(f"  {status:4} {check}: {counts}")
            for violation in failed:
                lines.append(f"         - {violation.detail}" + _ids_suffix(violation.ids))
        for note in self.notes:
            lines.append(f"  note {note}")
        verdict = "PASSED" if self.ok else f"FAILED ({len(self.violations)} violation(s))"
        lines.append(f"invariants {verdict}")
        return "\n".join(lines)

    def as_dict(self) -> dict:
        return {
            "ok": self.ok,
            "violations": [
                {"check": v.check, "detail": v.detail, "ids": list(v.ids)} for v in self.violations
            ],
            "checked": self.checked,
            "notes": self.notes,
        }


def _ids_suffix(ids: tuple[str, ...]) -> str:
    if not ids:
        return ""
    shown = ", ".join(ids[:MAX_IDS])
    more = f" (+{len(ids) - MAX_IDS} more)" if len(ids) > MAX_IDS else ""
    return f": {shown}{more}"


def check_invariants(*, sandbox_stats: dict, callbacks_sent: list | None) -> Report:
    """Check every invariant; ``callbacks_sent`` lists the callbacks the processor delivered
    (bodies with ``processor_event_id``, or the ids themselves). Without it, delivered callbacks
    are accounted for by count only, from ``sandbox_stats``."""
    report = Report()
    if callbacks_sent is None:
        callbacks_sent = sandbox_stats.get("callbacks_delivered")
    _check_charges(report, sandbox_stats)
    _check_events_applied_once(report)
    _check_transitions(report)
    _check_ledger(report)
    _check_returns_reversed(report)
    _check_callbacks(report, sandbox_stats, callbacks_sent)
    _check_dead_letters(report)
    _check_outage_dead_letters(report)
    _notes_unfinished(report)
    return report


# --- charged at most once --------------------------------------------------------------------


def _check_charges(report: Report, stats: dict) -> None:
    from payments.models import EventKind, EventOutcome, Payment, PaymentEvent, PaymentState

    check = "charged_at_most_once"
    charges = stats.get("charges")
    if not isinstance(charges, dict):
        report.add(check, "the processor's stats have no 'charges' map (idempotency key -> count)")
        return
    twice = sorted(key for key, count in charges.items() if int(count) > 1)
    if twice:
        report.add(
            check,
            f"{len(twice)} idempotency key(s) charged more than once "
            f"(counts {sorted({int(charges[k]) for k in twice})})",
            twice,
        )
    by_payment = stats.get("charges_by_payment") or {}
    payments_twice = sorted(pid for pid, count in by_payment.items() if int(count) > 1)
    if payments_twice:
        report.add(
            check,
            f"{len(payments_twice)} payment(s) charged more than once (under different keys)",
            payments_twice,
        )
    keys = {
        str(key): (str(pid), state)
        for pid, key, state in Payment.objects.values_list("id", "idempotency_key", "state")
    }
    unknown = sorted(key for key in charges if key not in keys)
    if unknown:
        report.add(check, f"{len(unknown)} charged key(s) belong to no payment", unknown)
    charged = {keys[key][0] for key, count in charges.items() if key in keys and int(count) > 0}
    # Money taken while we told the merchant the processor refused it, or credited without
    # having been taken: both leave the books wrong whatever the state machine says.
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
    report.checked[check] = {
        "keys charged": len(charges),
        "charges": sum(int(c) for c in charges.values()),
    }


# --- each processor event applied at most once -----------------------------------------------


def _check_events_applied_once(report: Report) -> None:
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


# --- transitions valid and in order ----------------------------------------------------------


def _check_transitions(report: Report) -> None:
    from payments.events import EVENT_TARGET_STATE, event_target_state
    from payments.models import STATE_RANK, EventKind, EventOutcome, Payment, PaymentEvent
    from payments.services import EVENT_TRANSITIONS, TRANSITIONS

    check = "transitions_valid"
    allowed = {(str(a), str(b)) for a, b in TRANSITIONS}
    allowed_by_event = {(str(a), str(b)) for a, b in EVENT_TRANSITIONS}
    problems: dict[str, list[str]] = defaultdict(list)  # problem -> payment ids
    states = dict(Payment.objects.values_list("id", "state"))
    rows = PaymentEvent.objects.order_by("payment_id", "id").values_list(
        "payment_id", "id", "kind", "outcome", "event_type", "from_state", "to_state"
    )
    replayed: dict = {}
    count = 0
    for payment_id, row_id, kind, outcome, event_type, from_state, to_state in rows.iterator(
        chunk_size=5000
    ):
        count += 1
        pid = str(payment_id)
        first = payment_id not in replayed
        current = replayed.get(payment_id)
        if first:
            if kind != EventKind.CREATED:
                problems["the log does not start with the creation row"].append(pid)
            elif to_state != "pending":
                problems[f"created in state {to_state!r}, not pending"].append(pid)
            replayed[payment_id] = to_state
            continue
        if kind == EventKind.CREATED:
            problems["a second creation row"].append(pid)
            continue
        if outcome == EventOutcome.APPLIED:
            if from_state != current:
                problems[
                    "an applied row starts in another state than the previous one ended "
                    "(out of order or lost update)"
                ].append(f"{pid} (row {row_id}: {from_state}->{to_state} after {current})")
            pair = (from_state, to_state)
            legal = allowed_by_event if kind == EventKind.PROCESSOR_EVENT else allowed
            if pair not in legal:
                problems["a transition the state machine does not allow"].append(
                    f"{pid} (row {row_id}: {from_state}->{to_state} by {kind} {event_type})"
                )
            replayed[payment_id] = to_state
            continue
        if from_state != current or to_state != current:
            problems[f"a {outcome} row written in another state than the payment was in"].append(
                f"{pid} (row {row_id}: {from_state}->{to_state} while {current})"
            )
        if kind == EventKind.PROCESSOR_EVENT and outcome == EventOutcome.STALE:
            target = (
                event_target_state(event_type, current)
                if event_type in EVENT_TARGET_STATE
                else None
            )
            if target is None or not (
                target == current or STATE_RANK[target] < STATE_RANK[current]
            ):
                problems[
                    "an event marked stale that was not behind the payment's state (dropped)"
                ].append(f"{pid} (row {row_id}: {event_type} while {current})")
    for payment_id, state in states.items():
        if payment_id not in replayed:
            problems["a payment with no event log"].append(str(payment_id))
        elif replayed[payment_id] != state:
            problems["the log ends in another state than the payment's"].append(
                f"{payment_id} (log {replayed[payment_id]}, payment {state})"
            )
    for problem, ids in problems.items():
        report.add(check, f"{len(ids)} x {problem}", ids)
    report.checked[check] = {"payments replayed": len(replayed), "log rows": count}


# --- ledger equals confirmed totals ----------------------------------------------------------


def _check_ledger(report: Report) -> None:
    from django.db.models import Sum

    from payments.models import (
        EventOutcome,
        LedgerEntry,
        LedgerEntryKind,
        Payment,
        PaymentEvent,
        PaymentState,
    )

    check = "ledger_matches_confirmed"
    settled_states = (PaymentState.CONFIRMED, PaymentState.RETURNED)
    payments = {p["id"]: p for p in Payment.objects.values("id", "state", "amount", "merchant_id")}
    confirmed_in_log = set(
        PaymentEvent.objects.filter(
            outcome=EventOutcome.APPLIED, to_state=PaymentState.CONFIRMED
        ).values_list("payment_id", flat=True)
    )
    entries = list(
        LedgerEntry.objects.filter(kind=LedgerEntryKind.CREDIT).values(
            "id", "payment_id", "merchant_id", "kind", "amount"
        )
    )
    credits_per_payment = Counter(e["payment_id"] for e in entries)
    unconfirmed, not_in_log, wrong_amount, wrong_merchant = [], [], [], []
    for entry in entries:
        payment = payments[entry["payment_id"]]
        pid = str(entry["payment_id"])
        if payment["state"] not in settled_states:
            unconfirmed.append(f"{pid} ({payment['state']})")
        elif entry["payment_id"] not in confirmed_in_log:
            not_in_log.append(pid)
        if entry["amount"] != payment["amount"]:
            wrong_amount.append(f"{pid} (credit {entry['amount']}, payment {payment['amount']})")
        if entry["merchant_id"] != payment["merchant_id"]:
            wrong_merchant.append(
                f"{pid} (credit to {entry['merchant_id']}, payment of {payment['merchant_id']})"
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
    settled = [pid for pid, p in payments.items() if p["state"] in settled_states]
    missing = sorted(str(pid) for pid in settled if credits_per_payment[pid] == 0)
    if missing:
        report.add(
            check, f"{len(missing)} confirmed (or returned) payment(s) without a credit", missing
        )
    several = sorted(str(pid) for pid, n in credits_per_payment.items() if n > 1)
    if several:
        report.add(check, f"{len(several)} payment(s) credited more than once", several)

    ledger = {
        row["merchant_id"]: row["total"]
        for row in LedgerEntry.objects.filter(kind=LedgerEntryKind.CREDIT)
        .values("merchant_id")
        .annotate(total=Sum("amount"))
    }
    # Every payment that settled, whether it was returned afterwards or not.
    expected = {
        row["merchant_id"]: row["total"]
        for row in Payment.objects.filter(state__in=settled_states)
        .values("merchant_id")
        .annotate(total=Sum("amount"))
    }
    off = sorted(
        f"{m} (credits {ledger.get(m, Decimal('0'))}, confirmed {expected.get(m, Decimal('0'))})"
        for m in set(ledger) | set(expected)
        if ledger.get(m, Decimal("0")) != expected.get(m, Decimal("0"))
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
        "credited total": str(sum(ledger.values(), Decimal("0"))),
    }


# --- every return reversed once, no reversal without a return --------------------------------


def _check_returns_reversed(report: Report) -> None:
    from django.db.models import Sum

    from payments.models import LedgerEntry, LedgerEntryKind, Payment, PaymentState

    check = "returns_reversed"
    payments = {p["id"]: p for p in Payment.objects.values("id", "state", "amount", "merchant_id")}
    reversals = list(
        LedgerEntry.objects.filter(kind=LedgerEntryKind.REVERSAL).values(
            "payment_id", "merchant_id", "amount"
        )
    )
    per_payment = Counter(r["payment_id"] for r in reversals)
    returned = [pid for pid, p in payments.items() if p["state"] == PaymentState.RETURNED]
    missing = sorted(str(pid) for pid in returned if per_payment[pid] == 0)
    if missing:
        report.add(check, f"{len(missing)} returned payment(s) without a reversal", missing)
    several = sorted(str(pid) for pid, n in per_payment.items() if n > 1)
    if several:
        report.add(check, f"{len(several)} payment(s) reversed more than once", several)
    orphans, wrong_amount, wrong_merchant = [], [], []
    for entry in reversals:
        payment = payments[entry["payment_id"]]
        pid = str(entry["payment_id"])
        if payment["state"] != PaymentState.RETURNED:
            orphans.append(f"{pid} ({payment['state']})")
        if entry["amount"] != -payment["amount"]:
            wrong_amount.append(f"{pid} (reversal {entry['amount']}, payment {payment['amount']})")
        if entry["merchant_id"] != payment["merchant_id"]:
            wrong_merchant.append(
                f"{pid} (reversal of {entry['merchant_id']}, payment of {payment['merchant_id']})"
            )
    if orphans:
        report.add(check, f"{len(orphans)} reversal(s) without a return", orphans)
    if wrong_amount:
        report.add(check, f"{len(wrong_amount)} reversal(s) for another amount", wrong_amount)
    if wrong_merchant:
        report.add(check, f"{len(wrong_merchant)} reversal(s) of another merchant", wrong_merchant)

    reversed_total = {
        row["merchant_id"]: -row["total"]
        for row in LedgerEntry.objects.filter(kind=LedgerEntryKind.REVERSAL)
        .values("merchant_id")
        .annotate(total=Sum("amount"))
    }
    returned_total = {
        row["merchant_id"]: row["total"]
        for row in Payment.objects.filter(state=PaymentState.RETURNED)
        .values("merchant_id")
        .annotate(total=Sum("amount"))
    }
    net = {
        row["merchant_id"]: row["total"]
        for row in LedgerEntry.objects.values("merchant_id").annotate(total=Sum("amount"))
    }
    zero = Decimal("0")
    off = sorted(
        f"{m} (ledger net {net.get(m, zero)}, reversals {reversed_total.get(m, zero)}, "
        f"returned {returned_total.get(m, zero)})"
        for m in set(reversed_total) | set(returned_total)
        if reversed_total.get(m, zero) != returned_total.get(m, zero)
    )
    if off:
        report.add(
            check,
            f"{len(off)} merchant(s) whose ledger net differs from confirmed total - returned "
            "total: their reversals do not add up to their returned payments",
            off,
        )
    report.checked[check] = {
        "returned": len(returned),
        "reversals": len(reversals),
        "reversed total": str(sum(reversed_total.values(), zero)),
        "ledger net": str(sum(net.values(), zero)),
    }


# --- every delivered callback accounted for --------------------------------------------------


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


def _check_callbacks(report: Report, stats: dict, callbacks_sent: list | None) -> None:
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


# --- every dead letter with its error history ------------------------------------------------


def _moved_by_worker(letter: dict) -> bool:
    """The worker moved it (its dead-letter envelope names the error), not SQS's RedrivePolicy."""
    from callbacks.services import DEAD_LETTER_KEY

    body = letter["body"]
    envelope = body.get(DEAD_LETTER_KEY) if isinstance(body, dict) else None
    return isinstance(envelope, dict) and bool(envelope.get("error") or envelope.get("error_class"))


def _check_dead_letters(report: Report) -> None:
    from callbacks.models import ProcessingError
    from triage.models import DeadLetter

    check = "dead_letters_have_history"
    letters = list(
        DeadLetter.objects.values(
            "id",
            "original_message_id",
            "body",
            "source",
            "last_error_class",
            "last_error_message",
        )
    )
    errors = Counter(
        ProcessingError.objects.filter(
            message_id__in=[d["original_message_id"] for d in letters]
        ).values_list("message_id", flat=True)
    )
    bare = []
    with_rows = 0
    for letter in letters:
        has_envelope = _moved_by_worker(letter)
        if errors[letter["original_message_id"]]:
            with_rows += 1
        elif not (has_envelope or letter["last_error_class"] or letter["last_error_message"]):
            bare.append(f"{letter['id']} (message {letter['original_message_id']})")
    if bare:
        report.add(
            check,
            f"{len(bare)} dead letter(s) without any error history (no ProcessingError rows, no "
            "error in the envelope)",
            bare,
        )
    report.checked[check] = {"dead letters": len(letters), "with error rows": with_rows}
    # A message on the DLQ without an error row of its own was moved there by SQS's
    # RedrivePolicy after receives that did no work (a wait, an outage), not for its failures.
    rowless = [
        f"{letter['id']} (message {letter['original_message_id']})"
        for letter in letters
        if not errors[letter["original_message_id"]] and letter["source"] == "redrive_policy"
    ]
    if rowless:
        report.add(
            "dead_letters_have_error_rows",
            f"{len(rowless)} dead letter(s) with no ProcessingError row of their own: moved to "
            "the DLQ by receives, not by failures",
            rowless,
        )
    report.checked["dead_letters_have_error_rows"] = {"dead letters": len(letters)}


# --- no dead letter for a processor outage ----------------------------------------------------


def breaker_open_intervals() -> list[tuple[Any, Any]]:
    """(opened, closed) pairs from the breaker's history; ``closed`` is None while still open."""
    from payments.models import BreakerTransitionKind, CircuitBreakerTransition

    intervals: list[tuple[Any, Any]] = []
    opened = None
    for kind, at in CircuitBreakerTransition.objects.order_by("id").values_list(
        "kind", "created_at"
    ):
        # A reopening after a close (within the incident's cool-down) opens it again too.
        opening = (BreakerTransitionKind.OPENED, BreakerTransitionKind.REOPENED)
        if kind in opening and opened is None:
            opened = at
        elif kind == BreakerTransitionKind.CLOSED and opened is not None:
            intervals.append((opened, at))
            opened = None
    if opened is not None:
        intervals.append((opened, None))
    return intervals


def _check_outage_dead_letters(report: Report) -> None:
    from callbacks.models import ProcessingError, QueueMessage, QueueMessageStatus
    from triage.models import DeadLetter

    check = "no_outage_dead_letters"
    intervals = breaker_open_intervals()
    dead = set(
        QueueMessage.objects.filter(status=QueueMessageStatus.DEAD_LETTERED)
        .exclude(outcome="redrive_policy")
        .values_list("message_id", flat=True)
    )
    dead |= set(DeadLetter.objects.values_list("original_message_id", flat=True))
    errors: dict[str, list[tuple[str, Any]]] = defaultdict(list)
    for message_id, error_class, at in ProcessingError.objects.filter(
        message_id__in=dead
    ).values_list("message_id", "error_class", "created_at"):
        errors[message_id].append((error_class, at))

    def while_open(at) -> bool:
        return any(start <= at and (end is None or at < end) for start, end in intervals)

    outage_only = sorted(
        message_id
        for message_id, rows in errors.items()
        if all(cls in UNAVAILABILITY_ERRORS and while_open(at) for cls, at in rows)
    )
    if outage_only:
        report.add(
            check,
            f"{len(outage_only)} dead letter(s) whose only errors are processor-unavailability "
            "errors raised while the processor's breaker was open",
            outage_only,
        )
    report.checked[check] = {
        "dead letters": len(dead),
        "breaker incidents": len(intervals),
    }


# --- notes: what is still moving or stuck ----------------------------------------------------


def _notes_unfinished(report: Report) -> None:
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
            + _ids_suffix(tuple(unattended))
        )


# --- command line ----------------------------------------------------------------------------


def _load_json(source: str) -> Any:
    if source.startswith(("http://", "https://")):
        import requests

        response = requests.get(source, timeout=10)
        response.raise_for_status()
        return response.json()
    return json.loads(Path(source).read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.invariants",
        description="Check the pipeline's invariants against the database (DATABASE_URL) and "
        "the processor's record; exit 1 on any violation. Reads only the database: "
        "DJANGO_SETTINGS_MODULE=config.settings.test spares setting the processor and signing "
        "secrets.",
    )
    parser.add_argument(
        "--sandbox-stats",
        required=True,
        help="the sandbox's stats: its URL (http://127.0.0.1:PORT/_sandbox/stats) or a JSON file",
    )
    parser.add_argument(
        "--callbacks-sent",
        help="JSON file listing the callbacks the processor delivered (bodies or event ids); "
        "without it they are accounted for by count",
    )
    parser.add_argument("--json", help="also write the report as JSON to this file")
    args = parser.parse_args(argv)

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.base")
    import django

    django.setup()
    try:
        stats = _load_json(args.sandbox_stats)
        sent = _load_json(args.callbacks_sent) if args.callbacks_sent else None
    except (OSError, ValueError) as exc:
        parser.error(f"cannot read the processor's record: {exc}")
    report = check_invariants(sandbox_stats=stats, callbacks_sent=sent)
    print(report.render())
    if args.json:
        Path(args.json).write_text(json.dumps(report.as_dict(), indent=2, default=str))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
