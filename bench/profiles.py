"""The ``profile`` phase (``BENCH_PROFILE=1``): py-spy samples of the worker draining a queue and
of gunicorn's workers under ingest, taken in runs of their own so the measured runs are not
slowed, summarised as inclusive and self shares per function."""

from pathlib import Path

from bench.ingest import load_callbacks
from bench.options import CALLBACK_PATH, CONFIG
from bench.prepare import queues_create
from bench.stack import RESULTS, Gunicorn, Stack, py_spy, py_spy_finish
from bench.workers import consumer_run
from devstack.processes import ROOT


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


# Where a settled event's CPU goes: each sampled stack goes to the first category one of whose
# markers (a substring of a frame, "function (path)") it holds, in this order.
WORKER_CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("commit", ("_commit (django/db/backends/base/base.py)", "commit (psycopg/")),
    ("savepoint", ("transaction.py)",)),
    ("SQS", ("(callbacks/sqs.py)", "botocore/", "urllib3/")),
    ("lock", ("payment_lock (",)),
    ("write", ("event_write (",)),
    ("parse", ("(callbacks/schema.py)", "fingerprint (payments/events.py)")),
    (
        "start and done records",
        (
            "(callbacks/services/starts.py)",
            "(callbacks/services/outcomes.py)",
            "(callbacks/worker/outcomes.py)",
        ),
    ),  # fmt: skip
    ("ticks and relay", ("_tick (", "_relay (")),
    ("apply, the rest", ("payment_apply_event (",)),
    ("start-up", ("<module> (", "ready (", "setup (")),
)
CALLBACK_CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("SQS send", ("sqs_coalescing.py)", "(callbacks/sqs.py)", "botocore/", "urllib3/")),
    ("signature", ("(payments/signing.py)", "callback_verify (")),
    ("parse", ("(callbacks/schema.py)", "(payments/strictjson.py)", "json/")),
    ("metrics", ("prometheus_client/", "(callbacks/metrics.py)")),
    ("Django and DRF", ("django/", "rest_framework/", "whitenoise/")),
    ("gunicorn", ("gunicorn/",)),
)


# Leaves of a thread that waits for work (py-spy samples some such as active): not an event's.
IDLE_LEAVES = ("_worker (concurrent/futures/thread.py)", "wait (threading.py)")


def profile_breakdown(raw: Path, categories) -> dict[str, float]:
    """Percent of the samples in each category (the rest under "other"; a thread waiting for
    work under "idle threads")."""
    counts: dict[str, int] = {}
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = [_frame_name(f) for f in stack.split(";")]
        if frames[-1] in IDLE_LEAVES:
            counts["idle threads"] = counts.get("idle threads", 0) + count
            continue
        name = next(
            (
                category
                for category, markers in categories
                if any(marker in frame for frame in frames for marker in markers)
            ),
            "other",
        )
        counts[name] = counts.get(name, 0) + count
    if not total:
        return {}
    return {
        name: round(100 * n / total, 1) for name, n in sorted(counts.items(), key=lambda kv: -kv[1])
    }


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
        out["worker"]["breakdown_percent"] = profile_breakdown(raw, WORKER_CATEGORIES)
    name, dlq, _ = queues_create("profile")
    server = Gunicorn(
        stack,
        queue=(name, dlq),
        workers=CONFIG["gunicorn_workers"],
        threads=CONFIG["gunicorn_threads"],
    ).start()
    try:
        load_callbacks(generator, server, CALLBACK_PATH, 2, 5_000)
        seconds = CONFIG["ingest_seconds"]
        spies = [
            py_spy(pid, RESULTS / f"profile-callback-{i}.txt", duration=seconds)
            for i, pid in enumerate(server.worker_pids())
        ]
        load_callbacks(generator, server, CALLBACK_PATH, seconds, CONFIG["ingest_pool"])
        for spy in spies:
            py_spy_finish(spy, 30)
    finally:
        server.stop()
    first = RESULTS / "profile-callback-0.txt"
    if first.exists():
        out["callback"] = profile_summary(first)
        out["callback"]["breakdown_percent"] = profile_breakdown(first, CALLBACK_CATEGORIES)
    for key, summary in out.items():
        lines = [f"{share:5.1f}%  {name}" for name, share in summary.get("inclusive_percent", [])]
        parts = [
            f"{share:5.1f}%  {name}" for name, share in summary.get("breakdown_percent", {}).items()
        ]
        (RESULTS / f"profile-{key}-summary.txt").write_text(
            f"{summary['samples']} samples; by part\n"
            + "\n".join(parts)
            + "\n\ninclusive share\n"
            + "\n".join(lines)
            + "\n"
        )
    return out
