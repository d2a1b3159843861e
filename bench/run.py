"""``make bench``: one run of every benchmark on PostgreSQL and the local SQS server.

Prints a table and writes ``bench/results/latest.json``: each figure with its baseline and the
ratio, the machine's core count and load average at the start and the end, and the versions.
Nothing here asserts on speed; goals are reported, not enforced. The process exits non-zero
only when a run went wrong (a consumer failed, events were not all applied, ...).

Sizes come from the environment so a quick try is possible:

    BENCH_PAYMENTS=2000 BENCH_INGEST_SECONDS=5 BENCH_E2E_SECONDS=10 BENCH_STEP_SECONDS=8 \
        BENCH_PHASES=ingest,worker,e2e make bench

See docs/benchmarks.md for what each figure means.
"""

import json
import os
import platform
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402

from bench import events, history, loadgen, stats  # noqa: E402
from bench.report import GOALS, fmt, markdown, table  # noqa: E402
from bench.stack import (  # noqa: E402
    RESULTS,
    BenchError,
    Gunicorn,
    Stack,
    consumer_command,
    metrics_dir_fresh,
    queue_names,
    spawn,
)
from devstack.env import EnvError, env_choices, env_int, env_ints  # noqa: E402
from devstack.processes import (  # noqa: E402
    PY,
    database_create,
    database_drop,
    stop_process,
    worker_command,
)

# history and storage run only when named (BENCH_PHASES=history,storage): the history preload
# takes minutes and gigabytes.
PHASES = ("ingest", "worker", "e2e", "profile", "history", "storage")


def _phases() -> list[str]:
    phases = env_choices("BENCH_PHASES", "ingest,worker,e2e", PHASES)
    if os.environ.get("BENCH_PROFILE") == "1" and "profile" not in phases:
        phases.append("profile")
    return phases


def _config() -> dict:
    try:
        return {
            "payments": env_int("BENCH_PAYMENTS", 10_000),
            "ingest_seconds": env_int("BENCH_INGEST_SECONDS", 10),
            "ingest_connections": env_int("BENCH_CONNECTIONS", 16),
            "ingest_pool": env_int("BENCH_INGEST_POOL", 50_000),
            "ingest_rounds": env_int("BENCH_INGEST_ROUNDS", 2),
            "gunicorn_workers": env_int("BENCH_GUNICORN_WORKERS", 2),
            "gunicorn_threads": env_int("BENCH_GUNICORN_THREADS", 8),
            "e2e_rate": env_int("BENCH_E2E_RATE", 200),
            "e2e_seconds": env_int("BENCH_E2E_SECONDS", 20),
            "e2e_workers": env_int("BENCH_E2E_WORKERS", 2),
            # Production runs the outbox relay in every worker loop; BENCH_E2E_RELAY=0 shows
            # its cost.
            "e2e_relay": os.environ.get("BENCH_E2E_RELAY", "1") != "0",
            "e2e_connections": env_int("BENCH_E2E_CONNECTIONS", 64),
            "step_rates": env_ints("BENCH_STEPS", "100,150,200,300,400,600,850,1000"),
            "step_seconds": env_int("BENCH_STEP_SECONDS", 15),
            "history_payments": env_int("BENCH_HISTORY_PAYMENTS", 5_000_000),
            "partition_rows": env_int("BENCH_PARTITION_ROWS", 2_000_000),
            "database": os.environ.get("BENCH_DATABASE") or "payments_benchrun",
            "phases": _phases(),
        }
    except EnvError as exc:
        raise SystemExit(str(exc)) from None


CONFIG = _config()
SECRETS = ["bench-signing-secret"]
CALLBACK_PATH = "/callbacks/processor/"
# Measured on the benchmark machine before any product code existed (issue 8).
REFERENCE = {
    "plain_sql_tx_per_second": {"1": 1500, "2": 2700},
    "naive_orm_tx_per_second": {"1": 560, "2": 1050},
    "minimal_drf_post_gunicorn_2_workers": {"requests_per_second": 2100, "p99_ms": 9},
    "fauxqs_receive_delete_per_second": 3500,
}

problems: list[str] = []


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


# --- machine and versions ---------------------------------------------------------------------


def _command_version(cmd: list[str]) -> str:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unavailable ({exc})"
    return (
        (done.stdout or done.stderr).strip().splitlines()[0] if (done.stdout or done.stderr) else ""
    )


