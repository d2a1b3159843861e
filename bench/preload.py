"""A history of settled payments written by ``COPY``, as their life would have left it: payment,
three event-log rows, a dedup record, a ledger credit and two queue-message records each, with
random-looking ids and timestamps spread over a span, so the worker and the purges can be
measured on top of months of rows."""

import hashlib
import io
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import psycopg

from bench import events
from bench.options import log
from bench.storage import pipeline_tables

COPY_CHUNK = 20_000


def _uuid(seed: str, n: int) -> str:
    """A random-looking UUID (spread over the index as uuid4s are) that each COPY pass can
    recompute, so no pass keeps millions of ids in memory."""
    h = hashlib.md5(f"{seed}:{n}".encode(), usedforsecurity=False).hexdigest()
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-a{h[17:20]}-{h[20:32]}"


def _copy(conn: psycopg.Connection, table: str, columns: str, rows: Iterator[str]) -> int:
    """COPY text-format lines (tab-separated, ``\\N`` for null) into ``table``."""
    count = 0
    with conn.cursor() as cur, cur.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
        buffer = io.StringIO()
        for line in rows:
            buffer.write(line)
            count += 1
            if count % COPY_CHUNK == 0:
                copy.write(buffer.getvalue())
                buffer = io.StringIO()
        copy.write(buffer.getvalue())
    return count


@dataclass(frozen=True)
class Life:
    """When payment ``n`` of the history was created, submitted and settled (epoch seconds)."""

    start: float
    step: float

    def created(self, n: int) -> float:
        return self.start + n * self.step

    @staticmethod
    def ts(epoch: float) -> str:
        return datetime.fromtimestamp(epoch, UTC).isoformat()


SETTLE_AFTER = 86_400.0  # ACH settles the next day
SUBMIT_AFTER = 2.0


def _payments(count: int, life: Life) -> Iterator[str]:
    for n in range(count):
        created = life.created(n)
        settled = Life.ts(created + SETTLE_AFTER)
        yield (
            f"{_uuid('p', n)}\tmerchant-{n % 50}\t{events.AMOUNT}\tUSD\ttok_hist_{n:09d}\t\t"
            f"{_uuid('k', n)}\tconfirmed\tproc_{n}\t{Life.ts(created)}\t{settled}\t{settled}\n"
        )


def _event_id(n: int) -> str:
    return f"evt_{_uuid('e', n).replace('-', '')[:24]}"


def _payment_events(count: int, life: Life) -> Iterator[str]:
    """The three rows of a settled payment's life: created, submitted, settled."""
    for n in range(count):
        payment, created = _uuid("p", n), life.created(n)
        event = _event_id(n)
        yield (
            f"{payment}\tcreated\tapplied\t\t\t\tpending\t"
            f'{{"amount": "{events.AMOUNT}", "merchant_id": "merchant-{n % 50}"}}\t'
            f"api:bench\t{Life.ts(created)}\n"
        )
        yield (
            f"{payment}\tsubmission\tapplied\t\t\tpending\tsubmitted\t"
            f'{{"processor_id": "proc_{n}", "http_status": 201}}\t'
            f"sqs:{_uuid('m', 2 * n)}\t{Life.ts(created + SUBMIT_AFTER)}\n"
        )
        settled = Life.ts(created + SETTLE_AFTER)
        yield (
            f"{payment}\tprocessor_event\tapplied\tsettled\t{event}\tsubmitted\tconfirmed\t"
            f'{{"amount": "{events.AMOUNT}", "event_type": "settled", "payment_id": "{payment}", '
            f'"timestamp": "{settled}", "processor_event_id": "{event}"}}\t'
            f"sqs:{_uuid('m', 2 * n + 1)}\t{settled}\n"
        )


def _processed_events(count: int, life: Life) -> Iterator[str]:
    for n in range(count):
        fingerprint = hashlib.sha256(_event_id(n).encode()).hexdigest()
        settled = Life.ts(life.created(n) + SETTLE_AFTER)
        yield f"{_event_id(n)}\t{_uuid('p', n)}\tsettled\t{fingerprint}\tapplied\t{settled}\n"


def _ledger(count: int, life: Life) -> Iterator[str]:
    for n in range(count):
        settled = Life.ts(life.created(n) + SETTLE_AFTER)
        yield f"{_uuid('p', n)}\tmerchant-{n % 50}\tcredit\t{events.AMOUNT}\tUSD\t{settled}\n"


