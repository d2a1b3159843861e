"""The CPU one SQS call costs this process: ``python -m bench.sqs_calls [rounds]``.

Starts the local SQS server, then times, in CPU seconds of this process alone (the server's
are its own), the three calls the pipeline makes most: a ``SendMessageBatch`` of ten, a
``ReceiveMessage`` of ten with every attribute, and a ``DeleteMessageBatch`` of ten, each
through the gateway's own functions (``callbacks.sqs``). Each variant of the client runs in
rounds that alternate with the others' (each round starting at another variant), and the median
round is reported. The variants are the steps of issue 41, each on top of the one before:

- ``validated``: the gateway's client with botocore's parameter check on (as it was);
- ``gateway``: the client as the gateway builds it (the check off);
- ``no-hooks``: and botocore's per-call handlers that do nothing for SQS unregistered (the
  idempotency token and checksum-mode members SQS has none of, the recursion-detection header
  outside Lambda, the API-version header of other services, the retry-information headers);
  signing, the retry handlers, the SQS error-code translation and the User-Agent stay;
- ``no-ua-rebuild``: and the second build of the User-Agent per request unregistered (it is
  built once per call before; the rebuild only adds what the request used);
- ``crt``: the gateway's client signing with ``awscrt`` (AWS's C runtime), when it is
  importable (``PYTHONPATH`` to a directory it is installed in): botocore then signs with it by
  default, and the other variants here sign with botocore's own signer again.

docs/benchmarks.md has the figures and what each step was worth.
"""

import os
import statistics
import sys
import time
import uuid
from dataclasses import dataclass

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
os.environ.setdefault("DATABASE_URL", "sqlite:///:memory:")

import django  # noqa: E402

django.setup()

import botocore  # noqa: E402
import botocore.auth  # noqa: E402
import botocore.handlers  # noqa: E402
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

# botocore's handlers that run on every SQS call and do nothing for it (botocore.handlers'
# BUILTIN_HANDLERS, registered on every client's events under these names).
UNNEEDED_HANDLERS = [
    ("before-parameter-build", botocore.handlers.generate_idempotent_uuid),
    ("before-parameter-build", botocore.handlers._handle_request_validation_mode_member),
    ("before-call", botocore.handlers.add_recursion_detection_header),
    ("before-call", botocore.handlers.inject_api_version_header_if_needed),
    ("request-created", botocore.handlers.add_retry_headers),
]


@dataclass(frozen=True)
class Variant:
    validated: bool = False
    hooks: bool = True
    ua_rebuild: bool = True
    crt: bool = False


VARIANTS = {
    "validated": Variant(validated=True),
    "gateway": Variant(),
    "no-hooks": Variant(hooks=False),
    "no-ua-rebuild": Variant(hooks=False, ua_rebuild=False),
    **({"crt": Variant(crt=True)} if HAS_CRT else {}),
}

base_config = sqs._CONFIG
# The signers botocore chose at import (the CRT's when awscrt is importable) and its own.
SIGNERS = dict(botocore.auth.AUTH_TYPE_MAPS)
PYTHON_SIGNERS = {
    "v4": botocore.auth.SigV4Auth,
    "v4-query": botocore.auth.SigV4QueryAuth,
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


def use_client(variant: Variant) -> None:
    """Make the gateway build its client as ``variant`` says (a new client, warm after the
    first calls: its connection pool and botocore's caches are per client)."""
    sqs.reset()
    sqs._CONFIG = base_config.merge(sqs.Config(parameter_validation=variant.validated))
    botocore.auth.AUTH_TYPE_MAPS.update(SIGNERS if variant.crt else PYTHON_SIGNERS)
    events = sqs.sqs_client().meta.events
    if not variant.hooks:
        for event, handler in UNNEEDED_HANDLERS:
            events.unregister(event, handler)
    if not variant.ua_rebuild:
        client = sqs.sqs_client()
        events.unregister(
            f"request-created.{client.meta.service_model.service_id.hyphenize()}",
            client._user_agent_creator.rebuild_and_replace_user_agent_handler,
        )


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
        figures: dict[str, list[tuple[float, float, float]]] = {name: [] for name in VARIANTS}
        for variant in VARIANTS.values():  # warm-up: connections, caches, imports
            use_client(variant)
            for _ in range(30):
                one_cycle(url)
        names = list(VARIANTS)
        for round_ in range(rounds):
            # Each round starts at another variant: none always runs right after the same one.
            for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
                variant = VARIANTS[name]
                use_client(variant)
                for _ in range(10):  # the new client's connection and caches
                    one_cycle(url)
                cycles = [one_cycle(url) for _ in range(CALLS)]
                figures[name].append(tuple(sum(c[i] for c in cycles) / CALLS for i in range(3)))
        crt = f"awscrt {__import__('awscrt').__version__}" if HAS_CRT else "awscrt not importable"
        print(
            f"CPU ms per call, median of {rounds} rounds of {CALLS}; botocore "
            f"{botocore.__version__}, {crt}"
        )
        print(f"{'client':<14} {'send 10':>9} {'receive 10':>11} {'delete 10':>10}")
        for name, rows in figures.items():
            medians = [statistics.median(r[i] for r in rows) * 1000 for i in range(3)]
            print(f"{name:<14} {medians[0]:>9.3f} {medians[1]:>11.3f} {medians[2]:>10.3f}")
    finally:
        sqs._CONFIG = base_config
        botocore.auth.AUTH_TYPE_MAPS.update(SIGNERS)
        sqs.reset()
        server.stop()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
