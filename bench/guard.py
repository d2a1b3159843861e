"""The regression guard: each run's headline figures beside the last runs of the same machine.

Every ``make bench`` records its headline figures (``headline_figures``: every phase's ratios,
rates, P50/P99 and CPU per event or payment) in ``bench/results/history/<machine>/<time>.json``
(git-ignored; the last ``BENCH_GUARD_KEEP``, 20, of each machine), and the report's section
"Against the last run on this machine" lists each figure with the last comparable run's value,
this run's and the change, marking those that moved by more than the noise.

- **Comparable** runs are of the same machine (``bench.machine.machine_fingerprint``) and the
  same sizes (every ``BENCH_*`` option but the phases and the database's name): a run of other
  sizes is recorded, compared only with runs of its own sizes, and the section says so. A run
  that reported problems is recorded but is no baseline: its figures may be of a broken run.
- **The noise** of a figure: with 3 or more earlier comparable runs holding it, 3 times the
  median absolute deviation of its relative changes from one of them to the next (about two
  standard deviations of a run-to-run change), at least ``NOISE_FLOOR``; with fewer, the
  default of its kind (``DEFAULT_NOISE``).
- A history file that is missing, unreadable or not a record is named in the section and
  skipped; a history that cannot be written is named too. The guard never fails a run: it
  reports, and CI never runs it.

The comparison (``headline_figures``, ``compare``, ``noise``) is pure; ``guard_run`` reads and
writes the files.
"""

import itertools
import json
import math
import statistics
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import NamedTuple

# Each kind's noise while a machine has fewer than MIN_RUNS comparable runs: a relative change.
# Two quiet runs of one machine differed by 18 % in a rate (docs/benchmarks.md); tails move more.
DEFAULT_NOISE = {
    "ratio": 0.15,
    "rate": 0.15,
    "cpu": 0.15,
    "p50": 0.15,
    "p99": 0.25,
    "seconds": 0.15,
}
MIN_RUNS = 3
NOISE_MADS = 3.0
# Below this the noise would flag the rounding of the figures themselves.
NOISE_FLOOR = 0.05
# Options that do not change what a figure measures.
NOT_SIZES = ("phases", "database", "guard_keep")
RECORD_VERSION = 1


class Figure(NamedTuple):
    value: float
    kind: str  # a key of DEFAULT_NOISE
    better: str  # "higher" or "lower"


def headline_figures(report: dict) -> dict[str, Figure]:
    """Every phase's headline figures that this run has, by a name stable from run to run."""
    figures: dict[str, Figure] = {}
    for name, value, kind, better in _figures(report):
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            figures[name] = Figure(float(value), kind, better)
    return figures


def _figures(report: dict) -> Iterator[tuple[str, object, str, str]]:
    yield from _ingest_figures(report.get("ingest") or {})
    yield from _worker_figures(report.get("worker") or {})
    yield from _money_figures(report.get("money") or {})
    yield from _e2e_figures(report.get("e2e") or {})
    yield from _peer_figures(report.get("peer") or {})
    recovery = report.get("recovery") or {}
    yield (
        "recovery: seconds to submit the held payments",
        recovery.get("drain_seconds"),
        "seconds",
        "lower",
    )
    yield (
        "recovery: processor calls/s, mean",
        recovery.get("calls_per_second_mean"),
        "rate",
        "higher",
    )
    hooks = report.get("webhooks") or {}
    yield "webhooks: deliveries/s", hooks.get("deliveries_per_second"), "rate", "higher"
    yield "webhooks: sender CPU ms per delivery", hooks.get("cpu_ms_per_delivery"), "cpu", "lower"
    for processes, loaded in ((report.get("history") or {}).get("loaded") or {}).items():
        at = f"history, worker x{processes} on the history"
        yield f"{at}: events/s", loaded.get("events_per_second"), "rate", "higher"
        yield f"{at}: CPU ms per event", loaded.get("cpu_ms_per_event"), "cpu", "lower"
        yield f"{at}: rate / empty database's", loaded.get("rate_vs_empty"), "ratio", "higher"
        yield f"{at}: CPU / empty database's", loaded.get("cpu_vs_empty"), "ratio", "lower"


