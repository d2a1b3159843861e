"""The ``worker`` phase: ``run_sqs_worker`` draining a full queue, beside a no-op consumer and the
same database work in plain SQL (one transaction per message, and batched as the product
batches), each with one and two processes, every run verified."""

import json
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psycopg

from bench import events, stats
from bench.cpu import children_cpu, process_cpu
from bench.options import CONFIG, log, problems
from bench.prepare import payments_reset, queue_depth, queue_fill, queues_create
from bench.report import fmt
from bench.stack import RESULTS, BenchError, Stack, consumer_command, py_spy, py_spy_finish, spawn
from devstack.processes import stop_process, worker_command


def _applied_window(db_url: str, ids: list[str]) -> tuple[int, float | None, float | None]:
    """How many of the run's payments (``ids``) had their event applied, first and last when."""
    with psycopg.connect(db_url) as conn:
        count, first, last = conn.execute(
            "SELECT count(*), extract(epoch FROM min(processed_at)), "
            "extract(epoch FROM max(processed_at)) FROM payments_processedevent "
            "WHERE payment_id = ANY(%s::uuid[])",
            (ids,),
        ).fetchone()
    return count, float(first) if first is not None else None, float(last) if last else None


# Tables an applied event writes to; the payment row itself exists before the event.
EVENT_TABLES = (
    "payments_processedevent",
    "payments_paymentevent",
    "payments_ledgerentry",
    "callbacks_queuemessage",
    "callbacks_processingerror",
)


DB_COUNTERS = ("xact_commit", "xact_rollback", "tup_inserted", "tup_updated", "tup_deleted")


