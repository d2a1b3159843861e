"""``make bench``: one run of every benchmark on PostgreSQL and the local SQS server.

Prints a table and writes ``bench/results/latest.json``: each figure with its baseline and the
ratio, the machine's core count and load average at the start and the end, and the versions.
Each run's headline figures are also recorded beside the last runs of the same machine and
compared with the last one of the same sizes (``bench.guard``, ``bench/results/history/``).
Nothing here asserts on speed; goals are reported, not enforced. The process exits non-zero
only when a run went wrong (a consumer failed, events were not all applied, ...).

Sizes come from the environment so a quick try is possible:

    BENCH_PAYMENTS=2000 BENCH_INGEST_SECONDS=5 BENCH_E2E_SECONDS=10 BENCH_STEP_SECONDS=8 \
        BENCH_PHASES=ingest,worker,e2e make bench

Each phase is a module of its own (``ingest``, ``workers``, ``money``, ``pipeline``, ``profiles``,
``webhooks``, ``storage``, ``history``); see docs/benchmarks.md for what each figure means.
"""

import json
import os
import sys
import time
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.celery_peer import peer_phase  # noqa: E402
from bench.guard import guard_run  # noqa: E402
from bench.history import history_phase  # noqa: E402
from bench.ingest import ingest_phase  # noqa: E402
from bench.machine import ensure_wrk, machine, versions  # noqa: E402
from bench.money import money_phase  # noqa: E402
from bench.options import CONFIG, REFERENCE, SECRETS, log, problems  # noqa: E402
from bench.pipeline import e2e_phase  # noqa: E402
from bench.profiles import profile_phase  # noqa: E402
from bench.recovery import recovery_phase  # noqa: E402
from bench.report import GOALS, markdown, table  # noqa: E402
from bench.stack import RESULTS, BenchError, Stack, WorkerRuns, metrics_dir_fresh  # noqa: E402
from bench.storage import storage_phase  # noqa: E402
from bench.summary import cross_phase  # noqa: E402
from bench.webhooks import webhooks_phase  # noqa: E402
from bench.workers import consumer_run, worker_phase  # noqa: E402
from devstack.processes import database_create, database_drop  # noqa: E402


def _worker_runs(stack: Stack) -> WorkerRuns:
    """The worker runs, for the storage and history phases, which take them as a callable rather
    than importing the worker phase."""

    def run(processes: int, **options) -> dict:
        return consumer_run(stack, "worker", processes, **options)

    return WorkerRuns(run=run, config=CONFIG, problems=problems)


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
        _run_phases(stack, generator, report)
    finally:
        local_sqs.stop()
        if os.environ.get("BENCH_KEEP_DATABASE") != "1":
            database_drop(CONFIG["database"])
    return _write(report, started)


def _run_phases(stack: Stack, generator: str, report: dict) -> None:
    """Each phase named in BENCH_PHASES, in a fixed order, its figures under its own key."""
    phases = CONFIG["phases"]
    if "ingest" in phases:
        report["ingest"] = ingest_phase(stack, generator)
    if "worker" in phases:
        report["worker"] = worker_phase(stack)
    if "money" in phases:
        report["money"] = money_phase(stack)
    if "e2e" in phases:
        report["e2e"] = e2e_phase(stack)
    if "peer" in phases:
        report["peer"] = peer_phase(stack)
    if "recovery" in phases:
        report["recovery"] = recovery_phase(stack)
    if "webhooks" in phases:
        report["webhooks"] = webhooks_phase(stack)
    if "profile" in phases:
        report["profiles"] = profile_phase(stack, generator)
    if "storage" in phases:
        report["storage"] = storage_phase(stack, _worker_runs(stack))
    if "history" in phases:
        report["history"] = history_phase(stack, _worker_runs(stack), empty=report.get("worker"))


def _write(report: dict, started: float) -> int:
    """latest.json and latest.md, the table on the terminal; non-zero when a run went wrong."""
    report["machine"]["load_average_end"] = os.getloadavg()
    cross_phase(report)
    report["wall_seconds"] = round(time.time() - started, 1)
    report["problems"] = problems
    report["guard"] = guard_run(report, RESULTS / "history", keep=CONFIG["guard_keep"])
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
