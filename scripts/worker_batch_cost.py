"""What a batch of the queue worker costs, statement by statement: a fixed-size drain, in process.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/<any> .venv/bin/python \\
        scripts/worker_batch_cost.py [--messages 500] [--rounds 3] [--database NAME]

It starts the local SQS server (fauxqs) on a free loopback port and a database of its own on
DATABASE_URL's server (``--database``, created afresh, migrated, dropped at the end). Each round
creates ``--messages`` submitted payments, publishes one ``settled`` event for each (one message
group per payment, as the callback endpoint does), and drains them with the product's
``Worker`` in this process: receive, ``process_batch``, until a receive comes back empty. What
it reports per round and as the median over the rounds:

- the drain's CPU (this process: ``time.process_time``) and wall time per message;
- per kind of statement (the start record, the row locks, the return-rate days' lock, the
  event's rows, the done mark, savepoints, the others), timed by a Django execute wrapper: how
  many per batch, the CPU and wall time per message, and whether they ran inside a transaction;
- the commits (``connection.commit``) and the SQS calls (receive, delete), the same way.

The SQS server and PostgreSQL run in processes of their own: their CPU is not this figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from collections import defaultdict
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# What each kind of statement starts with (or holds), in the order they are tried.
KINDS = (
    ("start record", 'INSERT INTO "callbacks_queuemessage"'),
    ("done mark", 'UPDATE "callbacks_queuemessage" SET status'),
    # The batch's: the payments with their rows, then their merchants' return-rate days.
    ("row locks (the batch's, with the rows and days; an event's own)", "FOR NO KEY UPDATE"),
    ("event rows", "WITH claim AS"),  # before the days' lock: its statement adds to a day
    ("return-rate days lock", 'INSERT INTO "payments_merchantreturnday"'),
    ("savepoint", "SAVEPOINT"),
    ("savepoint", "RELEASE SAVEPOINT"),
    ("unfinished starts (suspects)", 'FROM "callbacks_queuemessage"'),
)


class Meter:
    """CPU and wall time of each kind of work, and how much of it ran in a transaction."""

    def __init__(self) -> None:
        self.count: dict[str, int] = defaultdict(int)
        self.cpu: dict[str, float] = defaultdict(float)
        self.wall: dict[str, float] = defaultdict(float)
        self.in_transaction: dict[str, int] = defaultdict(int)
        self.others: dict[str, int] = defaultdict(int)

    def timed(self, kind: str, call, *args, in_transaction: bool = False, **kwargs):
        cpu, wall = time.process_time(), time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            self.cpu[kind] += time.process_time() - cpu
            self.wall[kind] += time.perf_counter() - wall
            self.count[kind] += 1
            self.in_transaction[kind] += in_transaction

    def statement(self, execute, sql, params, many, context):
        from django.db import connection

        kind = next((name for name, marker in KINDS if marker in sql), "other statements")
        if kind == "other statements":
            self.others[sql[:90]] += 1
        return self.timed(
            kind, execute, sql, params, many, context, in_transaction=connection.in_atomic_block
        )


def database_urls(name: str) -> tuple[str, str]:
    """(the server's ``postgres`` database, the run's own) on DATABASE_URL's server."""
    base = urlsplit(os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"))
    return (
        urlunsplit(base._replace(path="/postgres")),
        urlunsplit(base._replace(path=f"/{name}")),
    )


def database_recreate(admin_url: str, name: str, *, drop_only: bool = False) -> None:
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if not drop_only:
            conn.execute(f'CREATE DATABASE "{name}"')


def publish_settlements(count: int) -> None:
    """``count`` submitted payments, each with one ``settled`` event on the queue."""
    from callbacks import sqs
    from callbacks.schema import event_deduplication_id, processor_event_message
    from payments.models import PaymentState
    from tests.factories import PaymentFactory, processor_event

    client, url = sqs.sqs_client(), sqs.main_queue_url()
    payments = PaymentFactory.create_batch(count, state=PaymentState.SUBMITTED)
    for start in range(0, count, 10):
        entries = []
        for i, payment in enumerate(payments[start : start + 10]):
            event = processor_event(payment, "settled")
            entries.append(
                {
                    "Id": str(i),
                    "MessageBody": json.dumps(processor_event_message(event)),
                    "MessageGroupId": str(payment.id),
                    "MessageDeduplicationId": event_deduplication_id(event),
                }
            )
        response = client.send_message_batch(QueueUrl=url, Entries=entries)
        assert not response.get("Failed"), response["Failed"]


def drain(messages: int) -> dict:
    """Drain the queue with the product's worker in this process; the round's figures."""
    from django.db import connection

    from callbacks import sqs
    from callbacks.worker import Worker
    from callbacks.worker import batch as worker_batch

    meter = Meter()
    worker = Worker(wait_time=0, relay=False, linger=0)
    receive, delete = sqs.receive_messages, sqs.delete_messages
    start, complete = worker_batch.queue_messages_start_batch, worker_batch.queue_messages_complete
    commit = connection.commit
    sqs.receive_messages = lambda **kw: meter.timed("SQS receive", receive, **kw)
    sqs.delete_messages = lambda **kw: meter.timed("SQS delete", delete, **kw)
    # The services whole (the rows' values built in Python, then the statement).
    worker_batch.queue_messages_start_batch = lambda **kw: meter.timed(
        "start record, whole service", start, **kw
    )
    worker_batch.queue_messages_complete = lambda **kw: meter.timed(
        "done mark, whole service", complete, **kw
    )
    connection.commit = lambda: meter.timed("commit", commit)
    batches = 0
    try:
        with worker.running(), connection.execute_wrapper(meter.statement):
            cpu, wall = time.process_time(), time.perf_counter()
            while batch := worker.receive():
                batches += 1
                worker.process_batch(batch)
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    finally:
        sqs.receive_messages, sqs.delete_messages = receive, delete
        worker_batch.queue_messages_start_batch = start
        worker_batch.queue_messages_complete = complete
        del connection.commit
    handled = worker.stats.processed
    assert handled == messages and worker.stats.outcomes == {"applied": messages}, worker.stats
    parts = {
        kind: {
            "per_batch": round(meter.count[kind] / batches, 2),
            "cpu_ms_per_message": round(1000 * meter.cpu[kind] / handled, 4),
            "wall_ms_per_message": round(1000 * meter.wall[kind] / handled, 4),
        }
        for kind in sorted(meter.count)
    }
    statements = 0
    for kind in meter.count:
        if kind in {name for name, _ in KINDS} or kind == "other statements":
            statements += meter.count[kind]
            parts[kind]["in_transaction"] = f"{meter.in_transaction[kind]}/{meter.count[kind]}"
    return {
        "messages": handled,
        "batches": batches,
        "cpu_ms_per_message": round(1000 * cpu / handled, 4),
        "wall_ms_per_message": round(1000 * wall / handled, 4),
        "statements_per_batch": round(statements / batches, 2),
        "parts": parts,
        "other_statements": dict(meter.others),
    }


def median_of(rounds: list[dict]) -> dict:
    def med(values):
        return round(statistics.median(values), 4)

    kinds = sorted({k for r in rounds for k in r["parts"]})
    return {
        "cpu_ms_per_message": med([r["cpu_ms_per_message"] for r in rounds]),
        "wall_ms_per_message": med([r["wall_ms_per_message"] for r in rounds]),
        "statements_per_batch": med([r["statements_per_batch"] for r in rounds]),
        "parts": {
            kind: {
                field: med([r["parts"][kind][field] for r in rounds if kind in r["parts"]])
                for field in ("per_batch", "cpu_ms_per_message", "wall_ms_per_message")
            }
            for kind in kinds
        },
    }


def run_environment(database: str, *, queue_prefix: str):
    """A measuring run's parts: its own database (created afresh on DATABASE_URL's server), the
    local SQS server on a free loopback port, and the environment Django reads them from.
    Returns the server's admin database URL (to drop the run's at the end) and the SQS server."""
    from tests.localsqs import LocalSqs, aws_test_environment

    admin_url, url = database_urls(database)
    database_recreate(admin_url, database)
    aws_test_environment()
    server = LocalSqs().start()
    suffix = uuid.uuid4().hex[:8]
    os.environ.update(
        DJANGO_SETTINGS_MODULE="config.settings.test",
        DATABASE_URL=url,
        SQS_ENDPOINT_URL=server.endpoint_url,
        SQS_QUEUE_NAME=f"{queue_prefix}-{suffix}.fifo",
        SQS_DLQ_NAME=f"{queue_prefix}-dlq-{suffix}.fifo",
    )
    return admin_url, server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--database", default="worker_batch_cost")
    options = parser.parse_args()

    admin_url, server = run_environment(options.database, queue_prefix="cost")
    try:
        import django

        django.setup()
        import logging

        from django.core.management import call_command

        from callbacks.queues import queues_ensure

        # One log line per message is part of the worker's cost; where it goes is not.
        logging.getLogger().handlers = [logging.StreamHandler(open(os.devnull, "w"))]  # noqa: SIM115
        call_command("migrate", verbosity=0)
        queues_ensure(visibility_timeout=30)
        rounds = []
        for _ in range(options.rounds):
            publish_settlements(options.messages)
            rounds.append(drain(options.messages))
        print(json.dumps({"median": median_of(rounds), "rounds": rounds}, indent=1))
    finally:
        server.stop()
        from django.db import connections

        connections.close_all()
        database_recreate(admin_url, options.database, drop_only=True)


if __name__ == "__main__":
    main()