def _db_counters(db_url: str) -> dict[str, int]:
    """This database's cumulative transaction and row counters (pg_stat_database)."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        row = conn.execute(
            f"SELECT {', '.join(DB_COUNTERS)} FROM pg_stat_database "
            "WHERE datname = current_database()"
        ).fetchone()
    return dict(zip(DB_COUNTERS, row, strict=True))


def _bytes_per_event(db_url: str, events_applied: int) -> dict[str, float]:
    """On-disk bytes (heap, indexes, TOAST) per applied event, by table: what a day of
    events costs in storage, beside the rate."""
    sizes = {}
    with psycopg.connect(db_url) as conn:
        for table in EVENT_TABLES:
            size = conn.execute("SELECT pg_total_relation_size(%s)", (table,)).fetchone()[0]
            if size:
                sizes[table] = round(size / max(events_applied, 1), 1)
    sizes["total"] = round(sum(sizes.values()), 1)
    return sizes


def _verify_applied(db_url: str, ids: list[str]) -> list[str]:
    """What is wrong with the database after a run that should have confirmed the payments
    ``ids`` (and only those: a run over a preloaded history leaves the history alone)."""
    expected = len(ids)
    with psycopg.connect(db_url) as conn:
        confirmed = conn.execute(
            "SELECT count(*) FROM payments_payment WHERE state = 'confirmed' "
            "AND id = ANY(%s::uuid[])",
            (ids,),
        ).fetchone()[0]
        ledger = conn.execute(
            "SELECT count(*), coalesce(sum(amount), 0) FROM payments_ledgerentry "
            "WHERE payment_id = ANY(%s::uuid[])",
            (ids,),
        )
        ledger_count, ledger_sum = ledger.fetchone()
        event_rows = conn.execute(
            "SELECT count(*) FROM payments_paymentevent WHERE kind = 'processor_event' "
            "AND outcome = 'applied' AND payment_id = ANY(%s::uuid[])",
            (ids,),
        ).fetchone()[0]
    wrong = []
    if confirmed != expected:
        wrong.append(f"{confirmed} of {expected} payments confirmed")
    if ledger_count != expected or ledger_sum != expected * events.AMOUNT:
        wrong.append(f"{ledger_count} ledger rows summing {ledger_sum}, expected {expected}")
    if event_rows != expected:
        wrong.append(f"{event_rows} applied event rows, expected {expected}")
    return wrong


def consumer_run(
    stack: Stack,
    kind: str,
    processes: int,
    *,
    profile: Path | None = None,
    prepare: Callable[[str, int], list[str]] | None = None,
    during: Callable[[], None] | None = None,
    tag: str = "",
) -> dict:
    """Fill a fresh queue with one ``settled`` event per payment and let ``processes``
    consumers of ``kind`` (worker, plainsql, noop) drain it.

    ``prepare(db_url, count)`` writes the run's payments and returns their ids (default: empty
    every table first, ``payments_reset``; the history phase adds them to a preloaded history
    instead). ``during()`` runs in a thread while the consumers run (the history phase's purge)
    and is waited for before the run's figures are taken."""
    count = CONFIG["payments"]
    tag = tag or f"{kind}{processes}"
    ids = (prepare or payments_reset)(stack.database_url, count)
    name, dlq, url = queues_create(tag)
    queue_fill(url, ids, run=f"{tag}-{uuid.uuid4().hex[:6]}")
    cmd = _consumer_command(stack, kind, url)
    env = stack.env(name, dlq)
    counters_before = _db_counters(stack.database_url)
    cpu_before = children_cpu()
    sqs_before = process_cpu(stack.sqs_pid) if stack.sqs_pid else 0.0
    started = time.time()
    procs = [spawn(cmd, env, RESULTS / f"{tag}-{i}.log") for i in range(processes)]
    spy = None
    if profile is not None:
        spy = py_spy(procs[0].pid, profile)
    beside = threading.Thread(target=during, name=f"{tag}-during") if during else None
    if beside is not None:
        beside.start()
    outputs = _wait_consumers(procs, tag, started, timeout=120 + count / 20)
    wall = time.time() - started
    if beside is not None:
        beside.join()
    # Backends flush their statistics when they exit; what the consumers did is in now.
    counters = _db_counters(stack.database_url)
    py_spy_finish(spy, 30)
    result: dict = {"kind": kind, "processes": processes, "events": count, "wall_seconds": wall}
    # CPU of the consumer processes themselves (not PostgreSQL's, not the queue's).
    result["consumer_cpu_ms_per_event"] = round(1000 * (children_cpu() - cpu_before) / count, 3)
    # The local SQS server's, serving this run's receives and deletes alone.
    if stack.sqs_pid:
        sqs_used = process_cpu(stack.sqs_pid) - sqs_before
        result["sqs_cpu_ms_per_event"] = round(1000 * sqs_used / count, 3)
    if kind != "noop":
        result["database_per_event"] = {
            k: round((counters[k] - counters_before[k]) / count, 2) for k in DB_COUNTERS
        }
    wrong = _drained(stack, result, outputs, ids, url, history=prepare is not None)
    backend = _backend_cpu(outputs) if kind != "worker" else None
    if backend is not None:
        result["postgres_cpu_ms_per_event"] = round(1000 * backend / count, 3)
    problems.extend(f"worker {tag}: {w}" for w in wrong)
    log(
        f"{tag}: {result['done']} events in {wall:.1f} s wall, "
        f"{fmt(result['rate'])}/s in the processing window{' PROBLEMS: ' if wrong else ''}"
        f"{'; '.join(wrong)}"
    )
    return result


def _backend_cpu(outputs: list[str]) -> float | None:
    """The PostgreSQL CPU seconds the baseline consumers' backends reported (None when they
    did not: the product's worker, the no-op consumer, a server on another machine)."""
    reports = [json.loads(line) for out in outputs for line in out.splitlines() if line]
    used = [r.get("backend_cpu_seconds") for r in reports]
    if not used or any(u is None for u in used):
        return None
    return sum(used)


def _consumer_command(stack: Stack, kind: str, url: str) -> list[str]:
    if kind == "worker":
        return worker_command(until_empty=True, wait_time=1, relay=False)
    return consumer_command(
        kind, endpoint=stack.sqs_endpoint, queue_url=url, db_url=stack.database_url
    )


def _wait_consumers(
    procs: list[subprocess.Popen], tag: str, started: float, *, timeout: float
) -> list[str]:
    """Each consumer's output once all have exited; a timeout or a failed consumer stops the
    others and the benchmark."""
    outputs = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=max(timeout - (time.time() - started), 1))
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
                p.wait()
            raise BenchError(f"{tag}: consumers still running after {timeout:.0f} s") from None
        if proc.returncode != 0:
            for p in procs:
                stop_process(p)
            raise BenchError(
                f"{tag}: a consumer exited with status {proc.returncode}; see {RESULTS}/{tag}-*.log"
            )
        outputs.append(out)
    return outputs


