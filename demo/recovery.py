"""Callbacks the processor never delivers, and their recovery by the pull of its events.

During the traffic the sandbox drops a share of the payments' callbacks on purpose
(``POST /_sandbox/drops``): the processor gave up on them, as a real one does after its retries.
Beat runs ``callbacks.tasks.processor_events_pull`` every minute, which reads them back from the
processor's events API and queues them as their callbacks would have been. The check: every
dropped callback reached the worker (applied, stale or a duplicate in the event log), and how long
after the event each took.
"""

import statistics
import time
from datetime import datetime

import requests

# A share of each payment's callbacks (its lifecycle's: submitted, settled, returned) dropped
# during the traffic; turned off before the lifecycle and dishonor scenarios, which wait on
# their own callbacks.
DROP_SHARE = 0.05
DROPPED_TYPES = ["submitted", "settled", "returned"]


def drops_start(sandbox_url: str, share: float = DROP_SHARE) -> None:
    response = requests.post(
        f"{sandbox_url}/_sandbox/drops",
        json={"share": share, "event_types": DROPPED_TYPES},
        timeout=5,
    )
    response.raise_for_status()


def drops_stop(sandbox_url: str) -> list[dict]:
    """Stop dropping; every callback dropped so far."""
    response = requests.post(f"{sandbox_url}/_sandbox/drops", json={"share": 0}, timeout=5)
    response.raise_for_status()
    return response.json()["dropped"]


def _recovered_at(dropped: list[dict]) -> dict[str, datetime]:
    from payments.models import ProcessedEvent

    ids = [d["processor_event_id"] for d in dropped]
    return dict(
        ProcessedEvent.objects.filter(processor_event_id__in=ids).values_list(
            "processor_event_id", "processed_at"
        )
    )


def wait_for_recovery(dropped: list[dict], timeout: float = 180) -> dict[str, datetime]:
    """Until every dropped callback has reached the worker (beat pulls every minute)."""
    deadline = time.monotonic() + timeout
    recovered = _recovered_at(dropped)
    while len(recovered) < len(dropped) and time.monotonic() < deadline:
        time.sleep(2)
        recovered = _recovered_at(dropped)
    return recovered


def recovery_report(sandbox_url: str, timeout: float = 180) -> tuple[list, list]:
    """(summary rows, checks) of the dropped callbacks' recovery, once every one reached the
    worker or after ``timeout`` seconds."""
    from callbacks.models import ProcessorEventsCursor

    dropped = drops_stop(sandbox_url)
    recovered = wait_for_recovery(dropped, timeout)
    delays = sorted(
        (recovered[d["processor_event_id"]].timestamp() - d["dropped_at"])
        for d in dropped
        if d["processor_event_id"] in recovered
    )
    cursor = ProcessorEventsCursor.objects.first()
    rows = [
        (
            "callbacks the processor never delivered",
            f"{len(dropped)} ({', '.join(sorted({d['event_type'] for d in dropped})) or 'none'})",
        ),
        ("  recovered by the events pull", len(recovered)),
        (
            "  time from drop to the worker",
            f"median {statistics.median(delays):.0f} s, max {delays[-1]:.0f} s"
            if delays
            else "n/a",
        ),
        (
            "events pulled (new / already applied)",
            f"{cursor.events_pulled} ({cursor.events_new} / {cursor.events_known})"
            if cursor
            else "the pull never ran",
        ),
    ]
    checks = [
        (
            f"every callback the processor dropped was recovered by the events pull "
            f"({len(recovered)} of {len(dropped)})",
            len(recovered) == len(dropped),
        )
    ]
    return rows, checks
