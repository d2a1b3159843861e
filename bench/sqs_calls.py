"""The CPU one SQS call costs this process: ``python -m bench.sqs_calls [rounds]``.

Starts the local SQS server, then times, in CPU seconds of this process alone (the server's
are its own), the three calls the pipeline makes most: a ``SendMessageBatch`` of ten, a
``ReceiveMessage`` of ten with every attribute, and a ``DeleteMessageBatch`` of ten, each
through the gateway's own functions (``callbacks.sqs``). Each variant of the client runs in
rounds that alternate with the others', and the median round is reported:

- ``validated``: the gateway's client with botocore's parameter check on (as it was);
- ``gateway``: the client as the gateway builds it.

With ``awscrt`` importable, botocore signs with it instead; run once with and once without
(``BOTO_DISABLE_CRT=true``) to compare. docs/benchmarks.md has the figures and what each
change was worth.
"""

import os
import statistics
import sys
import time
import uuid

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
os.environ.setdefault("DATABASE_URL", "sqlite:///:memory:")

import django  # noqa: E402

django.setup()

from botocore.compat import HAS_CRT  # noqa: E402

from callbacks import conf as callbacks_conf  # noqa: E402
from callbacks import sqs  # noqa: E402
from tests.localsqs import LocalSqs, aws_test_environment  # noqa: E402

CALLS = 150
BODY = {
    "kind": "processor_event",
    "event": {
        "event_type": "settled",
        "processor_event_id": "evt_0123456789",
        "amount": "10.00",
        "timestamp": "2026-01-01T00:00:00+00:00",
    },
}


def one_cycle(url: str) -> tuple[float, float, float]:
    """CPU seconds of one send, one receive and one delete, ten messages each."""
    messages = [
        sqs.OutgoingMessage(
            body={**BODY, "payment_id": str(uuid.uuid4())},
            group_id=str(uuid.uuid4()),
            deduplication_id=uuid.uuid4().hex,
        )
        for _ in range(10)
    ]
    t0 = time.process_time()
    sqs.send_messages_each_now(messages, url=url)
    t1 = time.process_time()
    received = sqs.receive_messages(url=url, max_messages=10, wait_seconds=0, visibility_timeout=30)
    t2 = time.process_time()
    sqs.delete_messages(url=url, messages=received)
    t3 = time.process_time()
    return t1 - t0, t2 - t1, t3 - t2


base_config = sqs._CONFIG


def use_client(validated: bool) -> None:
    sqs.reset()
    sqs._CONFIG = base_config.merge(sqs.Config(parameter_validation=validated))


def main(rounds: int = 5) -> None:
    aws_test_environment()
    server = LocalSqs().start()
    try:
        callbacks_conf.SQS_ENDPOINT_URL = server.endpoint_url
        sqs.reset()
        url = sqs.queue_create(
            name=f"bench-calls-{uuid.uuid4().hex[:8]}.fifo",
            attributes={
                "FifoQueue": "true",
                "DeduplicationScope": "messageGroup",
                "FifoThroughputLimit": "perMessageGroupId",
            },
        )
        variants = {"validated": True, "gateway": False}
        figures: dict[str, list[tuple[float, float, float]]] = {name: [] for name in variants}
        for validated in variants.values():  # warm-up: connections, caches, imports
            use_client(validated)
            for _ in range(30):
                one_cycle(url)
        for _ in range(rounds):
            for name, validated in variants.items():
                use_client(validated)
                cycles = [one_cycle(url) for _ in range(CALLS)]
                figures[name].append(tuple(sum(c[i] for c in cycles) / CALLS for i in range(3)))
        print(f"CPU ms per call, median of {rounds} rounds of {CALLS}; awscrt signing: {HAS_CRT}")
        print(f"{'client':<12} {'send 10':>9} {'receive 10':>11} {'delete 10':>10}")
        for name, rows in figures.items():
            medians = [statistics.median(r[i] for r in rows) * 1000 for i in range(3)]
            print(f"{name:<12} {medians[0]:>9.3f} {medians[1]:>11.3f} {medians[2]:>10.3f}")
    finally:
        sqs._CONFIG = base_config
        sqs.reset()
        server.stop()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
