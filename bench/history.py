"""``BENCH_PHASES=history`` and ``BENCH_PHASES=storage``: does a row cost the same when the
tables already hold months of history, what does an event cost on disk, and what do the
retention purges cost while the worker runs.

history
    1. the worker on an empty database (reused from the worker phase when it ran);
    2. a preload of ``BENCH_HISTORY_PAYMENTS`` settled payments with everything their life wrote
       (payment events, dedup records, queue-message records, ledger rows) by ``COPY``, with
       timestamps spread over 1.2 x the queue-message retention, so a sixth of it is past
       retention; then ANALYZE and the index sizes;
    3. the worker again (1 and 2 processes, same N) on top of it: events/s and CPU ms per event
       against step 1 (goal: within 15 %);
    4. the worker once more (2 processes) while the dedup and queue-message purges run: the
       purges' own rate (rows/s) and the worker's rate beside them;
    5. the partitioning experiment: batched DELETE of N rows against detaching and dropping the
       partitions that hold them.

storage
    One worker run on an empty database, then every pipeline table's on-disk size (heap,
    indexes, TOAST) per event applied, per day at the seeds' volume, and at steady state under
    the retention settings. ``storage_markdown`` prints it as the table in docs/benchmarks.md.
"""

import hashlib
import io
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import psycopg

from bench import events

DAILY_MESSAGES = 4_200_000  # the seeds' volume
COPY_CHUNK = 20_000


@dataclass
class WorkerRuns:
    """What bench/run.py lends this module: its worker run, its config, its problem list."""

    run: Callable[..., dict]  # run(processes, *, prepare=None, during=None, tag="") -> result
    config: dict
    problems: list[str]


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


# --- what each table keeps ------------------------------------------------------------------------

# Table -> (app conf module, retention setting); None: kept by design (the money history) or
# not growing with traffic.
RETENTION: dict[str, tuple[str, str] | None] = {
    "payments_payment": None,
    "payments_paymentevent": None,
    "payments_processorattempt": None,
    "payments_ledgerentry": None,
    "payments_paymentreturn": None,
    "payments_merchantreturnday": None,
    "payments_processedevent": ("payments", "PROCESSED_EVENT_RETENTION"),
    "payments_outboxmessage": ("payments", "OUTBOX_RETENTION"),
    "payments_apiidempotencykey": ("payments", "API_IDEMPOTENCY_RETENTION"),
    "payments_circuitbreakertransition": ("payments", "BREAKER_TRANSITION_RETENTION"),
    "callbacks_queuemessage": ("callbacks", "QUEUE_MESSAGE_RETENTION"),
    "callbacks_processingerror": ("callbacks", "QUEUE_ERROR_RETENTION"),
    "callbacks_paymenthold": ("callbacks", "HOLD_RETENTION"),
    "callbacks_parkedmessage": ("callbacks", "HOLD_RETENTION"),
    "triage_alert": ("triage", "ALERT_RETENTION"),
    "triage_alertnotification": ("triage", "ALERT_RETENTION"),
    "triage_bulktriagejobitem": ("triage", "BULK_JOB_RETENTION"),
}


def retention_of(table: str) -> timedelta | None:
    entry = RETENTION.get(table)
    if entry is None:
        return None
    import importlib

    app, name = entry
    return getattr(importlib.import_module(f"{app}.conf"), name)


def _pipeline_tables(conn: psycopg.Connection) -> list[str]:
    return [
        row[0]
        for row in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND "
            "(tablename LIKE 'payments\\_%%' OR tablename LIKE 'callbacks\\_%%' "
            "OR tablename LIKE 'triage\\_%%') ORDER BY tablename"
        )
    ]


# Rows per merchant per day, not per event: a day's volume does not scale them.
NOT_PER_EVENT = {"payments_merchantreturnday"}