def versions(db_url: str) -> dict:
    import django
    import gunicorn
    import rest_framework

    with psycopg.connect(db_url) as conn:
        postgres = conn.execute("SHOW server_version").fetchone()[0]
    package = json.loads((ROOT / "localsqs" / "package.json").read_text())
    git = _command_version(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"])
    dirty = _command_version(["git", "-C", str(ROOT), "status", "--porcelain"])
    return {
        "python": platform.python_version(),
        "django": django.get_version(),
        "djangorestframework": rest_framework.VERSION,
        "gunicorn": gunicorn.__version__,
        "psycopg": psycopg.__version__,
        "postgresql": postgres,
        "fauxqs": package["dependencies"]["fauxqs"],
        "node": _command_version(["node", "--version"]),
        "wrk": " ".join(_command_version(["wrk", "--version"]).split()[1:2])
        if shutil.which("wrk")
        else None,
        "git_commit": git,
        "git_tree_clean": dirty == "",
    }


def machine() -> dict:
    return {
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "load_average_start": os.getloadavg(),
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def ensure_wrk() -> str:
    """wrk when present (installed from Debian when missing and running as root); else the
    Python generator. Returns which one the ingest benchmark uses."""
    if os.environ.get("BENCH_GENERATOR") == "python":
        return "python"
    if shutil.which("wrk"):
        return "wrk"
    if hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("apt-get"):
        log("wrk is missing: installing Debian's wrk package")
        done = subprocess.run(
            ["apt-get", "install", "-y", "-q", "wrk"], capture_output=True, text=True
        )
        if done.returncode == 0 and shutil.which("wrk"):
            return "wrk"
        log(f"apt-get install wrk failed ({done.returncode}); using the Python generator")
    return "python"


# --- database and queues ------------------------------------------------------------------------

PAYMENT_COLUMNS = (
    "id, merchant_id, amount, currency, source_token, description, idempotency_key, state, "
    "processor_id, created_at, updated_at, state_changed_at"
)


def payments_reset(db_url: str, count: int) -> list[str]:
    """Empty the payment and queue-layer tables and write ``count`` payments in ``submitted``,
    each waiting for its ``settled`` event. Returns their ids in order."""
    ids = [str(uuid.uuid4()) for _ in range(count)]
    now = datetime.now(UTC)
    with psycopg.connect(db_url, autocommit=True) as conn:
        tables = [
            row[0]
            for row in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND "
                "(tablename LIKE 'payments\\_%%' OR tablename LIKE 'callbacks\\_%%' "
                "OR tablename LIKE 'triage\\_%%')"
            )
        ]
        conn.execute(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE")
        with conn.cursor() as cur:
            with cur.copy(f"COPY payments_payment ({PAYMENT_COLUMNS}) FROM STDIN") as copy:
                for n, payment_id in enumerate(ids):
                    copy.write_row(
                        (
                            payment_id,
                            f"merchant-{n % 50}",
                            events.AMOUNT,
                            "USD",
                            f"tok_bench_{n:08d}",
                            "",
                            str(uuid.uuid4()),
                            "submitted",
                            f"proc_{n}",
                            now,
                            now,
                            now,
                        )
                    )
        for table in tables:
            conn.execute(f"VACUUM ANALYZE {table}")
    return ids


def queues_create(tag: str) -> tuple[str, str, str]:
    """A fresh main queue and DLQ made by the product's own setup (``queues_ensure``)."""
    from django.conf import settings

    from callbacks import sqs
    from callbacks.queues import queues_ensure

    name, dlq = queue_names(tag)
    settings.SQS_QUEUE_NAME, settings.SQS_DLQ_NAME = name, dlq
    sqs.reset()
    queues_ensure(visibility_timeout=30)
    return name, dlq, sqs.main_queue_url()


def queue_depth(url: str) -> tuple[int, int]:
    """(visible, in flight) messages of the queue."""
    from callbacks import sqs

    attributes = sqs.sqs_client().get_queue_attributes(
        QueueUrl=url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return (
        int(attributes["ApproximateNumberOfMessages"]),
        int(attributes["ApproximateNumberOfMessagesNotVisible"]),
    )


def queue_fill(url: str, payment_ids: list[str], run: str) -> None:
    """One ``settled`` event per payment, each in its own message group (the payment), with the
    body the callback endpoint would have published."""
    from callbacks import sqs
    from callbacks.schema import parse_processor_event, processor_event_message

    entries = []
    for callback in events.callbacks_for(payment_ids, run):
        event = parse_processor_event(json.loads(callback.body))
        entries.append(
            {
                "Id": str(len(entries) % 10),
                "MessageBody": json.dumps(processor_event_message(event), separators=(",", ":")),
                "MessageGroupId": callback.payment_id,
                "MessageDeduplicationId": callback.processor_event_id,
            }
        )
    client = sqs.sqs_client()

    def send(start: int) -> None:
        response = client.send_message_batch(QueueUrl=url, Entries=entries[start : start + 10])
        if response.get("Failed"):
            raise BenchError(f"filling the queue failed: {response['Failed'][:3]}")

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(send, range(0, len(entries), 10)))
    visible, _ = queue_depth(url)
    if visible != len(entries):
        raise BenchError(f"queue holds {visible} messages after sending {len(entries)}")


# --- worker ---------------------------------------------------------------------------------------


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


def _children_cpu() -> float:
    """User + system CPU seconds of the child processes waited for so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


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
    if kind == "worker":
        cmd = worker_command(until_empty=True, wait_time=1, relay=False)
    else:
        cmd = consumer_command(
            kind, endpoint=stack.sqs_endpoint, queue_url=url, db_url=stack.database_url
        )
    env = stack.env(name, dlq)
    counters_before = _db_counters(stack.database_url)
    cpu_before = _children_cpu()
    started = time.time()
    procs = [spawn(cmd, env, RESULTS / f"{tag}-{i}.log") for i in range(processes)]
    spy = None
    if profile is not None:
        spy = _py_spy(procs[0].pid, profile)
    beside = threading.Thread(target=during, name=f"{tag}-during") if during else None
    if beside is not None:
        beside.start()
    timeout = 120 + count / 20
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
    wall = time.time() - started
    if beside is not None:
        beside.join()
    # Backends flush their statistics when they exit; what the consumers did is in now.
    counters = _db_counters(stack.database_url)
    if spy is not None:
        spy.wait(30)
    result: dict = {"kind": kind, "processes": processes, "events": count, "wall_seconds": wall}
    # CPU of the consumer processes themselves (not PostgreSQL's, not the queue's).
    result["consumer_cpu_ms_per_event"] = round(1000 * (_children_cpu() - cpu_before) / count, 3)
    if kind != "noop":
        result["database_per_event"] = {
            k: round((counters[k] - counters_before[k]) / count, 2) for k in DB_COUNTERS
        }
    if kind == "noop":
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
        if prepare is None:  # on a preloaded history the tables hold far more than this run
            result["bytes_per_event"] = _bytes_per_event(stack.database_url, count)
    visible, in_flight = queue_depth(url)
    if visible or in_flight:
        wrong.append(f"{visible} messages left visible and {in_flight} in flight")
    result["done"] = done
    result["problems"] = wrong
    problems.extend(f"worker {tag}: {w}" for w in wrong)
    log(
        f"{tag}: {done} events in {wall:.1f} s wall, "
        f"{fmt(result['rate'])}/s in the processing window{' PROBLEMS: ' if wrong else ''}"
        f"{'; '.join(wrong)}"
    )
    return result


def worker_phase(stack: Stack) -> dict:
    runs: dict[str, dict] = {}
    for processes in (1, 2):
        for kind in ("noop", "plainsql", "worker"):
            runs[f"{kind}_{processes}"] = consumer_run(stack, kind, processes)
    summary = {}
    for processes in (1, 2):
        worker = runs[f"worker_{processes}"]["rate"]
        plain = runs[f"plainsql_{processes}"]["rate"]
        noop = runs[f"noop_{processes}"]["rate"]
        summary[str(processes)] = {
            "worker_events_per_second": worker,
            "plain_sql_events_per_second": plain,
            "noop_messages_per_second": noop,
            "worker_vs_plain_sql": stats.ratio(worker, plain),
            "worker_vs_noop": stats.ratio(worker, noop),
            "worker_database_per_event": runs[f"worker_{processes}"].get("database_per_event"),
            "plain_sql_database_per_event": runs[f"plainsql_{processes}"].get("database_per_event"),
            "worker_bytes_per_event": runs[f"worker_{processes}"].get("bytes_per_event"),
            "plain_sql_bytes_per_event": runs[f"plainsql_{processes}"].get("bytes_per_event"),
        }
    return {"events": CONFIG["payments"], "runs": runs, "summary": summary}


# --- ingest ---------------------------------------------------------------------------------------


def _wrk(url: str, pool: Path, seconds: int, connections: int) -> dict:
    threads = 1
    cmd = ["wrk", "-t", str(threads), "-c", str(connections), "-d", f"{seconds}s"]
    cmd += ["--timeout", "5s", "-s", str(ROOT / "bench" / "wrk_callbacks.lua"), url]
    cmd += ["--", str(pool), str(threads)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("BENCHJSON ")]
    if done.returncode != 0 or not lines:
        raise BenchError(f"wrk failed ({done.returncode}): {done.stdout}{done.stderr}")
    raw = json.loads(lines[-1].removeprefix("BENCHJSON "))
    duration = raw["duration_us"] / 1e6
    return {
        "requests": raw["requests"],
        "accepted": raw["accepted"],
        "other_status": raw["other_status"],
        "socket_errors": sum(raw[k] for k in raw if k.startswith("errors_")),
        "pool_wraps": raw["wraps"],
        "seconds": duration,
        "accepted_per_second": raw["accepted"] / duration,
        "p50_ms": raw["p50_us"] / 1000,
        "p90_ms": raw["p90_us"] / 1000,
        "p99_ms": raw["p99_us"] / 1000,
        "max_ms": raw["max_us"] / 1000,
    }


def _python_closed_loop(port: int, path: str, pool: Path, seconds: int, connections: int) -> dict:
    lines = pool.read_text().splitlines()

    def make(n: int) -> tuple[str, bytes]:
        signature, body = lines[n % len(lines)].split("\t", 1)
        headers = {"Content-Type": "application/json", "X-Processor-Signature": signature}
        return str(n), loadgen.build_request("127.0.0.1", port, path, body.encode(), headers)

    result = loadgen.closed_loop("127.0.0.1", port, make, seconds=seconds, connections=connections)
    latencies = [(s.answered - s.sent) * 1000 for s in result.samples]
    accepted = result.count(202)
    return {
        "requests": len(result.samples),
        "accepted": accepted,
        "other_status": len(result.samples) - accepted - result.count(0),
        "socket_errors": result.count(0),
        "pool_wraps": len(result.samples) // len(lines),
        "seconds": result.duration,
        "accepted_per_second": accepted / result.duration,
        "p50_ms": stats.percentile(latencies, 50),
        "p90_ms": stats.percentile(latencies, 90),
        "p99_ms": stats.percentile(latencies, 99),
        "max_ms": max(latencies, default=None),
    }


SEND_BATCH = "payments_callback_send_batch_entries"
WORKER_BATCH = "payments_worker_batch_messages"


def _histograms(server: Gunicorn) -> dict[str, tuple[float, float]]:
    """(sum, count) of the batch-size histograms, summed over every process that shares the
    metrics directory (gunicorn's workers and the queue workers); empty without one."""
    try:
        with urllib.request.urlopen(server.url + "/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return {}
    totals: dict[str, list[float]] = {}
    for line in text.splitlines():
        for name in (SEND_BATCH, WORKER_BATCH):
            for i, suffix in enumerate(("_sum", "_count")):
                if line.startswith(name + suffix + " "):
                    totals.setdefault(name, [0.0, 0.0])[i] += float(line.split()[-1])
    return {name: (total[0], total[1]) for name, total in totals.items()}


def _batch_means(before: dict, after: dict) -> dict[str, float | None]:
    """Mean messages per call between two ``_histograms`` readings."""
    out = {}
    for name, key in ((SEND_BATCH, "callbacks_per_send_call"), (WORKER_BATCH, "worker_batch")):
        total, calls = (after.get(name, (0, 0))[i] - before.get(name, (0, 0))[i] for i in (0, 1))
        out[key] = round(total / calls, 2) if calls else None
    return out


def _load(generator: str, server: Gunicorn, path: str, seconds: int, pool_size: int) -> dict:
    pool = RESULTS / "callbacks-pool.tsv"
    events.write_signed_pool(pool, pool_size, SECRETS, run=uuid.uuid4().hex[:8])
    try:
        if generator == "wrk":
            return _wrk(server.url + path, pool, seconds, CONFIG["ingest_connections"])
        return _python_closed_loop(server.port, path, pool, seconds, CONFIG["ingest_connections"])
    finally:
        pool.unlink(missing_ok=True)


def ingest_phase(stack: Stack, generator: str) -> dict:
    from bench.urls import MINIMAL_PATH

    name, dlq, url = queues_create("ingest")
    server = Gunicorn(
        stack,
        queue=(name, dlq),
        workers=CONFIG["gunicorn_workers"],
        threads=CONFIG["gunicorn_threads"],
    ).start()
    seconds = CONFIG["ingest_seconds"]
    out: dict = {
        "generator": generator,
        "connections": CONFIG["ingest_connections"],
        "gunicorn": " ".join(server.command[1:]),
        "seconds": seconds,
        # The web processes read it from the environment (unset: the product's default).
        "send_coalesce_seconds": os.environ.get("CALLBACK_SEND_COALESCE_SECONDS", "default"),
    }
    rounds = CONFIG["ingest_rounds"]
    out["rounds"] = rounds
    runs: dict[str, list[dict]] = {"minimal": [], "callback": []}
    try:
        sent = 0
        # Alternating rounds, so drift in the machine's background load hits both alike.
        for round_number in range(1, rounds + 1):
            for target, path in (("minimal", MINIMAL_PATH), ("callback", CALLBACK_PATH)):
                if round_number == 1:
                    # Warm up: imports, connection pools, each gunicorn worker's SQS client.
                    warm = _load(generator, server, path, 2, 5_000)
                    if target == "callback":
                        sent += warm["accepted"]
                web_pids = [server.process.pid, *server.worker_pids()]
                sqs_pids = [stack.sqs_pid] if stack.sqs_pid else []
                batches = _histograms(server)  # read outside the measured CPU
                cpu_each = [_process_cpu(pid) for pid in web_pids]
                cpu_sqs = sum(_process_cpu(pid) for pid in sqs_pids)
                result = _load(generator, server, path, seconds, CONFIG["ingest_pool"])
                used_each = [
                    _process_cpu(pid) - before
                    for pid, before in zip(web_pids, cpu_each, strict=True)
                ]
                answered = max(result["accepted"], 1)
                # CPU per accepted request of gunicorn's processes and of the local SQS server.
                result["web_cpu_ms_per_request"] = round(1000 * sum(used_each) / answered, 3)
                result["sqs_cpu_ms_per_request"] = round(
                    1000 * (sum(_process_cpu(pid) for pid in sqs_pids) - cpu_sqs) / answered, 3
                )
                # Cores each web process used (master first): one process held to one core by
                # its GIL while the other idles shows an uneven share of the connections.
                result["web_cores_per_process"] = [
                    round(used / max(result["seconds"], 1e-9), 2) for used in used_each
                ]
                workers_cores = result["web_cores_per_process"][1:]
                result["web_processes_uneven"] = len(workers_cores) > 1 and min(
                    workers_cores
                ) < 0.6 * max(workers_cores)
                if target == "callback":
                    result["callbacks_per_send_call"] = _batch_means(batches, _histograms(server))[
                        "callbacks_per_send_call"
                    ]
                    sent += result["accepted"]
                if result["pool_wraps"]:
                    problems.append(
                        f"ingest {target}: the pool of {CONFIG['ingest_pool']} signed "
                        "callbacks wrapped around; raise BENCH_INGEST_POOL"
                    )
                if result["other_status"] or result["socket_errors"]:
                    problems.append(
                        f"ingest {target}: {result['other_status']} non-202 answers and "
                        f"{result['socket_errors']} socket errors"
                    )
                runs[target].append(result)
                log(
                    f"ingest {target} round {round_number}: "
                    f"{result['accepted_per_second']:.0f} accepted/s, "
                    f"P50 {result['p50_ms']:.1f} ms, P99 {result['p99_ms']:.1f} ms"
                    + (
                        f", {result['callbacks_per_send_call']} callbacks per SQS call"
                        if result.get("callbacks_per_send_call")
                        else ""
                    )
                    + f", cores per web process {result['web_cores_per_process'][1:]}"
                    + (" (uneven)" if result["web_processes_uneven"] else "")
                )
        for target, results in runs.items():
            out[target] = {
                key: sum(r[key] for r in results) / len(results)
                for key in (
                    "accepted_per_second",
                    "p50_ms",
                    "p90_ms",
                    "p99_ms",
                    "web_cpu_ms_per_request",
                    "sqs_cpu_ms_per_request",
                )
            }
            out[target]["rounds"] = results
        visible, _ = queue_depth(url)
        out["queued_messages"] = visible
        # wrk stops with requests in flight: the server may still queue those after the
        # count, so the queue may hold a few more than were answered, never fewer.
        if visible < sent:
            problems.append(f"ingest: {sent} callbacks accepted but only {visible} queued")
    finally:
        server.stop()
    out["callback_vs_minimal"] = stats.ratio(
        out["callback"]["accepted_per_second"], out["minimal"]["accepted_per_second"]
    )
    # The same ratio over only the rounds whose connections fell evenly on the web processes
    # (see "web_cores_per_process"): None when either endpoint had no such round.
    even = {
        target: [r["accepted_per_second"] for r in runs[target] if not r["web_processes_uneven"]]
        for target in runs
    }
    out["callback_vs_minimal_even_rounds"] = (
        stats.ratio(
            sum(even["callback"]) / len(even["callback"]),
            sum(even["minimal"]) / len(even["minimal"]),
        )
        if even["callback"] and even["minimal"]
        else None
    )
    return out


# --- end to end -----------------------------------------------------------------------------------


class BacklogSampler:
    """Samples the queue's visible + in-flight messages every ``interval`` seconds."""

    def __init__(self, url: str, interval: float = 0.5) -> None:
        self.url, self.interval = url, interval
        self.points: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                visible, in_flight = queue_depth(self.url)
                self.points.append((time.time(), float(visible + in_flight)))
            except Exception as exc:  # noqa: BLE001 - a missed sample is only a gap
                log(f"backlog sample failed: {exc}")
            self._stop.wait(self.interval)

    def __enter__(self) -> "BacklogSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _process_cpu(pid: int) -> float:
    """User + system CPU seconds a process has used so far; 0 when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


class CpuMeter:
    """CPU seconds used by each part of the system under test, between two snapshots: the
    web processes, the queue workers, the local SQS server, the PostgreSQL backends serving
    the benchmark's database, and this process (the load generator)."""

    def __init__(self, stack: Stack, server: Gunicorn, workers: list[subprocess.Popen]):
        self.stack, self.server, self.workers = stack, server, workers

    def _pids(self) -> dict[str, list[int]]:
        with psycopg.connect(self.stack.database_url, autocommit=True) as conn:
            backends = [
                row[0]
                for row in conn.execute(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                    "AND pid <> pg_backend_pid()"
                )
            ]
        return {
            "web": [self.server.process.pid, *self.server.worker_pids()],
            "workers": [w.pid for w in self.workers],
            "sqs": [self.stack.sqs_pid] if self.stack.sqs_pid else [],
            "postgres": backends,
        }

    def snapshot(self) -> dict[str, dict[int, float]]:
        snap = {
            part: {pid: _process_cpu(pid) for pid in pids} for part, pids in self._pids().items()
        }
        own = os.times()
        snap["generator"] = {os.getpid(): own.user + own.system}
        return snap

    @staticmethod
    def used(before: dict, after: dict) -> dict[str, float]:
        """CPU seconds per part between the snapshots (processes present in both, or new)."""
        return {
            part: round(sum(t - before.get(part, {}).get(pid, 0.0) for pid, t in pids.items()), 3)
            for part, pids in after.items()
        }


def _cpu_summary(used: dict[str, float], events: int, seconds: float) -> dict:
    return {
        "cpu_seconds": used,
        "cpu_ms_per_event": {k: round(1000 * v / max(events, 1), 2) for k, v in used.items()},
        "cores_busy": round(sum(used.values()) / max(seconds, 1e-9), 2),
    }


def _offer(server: Gunicorn, payment_ids: list[str], run: str, rate: int, seconds: int):
    """Open-loop callbacks at ``rate``/s, one ``settled`` event per payment, signed as sent."""
    port = server.port

    def make(n: int) -> tuple[str, bytes]:
        callback = events.settled_callback(payment_ids[n], events.event_id(run, n))
        headers = {
            "Content-Type": "application/json",
            "X-Processor-Signature": callback.signature(SECRETS),
        }
        request = loadgen.build_request("127.0.0.1", port, CALLBACK_PATH, callback.body, headers)
        return callback.processor_event_id, request

    return loadgen.open_loop(
        "127.0.0.1",
        port,
        make,
        rate=rate,
        seconds=seconds,
        connections=CONFIG["e2e_connections"],
    )


def _applied_times(db_url: str, event_ids: list[str]) -> dict[str, float]:
    with psycopg.connect(db_url) as conn:
        rows = conn.execute(
            "SELECT processor_event_id, extract(epoch FROM processed_at) "
            "FROM payments_processedevent WHERE processor_event_id = ANY(%s)",
            (event_ids,),
        ).fetchall()
    return {event_id: float(at) for event_id, at in rows}


def _wait_applied(
    db_url: str, event_ids: list[str], *, stall: float = 20, timeout: float | None = None
) -> dict[str, float]:
    """Wait until every event is applied, or nothing more was applied for ``stall`` seconds
    (a worker that stopped making progress is a problem and must not hang the run), or
    ``timeout`` seconds passed (a backlog left by an overloaded step drains slowly; its
    unapplied events are left out of the latencies, which the report says)."""
    started = last_progress = time.time()
    last_count = -1
    while True:
        applied = _applied_times(db_url, event_ids)
        if len(applied) >= len(event_ids):
            return applied
        if timeout is not None and time.time() - started > timeout:
            return applied
        if len(applied) != last_count:
            last_count, last_progress = len(applied), time.time()
        elif time.time() - last_progress > stall:
            problems.append(
                f"end to end: {len(event_ids) - len(applied)} accepted callbacks were not "
                f"applied (no progress for {stall:.0f} s)"
            )
            return applied
        time.sleep(0.5)


def _applied_rate(result: loadgen.LoadResult, applied: dict[str, float]) -> float | None:
    times = [applied[s.key] for s in result.samples if s.key in applied]
    return stats.rate(len(times), min(times, default=None), max(times, default=None))


def _latency_summary(result: loadgen.LoadResult, applied: dict[str, float]) -> dict:
    accepted = [s for s in result.samples if s.status == 202]
    to_applied = [(applied[s.key] - s.answered) * 1000 for s in accepted if s.key in applied]
    sent_to_applied = [(applied[s.key] - s.intended) * 1000 for s in accepted if s.key in applied]
    http = [(s.answered - s.intended) * 1000 for s in result.samples]
    return {
        "accepted": len(accepted),
        "applied": sum(1 for s in accepted if s.key in applied),
        "accepted_to_applied_p50_ms": stats.percentile(to_applied, 50),
        "accepted_to_applied_p99_ms": stats.percentile(to_applied, 99),
        "sent_to_applied_p50_ms": stats.percentile(sent_to_applied, 50),
        "sent_to_applied_p99_ms": stats.percentile(sent_to_applied, 99),
        "http_p50_ms": stats.percentile(http, 50),
        "http_p99_ms": stats.percentile(http, 99),
    }


def e2e_phase(stack: Stack) -> dict:
    rate, seconds = CONFIG["e2e_rate"], CONFIG["e2e_seconds"]
    step_rates, step_seconds = CONFIG["step_rates"], CONFIG["step_seconds"]
    total = rate * seconds + sum(r * step_seconds for r in step_rates)
    ids = payments_reset(stack.database_url, total)
    name, dlq, url = queues_create("e2e")
    server = Gunicorn(
        stack,
        queue=(name, dlq),
        workers=CONFIG["gunicorn_workers"],
        threads=CONFIG["gunicorn_threads"],
    ).start()
    env = stack.env(name, dlq)
    cmd = worker_command(until_empty=False, wait_time=20, relay=CONFIG["e2e_relay"])
    workers = [
        spawn(cmd, env, RESULTS / f"e2e-worker-{i}.log") for i in range(CONFIG["e2e_workers"])
    ]
    out: dict = {
        "gunicorn": " ".join(server.command[1:]),
        "workers": CONFIG["e2e_workers"],
        "worker_command": " ".join(["manage.py", *cmd[2:]]),
        "connections": CONFIG["e2e_connections"],
    }
    offset = 0
    try:
        time.sleep(2)  # let the workers start their first long poll
        if any(w.poll() is not None for w in workers):
            raise BenchError(f"a worker exited at start; see {RESULTS}/e2e-worker-*.log")
        run = uuid.uuid4().hex[:8]
        steady_ids = ids[offset : offset + rate * seconds]
        offset += len(steady_ids)
        log(f"end to end: {rate} callbacks/s for {seconds} s")
        meter = CpuMeter(stack, server, workers)
        batches = _histograms(server)  # read outside the measured CPU
        cpu_before = meter.snapshot()
        with BacklogSampler(url) as sampler:
            steady = _offer(server, steady_ids, f"{run}s", rate, seconds)
        steady_cpu = _cpu_summary(
            CpuMeter.used(cpu_before, meter.snapshot()), steady.count(202), steady.duration
        )
        steady_cpu["batches"] = _batch_means(batches, _histograms(server))
        applied = _wait_applied(
            stack.database_url, [s.key for s in steady.samples if s.status == 202]
        )
        out["steady"] = {
            "offered_rate": rate,
            "seconds": seconds,
            "backlog_max": max((y for _, y in sampler.points), default=None),
            **_latency_summary(steady, applied),
            **steady_cpu,
            "accepted_per_second": steady.count(202) / steady.duration,
            "applied_per_second": _applied_rate(steady, applied),
        }
        log(
            f"end to end at {rate}/s: accepted->applied P50 "
            f"{fmt(out['steady']['accepted_to_applied_p50_ms'])} ms, P99 "
            f"{fmt(out['steady']['accepted_to_applied_p99_ms'])} ms"
        )

        steps = []
        for step_rate in step_rates:
            step_ids = ids[offset : offset + step_rate * step_seconds]
            offset += len(step_ids)
            batches = _histograms(server)  # read outside the measured CPU
            cpu_before = meter.snapshot()
            with BacklogSampler(url) as sampler:
                result = _offer(server, step_ids, f"{run}r{step_rate}", step_rate, step_seconds)
            step = _step_verdict(step_rate, step_seconds, result, sampler.points)
            step.update(
                _cpu_summary(
                    CpuMeter.used(cpu_before, meter.snapshot()), result.count(202), result.duration
                )
            )
            step["batches"] = _batch_means(batches, _histograms(server))
            step["_result"] = result
            steps.append(step)
            log(
                f"step {step_rate}/s: accepted {step['accepted_per_second']:.0f}/s, backlog "
                f"{step['backlog_start']:.0f} -> {step['backlog_end']:.0f} "
                f"(trend {step['backlog_trend_per_second']:+.1f}/s), "
                f"{step['cores_busy']:.2f} cores busy, "
                f"batches {step['batches']['callbacks_per_send_call']} per send, "
                f"{step['batches']['worker_batch']} per receive: "
                f"{'sustained' if step['sustained'] else 'NOT sustained'}"
            )
            if not step["sustained"]:
                break
        all_keys = [s.key for st in steps for s in st["_result"].samples if s.status == 202]
        # An overloaded last step leaves a backlog: give it a bounded time to drain.
        applied = _wait_applied(stack.database_url, all_keys, timeout=90)
        for step in steps:
            result = step.pop("_result")
            step.update(_latency_summary(result, applied))
            step["applied_per_second"] = _applied_rate(result, applied)
        out["steps"] = steps
        passed = [s["offered_rate"] for s in steps if s["sustained"]]
        out["sustained_events_per_second"] = max(passed, default=0)
        out["limit_reached"] = bool(steps) and not steps[-1]["sustained"]
    finally:
        # A worker finishes its long poll (up to 20 s) before it stops: signal all at once.
        for w in workers:
            if w.poll() is None:
                w.send_signal(signal.SIGTERM)
        server.stop()
        for w in workers:
            try:
                w.wait(30)
            except subprocess.TimeoutExpired:
                w.kill()
                w.wait()
    crashed = [w.returncode for w in workers if w.returncode not in (0, -15)]
    if crashed:
        problems.append(f"end to end: worker exit statuses {crashed}; see e2e-worker-*.log")
    return out


def _step_verdict(rate: int, seconds: int, result: loadgen.LoadResult, points) -> dict:
    offered = rate * seconds
    accepted = result.count(202)
    accepted_rate = accepted / result.duration
    grows = stats.backlog_grows(points, rate)
    generator_bound = result.schedule_lag_max > 0.5
    reasons = []
    if accepted < 0.99 * offered:
        reasons.append(f"only {accepted} of {offered} callbacks accepted")
    if accepted_rate < 0.95 * rate:
        reasons.append(f"accepted {accepted_rate:.0f}/s of {rate}/s offered")
    if grows:
        reasons.append("the queue backlog kept growing")
    if generator_bound:
        reasons.append(
            f"the load generator fell {result.schedule_lag_max:.2f} s behind its schedule"
        )
    return {
        "offered_rate": rate,
        "seconds": seconds,
        "offered": offered,
        "accepted_per_second": accepted_rate,
        "non_202": len(result.samples) - accepted,
        "errors": result.errors,
        "generator_lag_max_seconds": result.schedule_lag_max,
        "backlog_start": points[0][1] if points else 0.0,
        "backlog_end": points[-1][1] if points else 0.0,
        "backlog_max": max((y for _, y in points), default=0.0),
        "backlog_trend_per_second": stats.backlog_trend(points),
        "sustained": not reasons,
        "why_not": reasons,
    }


# --- profiles -------------------------------------------------------------------------------------


def _py_spy(pid: int, output: Path, duration: int | None = None) -> subprocess.Popen | None:
    spy = Path(PY).with_name("py-spy")
    if not spy.exists():
        spy_path = shutil.which("py-spy")
        if spy_path is None:
            log("py-spy is not installed (pip install py-spy): no profile")
            return None
        spy = Path(spy_path)
    cmd = [str(spy), "record", "--pid", str(pid), "--rate", "250", "--format", "raw"]
    cmd += ["--output", str(output), "--nonblocking"]
    if duration:
        cmd += ["--duration", str(duration)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def profile_summary(raw: Path, top: int = 25) -> dict:
    """Inclusive and self sample shares per function from py-spy's collapsed stacks."""
    inclusive: dict[str, int] = {}
    own: dict[str, int] = {}
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = [_frame_name(f) for f in stack.split(";")]
        for frame in set(frames):
            inclusive[frame] = inclusive.get(frame, 0) + count
        own[frames[-1]] = own.get(frames[-1], 0) + count
    if not total:
        return {"samples": 0}

    def share(table: dict[str, int]) -> list[tuple[str, float]]:
        ranked = sorted(table.items(), key=lambda kv: -kv[1])[:top]
        return [(name, round(100 * n / total, 1)) for name, n in ranked]

    return {"samples": total, "inclusive_percent": share(inclusive), "self_percent": share(own)}


def _frame_name(frame: str) -> str:
    """``func (path/to/file.py:123)`` -> ``func (file path relative to the project)``."""
    name, _, where = frame.partition(" (")
    path = where.rsplit(":", 1)[0]
    for marker in ("site-packages/", str(ROOT) + "/", "lib/python3.11/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{name} ({path})"


def profile_phase(stack: Stack, generator: str) -> dict:
    """Profiles of the hot paths (py-spy, sampling, not during the measured runs)."""
    out = {}
    raw = RESULTS / "profile-worker.txt"
    consumer_run(stack, "worker", 1, profile=raw)
    if raw.exists():
        out["worker"] = profile_summary(raw)
    name, dlq, _ = queues_create("profile")
    server = Gunicorn(
        stack,
        queue=(name, dlq),
        workers=CONFIG["gunicorn_workers"],
        threads=CONFIG["gunicorn_threads"],
    ).start()
    try:
        _load(generator, server, CALLBACK_PATH, 2, 5_000)
        seconds = CONFIG["ingest_seconds"]
        spies = [
            _py_spy(pid, RESULTS / f"profile-callback-{i}.txt", duration=seconds)
            for i, pid in enumerate(server.worker_pids())
        ]
        _load(generator, server, CALLBACK_PATH, seconds, CONFIG["ingest_pool"])
        for spy in spies:
            if spy is not None:
                spy.wait(30)
    finally:
        server.stop()
    first = RESULTS / "profile-callback-0.txt"
    if first.exists():
        out["callback"] = profile_summary(first)
    for key, summary in out.items():
        lines = [f"{share:5.1f}%  {name}" for name, share in summary.get("inclusive_percent", [])]
        (RESULTS / f"profile-{key}-summary.txt").write_text(
            f"{summary['samples']} samples, inclusive share\n" + "\n".join(lines) + "\n"
        )
    return out


def _worker_runs(stack: Stack) -> history.WorkerRuns:
    """The worker runs of this script, for bench.history (which cannot import this script: it
    runs as ``__main__``)."""

    def run(processes: int, **options) -> dict:
        return consumer_run(stack, "worker", processes, **options)

    return history.WorkerRuns(run=run, config=CONFIG, problems=problems)


def main() -> int:
    RESULTS.mkdir(parents=True, exist_ok=True)
    started = time.time()
    report: dict = {
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "config": CONFIG,
        "goals": GOALS,
        "reference_before_code": REFERENCE,
    }
    from tests.localsqs import LocalSqs

    generator = ensure_wrk() if {"ingest", "profile"} & set(CONFIG["phases"]) else "python"
    log(f"phases {', '.join(CONFIG['phases'])}; {CONFIG['payments']} payments per worker run")
    local_sqs = LocalSqs().start()
    db_url = database_create(CONFIG["database"])
    stack = Stack(
        database_url=db_url,
        sqs_endpoint=local_sqs.endpoint_url,
        secrets=SECRETS,
        metrics_dir=metrics_dir_fresh(),
        sqs_pid=local_sqs.process.pid,
    )
    try:
        os.environ.update(stack.env())
        stack.manage("migrate", "--noinput")
        import django

        django.setup()
        report["versions"] = versions(db_url)
        phases = CONFIG["phases"]
        if "ingest" in phases:
            report["ingest"] = ingest_phase(stack, generator)
        if "worker" in phases:
            report["worker"] = worker_phase(stack)
        if "e2e" in phases:
            report["e2e"] = e2e_phase(stack)
        if "profile" in phases:
            report["profiles"] = profile_phase(stack, generator)
        if "storage" in phases:
            report["storage"] = history.storage_phase(stack, _worker_runs(stack))
        if "history" in phases:
            report["history"] = history.history_phase(
                stack, _worker_runs(stack), empty=report.get("worker")
            )
    finally:
        local_sqs.stop()
        if os.environ.get("BENCH_KEEP_DATABASE") != "1":
            database_drop(CONFIG["database"])
    report["machine"]["load_average_end"] = os.getloadavg()
    report["wall_seconds"] = round(time.time() - started, 1)
    report["problems"] = problems
    (RESULTS / "latest.json").write_text(json.dumps(report, indent=2, default=_json_default))
    (RESULTS / "latest.md").write_text(markdown(report))
    print()
    print(table(report))
    print(f"\nwall time {report['wall_seconds']:.0f} s; written {RESULTS / 'latest.json'}")
    if problems:
        print("\nPROBLEMS:\n  " + "\n  ".join(problems))
        return 1
    return 0


def _json_default(value):
    if isinstance(value, Decimal):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as exc:
        print(f"bench failed: {exc}", file=sys.stderr)
        sys.exit(2)
