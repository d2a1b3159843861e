"""``BENCH_PHASES=storage``: what an event costs on disk. One worker run on an empty database,
then every pipeline table's size (heap, indexes, TOAST) per event applied, per day at the
seeds' volume, and at steady state under the retention settings."""

from datetime import timedelta

import psycopg

from bench.options import log
from bench.stack import WorkerRuns

DAILY_MESSAGES = 4_200_000  # the seeds' volume


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


def pipeline_tables(conn: psycopg.Connection) -> list[str]:
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
        for table in pipeline_tables(conn):
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
    """The storage report as a Markdown table, as the phase logs it and the report keeps it."""
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