def storage_report(db_url: str, events_applied: int) -> dict:
    """Bytes per event of every pipeline table that holds rows, per day at DAILY_MESSAGES, and
    at steady state (a retained table holds ``retention`` days of them; a kept one grows by a
    day's worth every day, given here per year)."""
    tables = {}
    with psycopg.connect(db_url, autocommit=True) as conn:
        for table in _pipeline_tables(conn):
            rows = conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]  # noqa: S608
            if not rows or table in NOT_PER_EVENT:
                continue
            total, heap, indexes = conn.execute(
                "SELECT pg_total_relation_size(%s), pg_relation_size(%s), pg_indexes_size(%s)",
                (table, table, table),
            ).fetchone()
            per_event = total / events_applied
            per_day = per_event * DAILY_MESSAGES
            retention = retention_of(table)
            tables[table] = {
                "rows_per_event": round(rows / events_applied, 3),
                "bytes_per_event": round(per_event, 1),
                "heap_bytes_per_event": round(heap / events_applied, 1),
                "index_bytes_per_event": round(indexes / events_applied, 1),
                "gb_per_day": round(per_day / 1e9, 2),
                "retention_days": None if retention is None else retention / timedelta(days=1),
                "steady_state_gb": None
                if retention is None
                else round(per_day * (retention / timedelta(days=1)) / 1e9, 1),
                "gb_per_year_kept": round(per_day * 365 / 1e9, 0) if retention is None else None,
            }
    total = sum(t["bytes_per_event"] for t in tables.values())
    return {
        "events": events_applied,
        "daily_messages": DAILY_MESSAGES,
        "tables": tables,
        "total_bytes_per_event": round(total, 1),
        "total_gb_per_day": round(total * DAILY_MESSAGES / 1e9, 2),
        "retained_steady_state_gb": round(
            sum(t["steady_state_gb"] or 0 for t in tables.values()), 1
        ),
        "kept_gb_per_year": round(sum(t["gb_per_year_kept"] or 0 for t in tables.values()), 0),
    }


def storage_markdown(report: dict) -> str:
    """The storage report as the table docs/benchmarks.md shows."""
    lines = [
        f"{report['events']} events applied; {report['daily_messages']:,} messages a day.",
        "",
        "| table | rows/event | bytes/event (heap + indexes) | GB/day | retention | steady state |",
        "|---|---:|---:|---:|---|---:|",
    ]
    for table, t in report["tables"].items():
        if t["retention_days"] is None:
            keep, steady = "kept", f"+{t['gb_per_year_kept']:.0f} GB/year"
        else:
            keep, steady = f"{t['retention_days']:g} d", f"{t['steady_state_gb']} GB"
        lines.append(
            f"| {table} | {t['rows_per_event']} | {t['bytes_per_event']:.0f} "
            f"({t['heap_bytes_per_event']:.0f} + {t['index_bytes_per_event']:.0f}) | "
            f"{t['gb_per_day']} | {keep} | {steady} |"
        )
    lines.append(
        f"| **total** | | **{report['total_bytes_per_event']:.0f}** | "
        f"**{report['total_gb_per_day']}** | | {report['retained_steady_state_gb']} GB retained "
        f"+ {report['kept_gb_per_year']:.0f} GB/year kept |"
    )
    return "\n".join(lines)


def storage_phase(stack, runs: WorkerRuns) -> dict:
    result = runs.run(1, tag="storage1")
    report = storage_report(stack.database_url, result["done"])
    log("storage after one worker run:\n" + storage_markdown(report))
    return {"worker": result, **report, "markdown": storage_markdown(report)}


