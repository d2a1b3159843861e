"""Processor callbacks and queue messages for the benchmark: one ``settled`` event per payment,
each with its own ``processor_event_id`` (repeats would be dropped by the queue's deduplication
and make the run cheaper than reality)."""

import json
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

from payments import signing

AMOUNT = Decimal("125.00")


@dataclass(frozen=True)
class Callback:
    payment_id: str
    processor_event_id: str
    body: bytes

    def signature(self, secrets: Iterable[str], *, timestamp: int | None = None) -> str:
        return signing.sign(self.body, secrets, timestamp=timestamp)


def event_id(run: str, n: int) -> str:
    return f"evt_bench_{run}_{n}"


def settled_callback(
    payment_id: str, processor_event_id: str, amount: Decimal = AMOUNT
) -> Callback:
    """A ``settled`` callback body as the processor sends it (see
    docs/security/callback-edge.md)."""
    body = {
        "payment_id": payment_id,
        "event_type": "settled",
        "processor_event_id": processor_event_id,
        "amount": f"{amount:.2f}",
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    return Callback(payment_id, processor_event_id, json.dumps(body).encode())


def callbacks_for(payment_ids: Iterable[str], run: str) -> Iterator[Callback]:
    for n, payment_id in enumerate(payment_ids):
        yield settled_callback(payment_id, event_id(run, n))


def write_signed_pool(path: Path, count: int, secrets: list[str], run: str) -> int:
    """Write ``count`` signed callbacks, one ``<signature>\\t<body>`` line each, for wrk's Lua
    script. All share one timestamp taken now: the file is good for the endpoint's replay
    tolerance (300 s by default) from this moment. Payments need not exist: the endpoint does
    not read the database."""
    timestamp = int(time.time())
    with path.open("w") as out:
        for callback in callbacks_for((str(uuid.uuid4()) for _ in range(count)), run):
            out.write(f"{callback.signature(secrets, timestamp=timestamp)}\t")
            out.write(callback.body.decode())
            out.write("\n")
    return timestamp
