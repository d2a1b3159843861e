"""The worker baselines, each a process reading the same kind of queue as ``run_sqs_worker``:

- ``noop``: receive up to 10, delete them in one batch, no other work: the queue's own ceiling;
- ``plainsql``: the database work of applying a ``settled`` event written as plain psycopg
  SQL, one transaction per message (lock the payment row, insert the dedup and event rows,
  update the state, insert the ledger row), then the batch delete;
- ``batchedsql``: the same statements, batched the way the product's worker batches: one
  transaction for each received batch of up to 10, then one batch delete. The floor the
  product's worker is compared with.

All stop at the first empty receive and print one JSON line: how many messages they finished,
when (wall clock) the first and last batch was done, and the CPU seconds their PostgreSQL
backend used (read from ``/proc`` when the server runs on this machine, else null).

    python -m bench.consumers noop|plainsql|batchedsql --endpoint-url URL --queue-url URL \
        [--database-url URL]
"""

import argparse
import hashlib
import json
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import boto3
import psycopg
from botocore.config import Config

# The payment row as the product's worker sees it for a ``settled`` event.
LOCK_PAYMENT = (
    "SELECT state, amount, merchant_id, currency FROM payments_payment WHERE id = %s FOR UPDATE"
)
INSERT_PROCESSED = (
    "INSERT INTO payments_processedevent "
    "(processor_event_id, payment_id, event_type, payload_hash, outcome, processed_at) "
    "VALUES (%s, %s, %s, %s, 'applied', now())"
)
INSERT_EVENT = (
    "INSERT INTO payments_paymentevent (payment_id, kind, outcome, event_type, "
    "processor_event_id, from_state, to_state, payload, caused_by, created_at) "
    "VALUES (%s, 'processor_event', 'applied', %s, %s, 'submitted', 'confirmed', %s, %s, now())"
)
UPDATE_PAYMENT = (
    "UPDATE payments_payment SET state = 'confirmed', state_changed_at = now(), "
    "updated_at = now() WHERE id = %s"
)
INSERT_LEDGER = (
    "INSERT INTO payments_ledgerentry (payment_id, merchant_id, kind, amount, currency, "
    "created_at) VALUES (%s, %s, 'credit', %s, %s, now())"
)


SQL_KINDS = ("plainsql", "batchedsql")


class PlainSqlError(Exception):
    """The event cannot be applied by the plain path (the benchmark only feeds it good ones)."""


def fingerprint(body: dict) -> str:
    """The same hash as ``payments.events.ProcessorEvent.fingerprint``, without Django."""
    timestamp = datetime.fromisoformat(body["timestamp"]).astimezone(UTC).isoformat()
    canonical = json.dumps(
        {
            "payment_id": body["payment_id"],
            "event_type": body["event_type"],
            "amount": body["amount"],
            "timestamp": timestamp,
            "reason_code": body.get("reason_code") or "",
        },
        sort_keys=True,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def apply_settled(conn: psycopg.Connection, envelope: dict, message_id: str) -> None:
    """Apply one ``settled`` event (nested in its queue envelope) in its own transaction, in
    plain SQL."""
    with conn.transaction():
        _settled_statements(conn, envelope, message_id)


def apply_settled_batch(conn: psycopg.Connection, messages: list[dict]) -> None:
    """Apply a received batch of ``settled`` events in one transaction, as the product's
    worker commits once per batch."""
    with conn.transaction():
        for message in messages:
            _settled_statements(conn, json.loads(message["Body"]), message["MessageId"])


def _settled_statements(conn: psycopg.Connection, envelope: dict, message_id: str) -> None:
    """The statements of one event, inside the caller's transaction."""
    body = envelope["event"]
    payment_id = body["payment_id"]
    row = conn.execute(LOCK_PAYMENT, (payment_id,)).fetchone()
    if row is None:
        raise PlainSqlError(f"payment {payment_id} does not exist")
    state, amount, merchant_id, currency = row
    if state != "submitted" or f"{amount:.2f}" != body["amount"]:
        raise PlainSqlError(f"payment {payment_id} is {state} for {amount}")
    event_id = body["processor_event_id"]
    conn.execute(INSERT_PROCESSED, (event_id, payment_id, body["event_type"], fingerprint(body)))
    conn.execute(
        INSERT_EVENT,
        (payment_id, body["event_type"], event_id, json.dumps(body), f"sqs:{message_id}"),
    )
    conn.execute(UPDATE_PAYMENT, (payment_id,))
    conn.execute(INSERT_LEDGER, (payment_id, merchant_id, amount, currency))


def backend_cpu_seconds(conn: psycopg.Connection) -> float | None:
    """User + system CPU seconds the connection's PostgreSQL backend has used, when that
    backend runs on this machine (its ``/proc`` entry readable); None otherwise."""
    pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None
    if "postgres" not in comm:  # another server's process with the same number
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def consume(kind: str, *, endpoint_url: str, queue_url: str, database_url: str | None) -> dict:
    client = boto3.client(
        "sqs",
        endpoint_url=endpoint_url,
        region_name="us-east-1",
        config=Config(retries={"max_attempts": 2, "mode": "standard"}),
    )
    conn = psycopg.connect(database_url, autocommit=True) if kind in SQL_KINDS else None
    count, first_done, last_done = 0, None, None
    started = time.time()
    while True:
        response = client.receive_message(
            QueueUrl=queue_url,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=1,
            VisibilityTimeout=30,
            AttributeNames=["All"],
        )
        messages = response.get("Messages") or []
        if not messages:
            break
        if kind == "batchedsql":
            apply_settled_batch(conn, messages)
        elif conn is not None:
            for message in messages:
                apply_settled(conn, json.loads(message["Body"]), message["MessageId"])
        deleted = client.delete_message_batch(
            QueueUrl=queue_url,
            Entries=[
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)
            ],
        )
        if deleted.get("Failed"):
            raise RuntimeError(f"delete failed: {deleted['Failed']}")
        count += len(messages)
        last_done = time.time()
        if first_done is None:
            first_done = last_done
    backend_cpu = None
    if conn is not None:
        backend_cpu = backend_cpu_seconds(conn)
        conn.close()
    return {
        "kind": kind,
        "backend_cpu_seconds": backend_cpu,
        "count": count,
        "started": started,
        "finished": time.time(),
        "first_done": first_done,
        "last_done": last_done,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=["noop", *SQL_KINDS])
    parser.add_argument("--endpoint-url", required=True)
    parser.add_argument("--queue-url", required=True)
    parser.add_argument("--database-url")
    args = parser.parse_args(argv)
    if args.kind in SQL_KINDS and not args.database_url:
        parser.error(f"{args.kind} needs --database-url")
    result = consume(
        args.kind,
        endpoint_url=args.endpoint_url,
        queue_url=args.queue_url,
        database_url=args.database_url,
    )
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