# --- the preload ----------------------------------------------------------------------------------


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
        tables = _pipeline_tables(conn)
        conn.execute(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE")
        # The rows are consistent by construction; checking every foreign key row by row would
        # triple the preload's time and prove nothing.
        conn.execute("SET session_replication_role = replica")
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


# --- the purges beside the worker -----------------------------------------------------------------


@dataclass
class PurgeRun:
    """The dedup and queue-message purges, run in a thread beside the worker."""

    rows: dict[str, int] | None = None
    seconds: dict[str, float] | None = None

    def __call__(self) -> None:
        from django.db import connection

        from callbacks.services import queue_messages_purge
        from payments.services import processed_events_purge

        self.rows, self.seconds = {}, {}
        try:
            for table, purge in (
                ("payments_processedevent", processed_events_purge),
                ("callbacks_queuemessage", queue_messages_purge),
            ):
                began = time.time()
                self.rows[table] = purge()
                self.seconds[table] = round(time.time() - began, 2)
        finally:
            connection.close()

    def summary(self) -> dict:
        rows, seconds = self.rows or {}, self.seconds or {}
        total, took = sum(rows.values()), sum(seconds.values())
        return {
            "rows": rows,
            "seconds": seconds,
            "rows_per_second": {
                t: round(rows[t] / seconds[t]) if seconds.get(t) else None for t in rows
            },
            "total_rows_per_second": round(total / took) if took else None,
        }


def _cost(result: dict) -> dict:
    return {
        "events_per_second": result["rate"],
        "cpu_ms_per_event": result["consumer_cpu_ms_per_event"],
    }


def _versus(loaded: dict, empty: dict) -> dict:
    rate, cpu = loaded["events_per_second"], loaded["cpu_ms_per_event"]
    return {
        **loaded,
        "rate_vs_empty": round(rate / empty["events_per_second"], 3)
        if rate and empty["events_per_second"]
        else None,
        "cpu_vs_empty": round(cpu / empty["cpu_ms_per_event"], 3)
        if empty["cpu_ms_per_event"]
        else None,
    }


def history_phase(stack, runs: WorkerRuns, *, empty: dict | None = None) -> dict:
    """See the module docstring; ``empty`` is the worker phase's report when it ran."""
    from callbacks import conf as callbacks_conf

    count = runs.config["history_payments"]
    report: dict = {"events_per_run": runs.config["payments"]}
    empty_runs = {}
    for processes in (1, 2):
        reused = (empty or {}).get("runs", {}).get(f"worker_{processes}")
        empty_runs[processes] = reused or runs.run(processes, tag=f"empty{processes}")
    report["empty"] = {str(p): _cost(r) for p, r in empty_runs.items()}

    span = callbacks_conf.QUEUE_MESSAGE_RETENTION * 1.2  # a sixth of it past retention
    log(f"history: preloading {count} payments over {span.days} days")
    report["preload"] = history_preload(stack.database_url, count, span)
    log(f"history: preload took {report['preload']['seconds']:.0f} s")
    report["sizes_after_preload"] = index_sizes(stack.database_url)

    report["partitioning"] = partition_experiment(stack.database_url, runs.config["partition_rows"])
    loaded = {}
    for processes in (1, 2):
        result = runs.run(processes, prepare=history_payments_add, tag=f"history{processes}")
        loaded[str(processes)] = _versus(_cost(result), report["empty"][str(processes)])
    report["loaded"] = loaded

    purge = PurgeRun()
    result = runs.run(2, prepare=history_payments_add, during=purge, tag="history2-purging")
    report["loaded_while_purging"] = {
        **_versus(_cost(result), report["empty"]["2"]),
        "worker_wall_seconds": round(result["wall_seconds"], 1),
        "purge": purge.summary(),
    }
    report["loaded_while_purging"]["rate_vs_loaded"] = (
        round(result["rate"] / loaded["2"]["events_per_second"], 3)
        if result["rate"] and loaded["2"]["events_per_second"]
        else None
    )
    for processes, figures in loaded.items():
        if figures["rate_vs_empty"] is not None and figures["rate_vs_empty"] < 0.85:
            runs.problems.append(
                f"history: {processes} process(es) run at {figures['rate_vs_empty']:.0%} of the "
                "empty-database rate (goal: within 15 %)"
            )
    report["markdown"] = history_markdown(report)
    log("history:\n" + report["markdown"])
    return report


# --- partitioning: batched DELETE against dropping a partition ------------------------------------


def partition_experiment(db_url: str, rows: int) -> dict:
    """Copy ``rows`` queue-message records (the preloaded ones, oldest first) into a plain table
    and a table partitioned by day of ``first_started_at``, both with the product's indexes; then
    remove everything past QUEUE_MESSAGE_RETENTION from each: the plain one by the purge's
    batched DELETE (1000 ids a transaction), the partitioned one by detaching and dropping the
    partitions wholly past it. Reports both rates and the plain table's VACUUM afterwards."""
    from callbacks import conf as callbacks_conf

    cutoff = datetime.now(UTC) - callbacks_conf.QUEUE_MESSAGE_RETENTION
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS bench_qm_plain, bench_qm_parted")
        conn.execute("CREATE TABLE bench_qm_plain (LIKE callbacks_queuemessage INCLUDING ALL)")
        conn.execute(
            "INSERT INTO bench_qm_plain SELECT * FROM callbacks_queuemessage ORDER BY id LIMIT %s",
            (rows,),
        )
        first, last = conn.execute(
            "SELECT min(first_started_at), max(first_started_at) FROM bench_qm_plain"
        ).fetchone()
        _parted_create(conn, first, last)
        conn.execute("INSERT INTO bench_qm_parted SELECT * FROM bench_qm_plain")
        conn.execute("VACUUM (ANALYZE) bench_qm_plain")
        conn.execute("VACUUM (ANALYZE) bench_qm_parted")
        plain = _plain_purge(conn, cutoff)
        parted = _parted_purge(conn, cutoff)
        conn.execute("DROP TABLE bench_qm_plain, bench_qm_parted")
    return {
        "rows_copied": rows,
        "cutoff": cutoff.isoformat(),
        "plain": plain,
        "partitioned": parted,
    }


def _parted_create(conn: psycopg.Connection, first: datetime, last: datetime) -> None:
    conn.execute(
        "CREATE TABLE bench_qm_parted (LIKE callbacks_queuemessage INCLUDING DEFAULTS) "
        "PARTITION BY RANGE (first_started_at)"
    )
    # By first_started_at, which is never empty (finished_at is, while a message runs). A unique
    # key must hold the partition key: message_id alone cannot be unique across partitions.
    conn.execute("ALTER TABLE bench_qm_parted ADD PRIMARY KEY (id, first_started_at)")
    conn.execute("CREATE UNIQUE INDEX ON bench_qm_parted (message_id, first_started_at)")
    for columns in (
        "status, enqueued_at",
        "group_id, status",
        "group_id, sequence_number",
        "payment_id",
    ):
        conn.execute(f"CREATE INDEX ON bench_qm_parted ({columns})")
    day = datetime(first.year, first.month, first.day, tzinfo=UTC)
    while day <= last:
        after = day + timedelta(days=1)
        conn.execute(
            f"CREATE TABLE bench_qm_p{day:%Y%m%d} PARTITION OF bench_qm_parted "
            f"FOR VALUES FROM ('{day.isoformat()}') TO ('{after.isoformat()}')"
        )
        day = after
    # No DEFAULT partition: it would forbid DETACH ... CONCURRENTLY. Production would create
    # each day's partition ahead of time instead.


def _plain_purge(conn: psycopg.Connection, cutoff: datetime) -> dict:
    began, deleted = time.time(), 0
    while True:
        n = conn.execute(
            "DELETE FROM bench_qm_plain WHERE id IN (SELECT id FROM bench_qm_plain "
            "WHERE finished_at < %s ORDER BY id LIMIT 1000)",
            (cutoff,),
        ).rowcount
        deleted += n
        if n < 1000:
            break
    seconds = time.time() - began
    began = time.time()
    conn.execute("VACUUM bench_qm_plain")
    return {
        "rows": deleted,
        "seconds": round(seconds, 2),
        "rows_per_second": round(deleted / seconds) if seconds else None,
        "vacuum_seconds": round(time.time() - began, 2),
    }


def _parted_purge(conn: psycopg.Connection, cutoff: datetime) -> dict:
    partitions = conn.execute(
        "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
        "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'bench_qm_parted'::regclass "
        "ORDER BY c.relname"
    ).fetchall()
    # Which partitions lie wholly past the cutoff, and their rows, counted for the report before
    # the clock starts (a real purge knows by the partitions' bounds alone).
    expired = []
    for name, _bound in partitions:
        newest, rows = conn.execute(
            f"SELECT max(finished_at), count(*) FROM {name}"  # noqa: S608
        ).fetchone()
        if newest is not None and newest < cutoff:
            expired.append((name, rows))
    began = time.time()
    for name, _ in expired:
        conn.execute(f"ALTER TABLE bench_qm_parted DETACH PARTITION {name} CONCURRENTLY")
        conn.execute(f"DROP TABLE {name}")
    deleted, dropped = sum(rows for _, rows in expired), len(expired)
    seconds = time.time() - began
    return {
        "rows": deleted,
        "partitions_dropped": dropped,
        "seconds": round(seconds, 2),
        "rows_per_second": round(deleted / seconds) if seconds else None,
    }


def history_markdown(report: dict) -> str:
    """The history phase's figures as docs/benchmarks.md shows them."""
    mb = 1024 * 1024
    preload = report["preload"]
    lines = [
        f"Preload: {preload['payments']:,} payments over {preload['span_days']:g} days, "
        f"{sum(t['rows'] for t in preload['tables'].values()):,} rows by COPY in "
        f"{preload['copy_seconds']:.0f} s, then VACUUM (ANALYZE) in "
        f"{preload['vacuum_analyze_seconds']:.0f} s.",
        "",
        "| worker, N events | empty: events/s, CPU ms/event | on the history | rate vs empty "
        "| CPU vs empty |",
        "|---|---:|---:|---:|---:|",
    ]
    for processes, loaded in report["loaded"].items():
        empty = report["empty"][processes]
        lines.append(
            f"| {processes} process(es), {report['events_per_run']} | "
            f"{empty['events_per_second']:.0f}, {empty['cpu_ms_per_event']:.2f} | "
            f"{loaded['events_per_second']:.0f}, {loaded['cpu_ms_per_event']:.2f} | "
            f"{loaded['rate_vs_empty']} | {loaded['cpu_vs_empty']} |"
        )
    purging = report["loaded_while_purging"]
    purge = purging["purge"]
    lines += [
        "",
        f"Beside the purges (2 processes): {purging['events_per_second']:.0f} events/s, "
        f"{purging['cpu_ms_per_event']:.2f} CPU ms/event ({purging['rate_vs_loaded']} of the "
        f"rate on the history without them); the worker ran {purging['worker_wall_seconds']} s.",
        "",
        "| purge | rows | seconds | rows/s |",
        "|---|---:|---:|---:|",
    ]
    for table, rows in purge["rows"].items():
        lines.append(
            f"| {table} | {rows:,} | {purge['seconds'][table]} | "
            f"{purge['rows_per_second'][table]:,} |"
        )
    lines += ["", "| table | heap MB | index | MB |", "|---|---:|---|---:|"]
    for table, sizes in report["sizes_after_preload"].items():
        first = True
        for index, size in sizes["indexes"].items():
            heap = f"{sizes['heap'] / mb:,.0f}" if first else ""
            lines.append(f"| {table if first else ''} | {heap} | {index} | {size / mb:,.0f} |")
            first = False
    parts = report["partitioning"]
    plain, parted = parts["plain"], parts["partitioned"]
    lines += [
        "",
        f"Partitioning, {parts['rows_copied']:,} queue-message records: batched DELETE of "
        f"{plain['rows']:,} rows in {plain['seconds']} s ({plain['rows_per_second']:,} rows/s), "
        f"then VACUUM {plain['vacuum_seconds']} s; DETACH CONCURRENTLY + DROP of "
        f"{parted['partitions_dropped']} daily partitions ({parted['rows']:,} rows) in "
        f"{parted['seconds']} s.",
    ]
    return "\n".join(lines)
