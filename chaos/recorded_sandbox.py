"""The sandbox processor of a chaos run, which also keeps the record the invariant checker needs.

It is the same ``SandboxProcessor`` that ``manage.py run_sandbox_processor`` runs (faults from
the ``SANDBOX_*`` environment, see ``sandbox/faults.py``). The difference: on SIGTERM it
writes a JSON file with its final stats, every callback it delivered (payment id, event type,
processor event id, amount), every one it dropped on purpose and every debit it took (its
account, class and arrival), because ``GET /_sandbox/stats``
counts them but does not list them, and "every callback the processor sent is accounted for"
(and "every one it dropped was recovered") is checked by event id and payload.

    python -m chaos.recorded_sandbox --port 8701 --callback-url URL --seed 7 --record FILE
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from pathlib import Path

# What the record keeps of each event the processor made.
EVENT_FIELDS = ("payment_id", "event_type", "processor_event_id", "amount", "timestamp")
# What the record keeps of each debit the processor took.
DEBIT_FIELDS = (
    "idempotency_key", "payment_id", "source_token", "sec_code", "company_entry_description",
    "received_at",
)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos.recorded_sandbox")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--callback-url", required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--record", type=Path, required=True, help="JSON file written on exit")
    parser.add_argument("--callback-max-attempts", type=int, default=10)
    parser.add_argument("--callback-backoff-seconds", type=float, default=0.5)
    args = parser.parse_args(argv)

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.base")
    import django

    django.setup()
    from callbacks import conf as callbacks_conf
    from payments import conf as payments_conf
    from sandbox import FaultConfig, SandboxProcessor

    sandbox = SandboxProcessor(
        host="127.0.0.1",
        port=args.port,
        api_key=payments_conf.PROCESSOR_API_KEY,
        callback_url=args.callback_url,
        signing_secret=callbacks_conf.CALLBACK_SIGNING_SECRETS[0],
        faults=FaultConfig.from_env(),
        seed=args.seed,
        callback_max_attempts=args.callback_max_attempts,
        callback_backoff_seconds=args.callback_backoff_seconds,
    ).start()
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    print(f"LISTENING {sandbox.port}", flush=True)
    print(f"sandbox faults {sandbox.plan.config} seed {args.seed}", flush=True)
    while not stop.wait(0.5):
        pass
    sandbox.stop()
    assert sandbox.callbacks is not None
    delivered = [
        {
            "payment_id": item["body"].get("payment_id"),
            "event_type": item["body"].get("event_type"),
            "processor_event_id": item["body"].get("processor_event_id"),
            "amount": item["body"].get("amount"),
            "timestamp": item["body"].get("timestamp"),
        }
        for item in list(sandbox.callbacks.delivered)
    ]
    record = {
        "stats": sandbox.stats(),
        "delivered": delivered,
        "dropped": sandbox.drops.dropped(),
        # Every event the processor made, delivered, dropped or given up alike: its own list
        # (the events API's), which the final states are read from.
        "events": [{key: body.get(key) for key in EVENT_FIELDS} for body in sandbox.events_made()],
        # Every debit it took, with its account, class, description and the moment its first
        # call arrived: whether a WEB debit reached it before its account was validated.
        "debits": [
            {key: debit.get(key) for key in DEBIT_FIELDS} for debit in sandbox.transfers_made()
        ],
    }
    tmp = args.record.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    tmp.replace(args.record)
    print(
        f"stopped: {len(delivered)} callbacks delivered, {len(record['dropped'])} dropped, "
        f"record in {args.record}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