def _ingest_figures(ingest: dict) -> Iterator[tuple[str, object, str, str]]:
    """Named by the generator: wrk's figures and the Python generator's are never compared."""
    if not ingest:
        return
    at = f"ingest ({ingest.get('generator')})"
    callback, minimal = ingest.get("callback") or {}, ingest.get("minimal") or {}
    yield f"{at}: callback accepted/s", callback.get("accepted_per_second"), "rate", "higher"
    yield f"{at}: minimal view accepted/s", minimal.get("accepted_per_second"), "rate", "higher"
    yield f"{at}: callback / minimal view", ingest.get("callback_vs_minimal"), "ratio", "higher"
    yield (
        f"{at}: callback / minimal view, worst round",
        ingest.get("callback_vs_minimal_min_round"),
        "ratio",
        "higher",
    )
    yield f"{at}: callback P50 ms", callback.get("p50_ms"), "p50", "lower"
    yield f"{at}: callback P99 ms", callback.get("p99_ms"), "p99", "lower"
    yield (
        f"{at}: callback web CPU ms per request",
        callback.get("web_cpu_ms_per_request"),
        "cpu",
        "lower",
    )


def _worker_figures(worker: dict) -> Iterator[tuple[str, object, str, str]]:
    for processes, s in (worker.get("summary") or {}).items():
        at = f"worker x{processes}"
        yield f"{at}: events/s", s.get("worker_events_per_second"), "rate", "higher"
        yield (
            f"{at}: batched floor events/s",
            s.get("batched_sql_events_per_second"),
            "rate",
            "higher",
        )
        yield (
            f"{at}: per-message floor events/s",
            s.get("plain_sql_events_per_second"),
            "rate",
            "higher",
        )
        yield f"{at}: worker / batched floor", s.get("worker_vs_batched_sql"), "ratio", "higher"
        yield f"{at}: worker / per-message floor", s.get("worker_vs_plain_sql"), "ratio", "higher"
        yield f"{at}: CPU ms per event", s.get("worker_cpu_ms_per_event"), "cpu", "lower"


def _money_figures(money: dict) -> Iterator[tuple[str, object, str, str]]:
    for what in ("debits", "refunds", "payouts"):
        run = money.get(what) or {}
        if not run:
            continue
        at = f"money, {what}"
        yield f"{at}: created/s", run.get("created_per_second"), "rate", "higher"
        yield f"{at}: confirmed/s", run.get("confirmed_per_second"), "rate", "higher"
        yield f"{at}: API P50 ms", run.get("api_p50_ms"), "p50", "lower"
        yield f"{at}: API P99 ms", run.get("api_p99_ms"), "p99", "lower"
        yield f"{at}: CPU ms per payment's life", run.get("cpu_ms_per_item"), "cpu", "lower"
        if what != "debits":
            single = what[:-1]
            yield (
                f"{at}: confirmed/s / debits'",
                money.get(f"{single}_vs_debit_rate"),
                "ratio",
                "higher",
            )
            yield f"{at}: CPU / debits'", money.get(f"{single}_vs_debit_cpu"), "ratio", "lower"


def _e2e_figures(e2e: dict) -> Iterator[tuple[str, object, str, str]]:
    steady = e2e.get("steady") or {}
    if steady:
        at = f"e2e at {steady.get('offered_rate')}/s"
        yield (
            f"{at}: accepted->applied P50 ms",
            steady.get("accepted_to_applied_p50_ms"),
            "p50",
            "lower",
        )
        yield (
            f"{at}: accepted->applied P99 ms",
            steady.get("accepted_to_applied_p99_ms"),
            "p99",
            "lower",
        )
    for step in e2e.get("steps") or []:
        if step.get("offered_rate") == 400:
            yield (
                "e2e at 400/s: accepted->applied P99 ms",
                step.get("accepted_to_applied_p99_ms"),
                "p99",
                "lower",
            )
    yield "e2e: sustained events/s", e2e.get("sustained_events_per_second"), "rate", "higher"
    yield "e2e: CPU ms per event", e2e.get("pipeline_cpu_ms_per_event"), "cpu", "lower"
    yield "e2e: minimal parts' CPU / pipeline's", e2e.get("cpu_vs_minimal_parts"), "ratio", "higher"


