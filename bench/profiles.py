"""The ``profile`` phase (``BENCH_PROFILE=1``): py-spy samples of the worker draining a queue and
of gunicorn's workers under ingest, taken in runs of their own so the measured runs are not
slowed, summarised as inclusive and self shares per function."""

from pathlib import Path

from bench.ingest import load_callbacks
from bench.options import CALLBACK_PATH, CONFIG
from bench.prepare import queues_create
from bench.stack import RESULTS, Gunicorn, Stack, py_spy
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
        load_callbacks(generator, server, CALLBACK_PATH, 2, 5_000)
        seconds = CONFIG["ingest_seconds"]
        spies = [
            py_spy(pid, RESULTS / f"profile-callback-{i}.txt", duration=seconds)
            for i, pid in enumerate(server.worker_pids())
        ]
        load_callbacks(generator, server, CALLBACK_PATH, seconds, CONFIG["ingest_pool"])
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
