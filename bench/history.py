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
    the retention settings (``bench.storage``).

The preload is ``bench.preload``, the partitioning experiment ``bench.partitions``.
"""

import time

from bench.options import log
from bench.partitions import partition_experiment
from bench.preload import history_payments_add, history_preload, index_sizes
from bench.stack import WorkerRuns


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


def history_markdown(report: dict) -> str:
    """The history phase's figures as Markdown tables, as the phase logs them and the report
    keeps them."""
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