def _peer_figures(peer: dict) -> Iterator[tuple[str, object, str, str]]:
    yield (
        "peer: Celery sustained events/s",
        peer.get("celery_sustained_events_per_second"),
        "rate",
        "higher",
    )
    yield "peer: Celery CPU ms per event", peer.get("celery_cpu_ms_per_event"), "cpu", "lower"
    yield (
        "peer: Celery accepted->applied P99 ms",
        peer.get("celery_accepted_to_applied_p99_ms"),
        "p99",
        "lower",
    )
    yield (
        "peer: pipeline / Celery sustained",
        peer.get("pipeline_vs_celery_sustained"),
        "ratio",
        "higher",
    )
    yield "peer: pipeline / Celery CPU", peer.get("pipeline_vs_celery_cpu"), "ratio", "lower"


def sizes(config: dict) -> dict:
    """The options that make two runs' figures comparable, as JSON gives them back (lists, not
    tuples), so a recorded run's compare equal to this one's."""
    return json.loads(json.dumps({k: v for k, v in config.items() if k not in NOT_SIZES}))


def relative_change(before: float, after: float) -> float | None:
    """(after - before) / |before|; None from 0, where no change is relative."""
    if before == 0:
        return None
    return (after - before) / abs(before)


def noise(values: list[float], kind: str) -> tuple[float, str]:
    """A figure's noise as a relative change, from its earlier comparable values (oldest first),
    and where it comes from: their spread when there are MIN_RUNS or more, else the kind's
    default."""
    changes = [
        c for c in (relative_change(a, b) for a, b in itertools.pairwise(values)) if c is not None
    ]
    if len(values) < MIN_RUNS or len(changes) < MIN_RUNS - 1:
        return DEFAULT_NOISE[kind], "default"
    middle = statistics.median(changes)
    mad = statistics.median(abs(c - middle) for c in changes)
    return max(NOISE_MADS * mad, NOISE_FLOOR), f"{len(values)} runs"


def compare(figures: dict[str, Figure], run_sizes: dict, earlier: list[dict]) -> dict:
    """This run's figures against the earlier records of its machine (oldest first): the last
    comparable run, one row per figure both have, and what was left out and why."""
    same = [r for r in earlier if r["sizes"] == run_sizes]
    baselines = [r for r in same if not r.get("problems")]
    out: dict = {
        "runs_recorded": len(earlier),
        "other_sizes": _other_sizes(earlier, run_sizes),
        "with_problems": len(same) - len(baselines),
        "previous": None,
        "rows": [],
        "without_previous": [],
    }
    if not baselines:
        out["without_previous"] = sorted(figures)
        return out
    previous = baselines[-1]
    out["previous"] = {k: previous.get(k) for k in ("started_at", "commit", "load_average_start")}
    out["comparable_runs"] = len(baselines)
    for name, figure in figures.items():
        before = previous["figures"].get(name)
        if before is None:
            out["without_previous"].append(name)
            continue
        history = [r["figures"][name] for r in baselines if name in r["figures"]]
        out["rows"].append(_row(name, figure, before, history))
    return out


def _row(name: str, figure: Figure, before: float, history: list[float]) -> dict:
    change = relative_change(before, figure.value)
    level, source = noise(history, figure.kind)
    moved = change is not None and abs(change) > level
    went_up = figure.value > before
    better = went_up == (figure.better == "higher")
    return {
        "figure": name,
        "kind": figure.kind,
        "previous": before,
        "value": figure.value,
        "change": change,
        "noise": level,
        "noise_from": source,
        "moved": moved,
        "verdict": ("better" if better else "worse") if moved else None,
    }