def _queue_messages(count: int, life: Life) -> Iterator[str]:
    """Two finished messages per payment: its submission and its settled event."""
    for n in range(count):
        payment, created = _uuid("p", n), life.created(n)
        submit, settle = Life.ts(created + SUBMIT_AFTER), Life.ts(created + SETTLE_AFTER)
        event = _event_id(n)
        bodies = (
            (
                "submit_payment",
                f"outbox-{n + 1}",
                f'{{"kind": "submit_payment", "payment_id": "{payment}", '
                f'"outbox_id": {n + 1}, "enqueued_at": "{Life.ts(created)}"}}',
                submit,
                "submitted",
            ),
            (
                "processor_event",
                event,
                f'{{"kind": "processor_event", "event": {{"amount": "{events.AMOUNT}", '
                f'"event_type": "settled", "payment_id": "{payment}", "timestamp": "{settle}", '
                f'"processor_event_id": "{event}"}}, "received_at": "{settle}"}}',
                settle,
                "applied",
            ),
        )
        for k, (kind, dedup, body, when, outcome) in enumerate(bodies):
            sequence = str(10**19 + 2 * n + k).zfill(40)
            yield (
                f"{_uuid('m', 2 * n + k)}\t{kind}\t{payment}\t{payment}\t{dedup}\t{sequence}\t"
                f"{body}\t\t{when}\t{when}\t{when}\t1\tdone\t{outcome}\t{when}\t\t{when}\n"
            )


HISTORY_TABLES = (
    (
        "payments_payment",
        "id, merchant_id, amount, currency, source_token, description, idempotency_key, "
        "state, processor_id, created_at, updated_at, state_changed_at",
        _payments,
    ),
    (
        "payments_paymentevent",
        "payment_id, kind, outcome, event_type, processor_event_id, from_state, to_state, "
        "payload, caused_by, created_at",
        _payment_events,
    ),
    (
        "payments_processedevent",
        "processor_event_id, payment_id, event_type, payload_hash, outcome, processed_at",
        _processed_events,
    ),
    (
        "payments_ledgerentry",
        "payment_id, merchant_id, kind, amount, currency, created_at",
        _ledger,
    ),
    (
        "callbacks_queuemessage",
        "message_id, kind, group_id, payment_id, deduplication_id, sequence_number, body, "
        "raw_body, enqueued_at, first_started_at, last_started_at, attempts, status, outcome, "
        "finished_at, last_error_class, updated_at",
        _queue_messages,
    ),
)


def history_preload(db_url: str, count: int, span: timedelta) -> dict:
    """Empty the pipeline's tables and COPY ``count`` settled payments' history into them,
    created evenly over ``span`` up to a day ago; then VACUUM ANALYZE (what autovacuum would
    have done over those months, so it does not run in the middle of the measurements)."""
    life = Life(
        start=time.time() - span.total_seconds(),
        step=(span.total_seconds() - SETTLE_AFTER) / count,
    )
    result: dict = {"payments": count, "span_days": span / timedelta(days=1), "tables": {}}
    started = time.time()
    with psycopg.connect(db_url, autocommit=True) as conn:
        tables = pipeline_tables(conn)
        # The rows are consistent by construction; checking every foreign key row by row would
        # triple the preload's time and prove nothing. Replica mode also lets the reset past
        # the history guard (payments.history): maintenance of the bench's own database.
        conn.execute("SET session_replication_role = replica")
        conn.execute(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE")
        for table, columns, rows in HISTORY_TABLES:
            began = time.time()
            written = _copy(conn, table, columns, rows(count, life))
            seconds = time.time() - began
            result["tables"][table] = {"rows": written, "copy_seconds": round(seconds, 1)}
            log(f"history: {written} rows into {table} in {seconds:.0f} s")
        conn.execute("SET session_replication_role = DEFAULT")
        result["copy_seconds"] = round(time.time() - started, 1)
        began = time.time()
        for table, _, _ in HISTORY_TABLES:
            conn.execute(f"VACUUM (ANALYZE) {table}")
        result["vacuum_analyze_seconds"] = round(time.time() - began, 1)
    result["seconds"] = round(time.time() - started, 1)
    return result


def index_sizes(db_url: str) -> dict:
    """Each pipeline table's heap and every index's size (bytes), largest tables first."""
    sizes: dict = {}
    with psycopg.connect(db_url) as conn:
        for table, _, _ in HISTORY_TABLES:
            heap, total = conn.execute(
                "SELECT pg_relation_size(%s), pg_total_relation_size(%s)", (table, table)
            ).fetchone()
            rows = conn.execute(
                "SELECT indexrelname, pg_relation_size(indexrelid) FROM pg_stat_user_indexes "
                "WHERE relname = %s ORDER BY 2 DESC",
                (table,),
            ).fetchall()
            sizes[table] = {"heap": heap, "total": total, "indexes": dict(rows)}
    return sizes


def history_payments_add(db_url: str, count: int) -> list[str]:
    """``count`` new submitted payments beside the history (nothing is emptied), each waiting
    for its ``settled`` event; returns their ids."""
    ids = [str(uuid.uuid4()) for _ in range(count)]
    now = Life.ts(time.time())
    tag = uuid.uuid4().hex[:8]
    lines = (
        f"{payment_id}\tmerchant-{n % 50}\t{events.AMOUNT}\tUSD\ttok_run_{tag}_{n}\t\t"
        f"{uuid.uuid4()}\tsubmitted\tproc_{tag}_{n}\t{now}\t{now}\t{now}\n"
        for n, payment_id in enumerate(ids)
    )
    with psycopg.connect(db_url, autocommit=True) as conn:
        _copy(conn, "payments_payment", HISTORY_TABLES[0][1], lines)
    return ids