def _drained(
    stack: Stack, result: dict, outputs: list[str], ids: list[str], url: str, *, history: bool
) -> list[str]:
    """The run's rate, events done and storage into ``result``; what went wrong, if anything."""
    count = result["events"]
    if result["kind"] == "noop":
        reports = [json.loads(line) for out in outputs for line in out.splitlines() if line]
        done = sum(r["count"] for r in reports)
        firsts = [r["first_done"] for r in reports if r["first_done"]]
        lasts = [r["last_done"] for r in reports if r["last_done"]]
        result["rate"] = stats.rate(done, min(firsts, default=None), max(lasts, default=None))
        wrong = [] if done == count else [f"{done} of {count} messages received and deleted"]
    else:
        done, first, last = _applied_window(stack.database_url, ids)
        result["rate"] = stats.rate(done, first, last)
        wrong = _verify_applied(stack.database_url, ids)
        if not history:  # on a preloaded history the tables hold far more than this run
            result["bytes_per_event"] = _bytes_per_event(stack.database_url, count)
    visible, in_flight = queue_depth(url)
    if visible or in_flight:
        wrong.append(f"{visible} messages left visible and {in_flight} in flight")
    result["done"] = done
    result["problems"] = wrong
    return wrong


KINDS = ("noop", "plainsql", "batchedsql", "worker")


def worker_phase(stack: Stack) -> dict:
    runs: dict[str, dict] = {}
    for processes in (1, 2):
        for kind in KINDS:
            runs[f"{kind}_{processes}"] = consumer_run(stack, kind, processes)
    summary = {str(n): worker_summary(runs, n) for n in (1, 2)}
    return {"events": CONFIG["payments"], "runs": runs, "summary": summary}


def worker_summary(runs: dict[str, dict], processes: int) -> dict:
    """The worker against its baselines with ``processes`` processes each."""
    worker = runs[f"worker_{processes}"]
    plain, batched = runs[f"plainsql_{processes}"], runs[f"batchedsql_{processes}"]
    noop = runs[f"noop_{processes}"]
    return {
        "worker_events_per_second": worker["rate"],
        "plain_sql_events_per_second": plain["rate"],
        "batched_sql_events_per_second": batched["rate"],
        "noop_messages_per_second": noop["rate"],
        "worker_vs_plain_sql": stats.ratio(worker["rate"], plain["rate"]),
        "worker_vs_batched_sql": stats.ratio(worker["rate"], batched["rate"]),
        "worker_vs_noop": stats.ratio(worker["rate"], noop["rate"]),
        "worker_cpu_ms_per_event": worker.get("consumer_cpu_ms_per_event"),
        "batched_sql_cpu_ms_per_event": batched.get("consumer_cpu_ms_per_event"),
        "worker_database_per_event": worker.get("database_per_event"),
        "plain_sql_database_per_event": plain.get("database_per_event"),
        "batched_sql_database_per_event": batched.get("database_per_event"),
        "worker_bytes_per_event": worker.get("bytes_per_event"),
        "plain_sql_bytes_per_event": plain.get("bytes_per_event"),
        "batched_sql_bytes_per_event": batched.get("bytes_per_event"),
    }