def _other_sizes(earlier: list[dict], run_sizes: dict) -> dict | None:
    """How many recorded runs have other sizes, and how the latest of them differs."""
    other = [r for r in earlier if r["sizes"] != run_sizes]
    if not other:
        return None
    last = other[-1]["sizes"]
    keys = sorted(set(last) | set(run_sizes))
    return {
        "runs": len(other),
        "latest_differs": {
            k: {"then": last.get(k), "now": run_sizes.get(k)}
            for k in keys
            if last.get(k) != run_sizes.get(k)
        },
    }


# --- the files ----------------------------------------------------------------------------------


def record_of(report: dict, figures: dict[str, Figure]) -> dict:
    """What the history keeps of a run."""
    versions = report.get("versions") or {}
    return {
        "version": RECORD_VERSION,
        "started_at": report["started_at"],
        "machine": report["machine"]["fingerprint"],
        "sizes": sizes(report["config"]),
        "phases": report["config"].get("phases"),
        "commit": versions.get("git_commit"),
        "tree_clean": versions.get("git_tree_clean"),
        "load_average_start": list(report["machine"].get("load_average_start") or ()),
        "problems": len(report.get("problems") or ()),
        "figures": {name: figure.value for name, figure in figures.items()},
    }


def record_problem(record: object) -> str | None:
    """Why a loaded file is not a record this guard can read, or None."""
    if not isinstance(record, dict):
        return f"not a record but {type(record).__name__}"
    if record.get("version") != RECORD_VERSION:
        return f"record version {record.get('version')!r}, not {RECORD_VERSION}"
    if not isinstance(record.get("sizes"), dict) or not isinstance(record.get("figures"), dict):
        return "no sizes or figures"
    if not all(isinstance(v, int | float) for v in record["figures"].values()):
        return "a figure that is not a number"
    return None


def history_load(directory: Path) -> tuple[list[dict], list[str]]:
    """The records of a machine's directory, oldest first (their names are their times), and a
    note for each file skipped."""
    records, notes = [], []
    paths = sorted(directory.glob("*.json")) if directory.is_dir() else []
    for path in paths:
        try:
            record = json.loads(path.read_text())
        except FileNotFoundError:
            notes.append(f"{path.name}: gone before it was read, skipped")
            continue
        except (OSError, UnicodeDecodeError) as exc:
            notes.append(f"{path.name}: unreadable ({exc}), skipped")
            continue
        except ValueError as exc:
            notes.append(f"{path.name}: not JSON ({exc}), skipped")
            continue
        problem = record_problem(record)
        if problem:
            notes.append(f"{path.name}: {problem}, skipped")
            continue
        records.append(record)
    return records, notes


def record_write(directory: Path, record: dict, keep: int) -> Path:
    """The record as ``<time>.json``, written whole or not at all (a new file renamed into
    place), then the machine's oldest records past the last ``keep`` removed."""
    directory.mkdir(parents=True, exist_ok=True)
    stamp = datetime.fromisoformat(record["started_at"]).strftime("%Y%m%dT%H%M%SZ")
    path, n = directory / f"{stamp}.json", 1
    while path.exists():
        n += 1
        path = directory / f"{stamp}_{n}.json"  # after the first in name order
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps(record, indent=1))
    partial.replace(path)
    for old in sorted(directory.glob("*.json"))[:-keep]:
        old.unlink(missing_ok=True)
    return path


def guard_run(report: dict, root: Path, *, keep: int) -> dict:
    """Compare the run with the earlier records of its machine under ``root``, then record it.
    Whatever goes wrong with the files is a note in the result, never an exception."""
    figures = headline_figures(report)
    machine = report["machine"]["fingerprint"]
    directory = root / machine
    earlier, notes = history_load(directory)
    result = compare(figures, sizes(report["config"]), earlier)
    result["machine"] = machine
    try:
        written = record_write(directory, record_of(report, figures), max(keep, 1))
        result["recorded"] = str(written)
    except OSError as exc:
        notes.append(f"this run could not be recorded ({exc})")
        result["recorded"] = None
    result["notes"] = notes
    return result
