"""Dead letters: each carries its error history, none was made by receives alone, and none is
only the echo of a processor outage the circuit breaker already turned into one incident."""

from collections import Counter, defaultdict
from typing import Any

from chaos.invariants.report import Report

# Errors that say "the processor is unavailable", not "this message is wrong".
UNAVAILABILITY_ERRORS = (
    "payments.exceptions.ProcessorUnavailable",
    "payments.exceptions.ProcessorCircuitOpen",
)


def _moved_by_worker(letter: dict) -> bool:
    """The worker moved it (its dead-letter envelope names the error), not SQS's RedrivePolicy."""
    from callbacks.services import DEAD_LETTER_KEY

    body = letter["body"]
    envelope = body.get(DEAD_LETTER_KEY) if isinstance(body, dict) else None
    return isinstance(envelope, dict) and bool(envelope.get("error") or envelope.get("error_class"))


def check_dead_letters(report: Report) -> None:
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


def check_outage_dead_letters(report: Report) -> None:
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
