"""The benchmark report: the summary table printed at the end of ``make bench`` and the
Markdown written to ``bench/results/latest.md``, both read from the run's JSON report."""

# What the figures are compared with (reported, never enforced).
GOALS = {
    "worker_vs_plain_sql": 0.5,
    "worker_vs_batched_sql": 0.6,
    "callback_vs_minimal": 0.7,
    "callback_vs_minimal_min_round": 0.7,
    "e2e_p99_ms_at_200": 50.0,
    "e2e_p99_ms_at_400": 150.0,
    "sustained_events_per_second": 600,
    "sustained_events_per_second_moonshot": 850,
    "pipeline_cpu_ms_per_event": 3.5,
    "cpu_vs_minimal_parts": 0.5,
    "pipeline_vs_celery_sustained": 3.0,
    "pipeline_vs_celery_cpu": 1 / 3,
    # Money out at the cost of money in: refunds and payouts against the debits of the same run.
    "refund_vs_debit_rate": 0.9,
    "refund_vs_debit_cpu": 1.1,
    "payout_vs_debit_rate": 0.9,
    "payout_vs_debit_cpu": 1.1,
    # Each payment's whole life, from its create to its confirmation, for every kind.
    "money_created_per_second": 100,
    "money_confirmed_per_second": 100,
    "money_cpu_ms_per_payment": 15.0,
}


def fmt(value, digits: int = 0) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return f"{value:,}"


def _rows_written(counters: dict) -> float | None:
    if not counters:
        return None
    return counters["tup_inserted"] + counters["tup_updated"] + counters["tup_deleted"]


HEADERS = ("figure", "value", "baseline", "ratio", "goal")


def summary_rows(report: dict) -> list[tuple[str, str, str, str, str]]:
    """The headline rows, one block per phase that ran."""
    return [
        *_ingest_rows(report),
        *_worker_rows(report),
        *_money_rows(report),
        *_e2e_rows(report),
        *_peer_rows(report),
        *_recovery_rows(report),
        *_webhooks_rows(report),
    ]


def _ingest_rows(report: dict) -> list[tuple[str, str, str, str, str]]:
    rows: list[tuple[str, str, str, str, str]] = []
    ingest = report.get("ingest")
    if ingest:
        cb, mini = ingest["callback"], ingest["minimal"]
        rows.append(
            (
                "callback ingest, accepted/s",
                fmt(cb["accepted_per_second"]),
                f"{fmt(mini['accepted_per_second'])} minimal view",
                fmt(ingest["callback_vs_minimal"], 2),
                f">= {GOALS['callback_vs_minimal']}",
            )
        )
        if "callback_vs_minimal_min_round" in ingest:
            rows.append(
                (
                    "  ... the worst round",
                    "",
                    "",
                    fmt(ingest["callback_vs_minimal_min_round"], 2),
                    f">= {GOALS['callback_vs_minimal_min_round']}",
                )
            )
        if "callback_vs_minimal_even_rounds" in ingest:
            rows.append(
                (
                    "  ... rounds with the web processes even",
                    "",
                    "",
                    fmt(ingest["callback_vs_minimal_even_rounds"], 2),
                    "",
                )
            )
        rows.append(
            (
                "callback ingest P50 / P99 ms",
                f"{fmt(cb['p50_ms'], 1)} / {fmt(cb['p99_ms'], 1)}",
                f"{fmt(mini['p50_ms'], 1)} / {fmt(mini['p99_ms'], 1)}",
                "",
                "",
            )
        )
    return rows


def _worker_rows(report: dict) -> list[tuple[str, str, str, str, str]]:
    rows: list[tuple[str, str, str, str, str]] = []
    worker = report.get("worker")
    if worker:
        for n, s in worker["summary"].items():
            rows.append(
                (
                    f"worker x{n}, events/s",
                    fmt(s["worker_events_per_second"]),
                    f"{fmt(s['plain_sql_events_per_second'])} plain SQL",
                    fmt(s["worker_vs_plain_sql"], 2),
                    f">= {GOALS['worker_vs_plain_sql']}",
                )
            )
            if "batched_sql_events_per_second" in s:
                rows.append(
                    (
                        "",
                        "",
                        f"{fmt(s['batched_sql_events_per_second'])} batched plain SQL",
                        fmt(s["worker_vs_batched_sql"], 2),
                        f">= {GOALS['worker_vs_batched_sql']}",
                    )
                )
            rows.append(
                (
                    "",
                    "",
                    f"{fmt(s['noop_messages_per_second'])} no-op",
                    fmt(s["worker_vs_noop"], 2),
                    "",
                )
            )
    if worker:
        s = worker["summary"]["1"]
        w, p = s["worker_database_per_event"] or {}, s["plain_sql_database_per_event"] or {}
        wb, pb = s["worker_bytes_per_event"] or {}, s["plain_sql_bytes_per_event"] or {}
        rows.append(
            (
                "per event: transactions / rows written / bytes",
                f"{fmt(w.get('xact_commit'), 2)} / "
                f"{fmt(_rows_written(w), 1)} / {fmt(wb.get('total'))}",
                f"{fmt(p.get('xact_commit'), 2)} / "
                f"{fmt(_rows_written(p), 1)} / {fmt(pb.get('total'))} plain SQL",
                "",
                "",
            )
        )
    return rows


def _money_rows(report: dict) -> list[tuple[str, str, str, str, str]]:
    """Each kind's whole life against its goals, then money out against the debits."""
    money = report.get("money")
    if not money or "refunds" not in money:
        return []
    d = money["debits"]
    goals = money.get("goals") or {}
    rows = []
    for what in ("debits", "refunds", "payouts"):
        run = money.get(what)
        if not run:
            continue
        verdicts = goals.get(what, {})
        rows += [
            (
                f"{what}: created/s / confirmed/s (first request to last confirmed)",
                f"{fmt(run.get('created_per_second', run['api_per_second']))} / "
                f"{fmt(run['confirmed_per_second'])}",
                "",
                "",
                f">= {GOALS['money_created_per_second']}: "
                f"{_verdicts(verdicts, 'money_created_per_second')} / "
                f"{_verdicts(verdicts, 'money_confirmed_per_second')}",
            ),
            (
                f"{what}: CPU ms per payment's life (all parts but the generator)",
                fmt(run["cpu_ms_per_item"], 2),
                "" if what == "debits" else f"{fmt(d['cpu_ms_per_item'], 2)} debits",
                "" if what == "debits" else fmt(money.get(f"{what[:-1]}_vs_debit_cpu"), 2),
                f"<= {GOALS['money_cpu_ms_per_payment']:g}: "
                + _verdicts(verdicts, "money_cpu_ms_per_payment")
                + (
                    ""
                    if what == "debits"
                    else f"; ratio <= {GOALS[f'{what[:-1]}_vs_debit_cpu']}: "
                    + _verdicts(verdicts, f"{what[:-1]}_vs_debit_cpu")
                ),
            ),
        ]
        if what != "debits":
            single = what[:-1]
            rows.append(
                (
                    f"{what}: CPU against the debits', each paced by its run's generator CPU",
                    "",
                    "",
                    fmt(money.get(f"{single}_vs_debit_cpu_paced"), 2),
                    "reported (the machine's speed taken out)",
                )
            )
            rows.append(
                (
                    f"{what}: confirmed/s against the debits'",
                    fmt(run["confirmed_per_second"]),
                    f"{fmt(d['confirmed_per_second'])} debits",
                    fmt(money.get(f"{single}_vs_debit_rate"), 2),
                    f">= {GOALS[f'{single}_vs_debit_rate']}: "
                    + _verdicts(verdicts, f"{single}_vs_debit_rate"),
                )
            )
    return rows


def _verdicts(verdicts: dict, *keys: str) -> str:
    """ "met" when every named goal is met, "not met" when one is not, "-" when a figure or the
    verdicts are missing (a report from before the goals)."""
    met = [verdicts.get(key, {}).get("met") for key in keys if key in verdicts]
    if not met or None in met:
        return "-"
    return "met" if all(met) else "not met"


def _e2e_rows(report: dict) -> list[tuple[str, str, str, str, str]]:
    rows: list[tuple[str, str, str, str, str]] = []
    e2e = report.get("e2e")
    if e2e and "steady" in e2e:
        st = e2e["steady"]
        rows.append(
            (
                f"e2e at {st['offered_rate']}/s, accepted->applied P50 / P99 ms",
                f"{fmt(st['accepted_to_applied_p50_ms'], 1)} / "
                f"{fmt(st['accepted_to_applied_p99_ms'], 1)}",
                "",
                "",
                f"P99 <= {GOALS['e2e_p99_ms_at_200']:.0f}",
            )
        )
        sustained = e2e.get("sustained_events_per_second")
        lowest = min(s["offered_rate"] for s in e2e["steps"]) if e2e.get("steps") else None
        rows.append(
            (
                "e2e sustained, events/s",
                fmt(sustained) if sustained else f"< {lowest} (lowest step)",
                "" if e2e.get("limit_reached") else "(no step failed)",
                "",
                f">= {GOALS['sustained_events_per_second']} "
                f"({GOALS['sustained_events_per_second_moonshot']} moonshot)",
            )
        )
        at_400 = next((s for s in e2e.get("steps", []) if s["offered_rate"] == 400), None)
        if at_400 and "accepted_to_applied_p99_ms" in at_400:
            rows.append(
                (
                    "e2e at 400/s, accepted->applied P99 ms",
                    fmt(at_400["accepted_to_applied_p99_ms"], 1),
                    "",
                    "",
                    f"<= {GOALS['e2e_p99_ms_at_400']:.0f}",
                )
            )
        rows += _e2e_cpu_rows(e2e)
    return rows


def _e2e_cpu_rows(e2e: dict) -> list[tuple[str, str, str, str, str]]:
    if "cpu_vs_minimal_parts" not in e2e:
        return []
    parts = e2e.get("minimal_parts_cpu_ms_per_event") or {}
    return [
        (
            "e2e CPU ms per event (all parts but the generator)",
            fmt(e2e.get("pipeline_cpu_ms_per_event"), 2),
            f"{fmt(parts.get('total'), 2)} minimal parts",
            fmt(e2e["cpu_vs_minimal_parts"], 2),
            f"<= {GOALS['pipeline_cpu_ms_per_event']}; ratio >= {GOALS['cpu_vs_minimal_parts']}",
        )
    ]


def _peer_rows(report: dict) -> list[tuple[str, str, str, str, str]]:
    peer, e2e = report.get("peer"), report.get("e2e") or {}
    if not peer:
        return []
    return [
        (
            "sustained events/s, pipeline vs Celery peer",
            fmt(e2e.get("sustained_events_per_second")),
            f"{fmt(peer.get('celery_sustained_events_per_second'))} Celery",
            fmt(peer.get("pipeline_vs_celery_sustained"), 2),
            f">= {GOALS['pipeline_vs_celery_sustained']:.0f}",
        ),
        (
            "CPU ms per event, pipeline vs Celery peer",
            fmt(e2e.get("pipeline_cpu_ms_per_event"), 2),
            f"{fmt(peer.get('celery_cpu_ms_per_event'), 2)} Celery",
            fmt(peer.get("pipeline_vs_celery_cpu"), 2),
            "<= 0.33",
        ),
        (
            f"  ... both at {fmt(peer.get('common_sustained_rate'))}/s",
            "",
            "",
            fmt(peer.get("pipeline_vs_celery_cpu_same_rate"), 2),
            "",
        ),
        (
            f"Celery peer at {(peer.get('steady') or {}).get('offered_rate', '-')}/s, "
            "accepted->applied P99 ms",
            fmt(peer.get("celery_accepted_to_applied_p99_ms"), 1),
            "",
            "",
            "",
        ),
    ]


def _recovery_rows(report: dict) -> list[tuple[str, str, str, str, str]]:
    rec = report.get("recovery")
    if not rec:
        return []
    return [
        (
            f"recovery: {fmt(rec.get('payments'))} held payments all submitted after, s",
            fmt(rec.get("drain_seconds"), 1),
            "",
            "",
            "",
        ),
        (
            "recovery: processor calls/s during the drain, mean / peak 1 s",
            f"{fmt(rec.get('calls_per_second_mean'), 0)} / "
            f"{fmt(rec.get('calls_per_second_peak'), 0)}",
            f"cap {fmt(rec.get('cap_per_second'))}/s",
            "",
            "peak <= cap",
        ),
    ]


def _webhooks_rows(report: dict) -> list[tuple[str, str, str, str, str]]:
    """Deliveries per second, and the senders' CPU per delivery beside the pipeline's per
    event (when the e2e phase ran)."""
    hooks = report.get("webhooks")
    if not hooks:
        return []
    pipeline = (report.get("e2e") or {}).get("pipeline_cpu_ms_per_event")
    per_delivery = hooks.get("cpu_ms_per_delivery")
    ratio = per_delivery / pipeline if per_delivery and pipeline else None
    return [
        (
            f"webhooks: deliveries/s, {fmt(hooks.get('senders'))} senders",
            fmt(hooks.get("deliveries_per_second"), 0),
            "",
            "",
            "",
        ),
        (
            "webhooks: sender CPU ms per delivery",
            fmt(per_delivery, 2),
            f"pipeline {fmt(pipeline, 2)} per event",
            fmt(ratio, 2),
            "",
        ),
    ]


def _machine_line(report: dict) -> str:
    m = report["machine"]
    return (
        f"{m['cores']} cores ({m['cpu']}); load average (1, 5, 15 min) at start "
        f"{' '.join(f'{x:.2f}' for x in m['load_average_start'])}, at end "
        f"{' '.join(f'{x:.2f}' for x in m.get('load_average_end', ()))}"
    )


def table(report: dict) -> str:
    rows = summary_rows(report)
    headers = HEADERS
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(5)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    lines.append("")
    lines.append(_machine_line(report))
    if report.get("ingest"):
        lines.append(f"ingest load generator: {report['ingest']['generator']}")
    if report.get("guard"):
        lines.append(_guard_line(report["guard"]))
    return "\n".join(lines)


def _guard_line(guard: dict) -> str:
    """The regression guard in one line: which figures moved past their noise."""
    previous = guard.get("previous")
    if previous is None:
        return "against the last run on this machine: no earlier run of these sizes"
    moved = [r for r in guard["rows"] if r["moved"]]
    named = "; ".join(f"{r['figure']} {r['change']:+.0%} ({r['verdict']})" for r in moved)
    return (
        f"against the last run on this machine ({previous['started_at']}): {len(moved)} of "
        f"{len(guard['rows'])} figures moved past the noise" + (f": {named}" if named else "")
    )


def _cpu_parts(parts: dict | None) -> str:
    if not parts:
        return "-"
    order = ("web", "workers", "sqs", "postgres", "generator")
    return " / ".join(fmt(parts.get(k), 1) for k in order)


def _md_table(headers: tuple[str, ...], rows: list[tuple]) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |", "|" + " --- |" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


def markdown(report: dict) -> str:
    """The run as Markdown (``bench/results/latest.md``): the headline table, then every round,
    worker run and end-to-end step."""
    v = report.get("versions", {})
    lines = [
        f"Run of {report['started_at']}, {report['wall_seconds']:.0f} s wall, commit "
        f"{v.get('git_commit')}{'' if v.get('git_tree_clean') else ' (tree not clean)'}.",
        "",
        f"Machine: {_machine_line(report)}; {report['machine']['platform']}.",
        "",
        "Versions: "
        + ", ".join(
            f"{k} {val}" for k, val in v.items() if k not in ("git_commit", "git_tree_clean")
        )
        + ".",
        "",
    ]
    lines += _md_table(HEADERS, [tuple(c or " " for c in r) for r in summary_rows(report)])
    lines += _md_ingest(report)
    lines += _md_worker(report)
    lines += _md_money(report)
    lines += _md_e2e(report)
    lines += _md_e2e(report, "peer")
    lines += _md_guard(report.get("guard"), report["machine"].get("load_average_start"))
    if report.get("problems"):
        lines += ["", "Problems: " + "; ".join(report["problems"])]
    return "\n".join(lines) + "\n"


def _md_ingest(report: dict) -> list[str]:
    lines: list[str] = []
    ingest = report.get("ingest")
    if ingest:
        lines += [
            "",
            f"Ingest: {ingest['generator']}, {ingest['connections']} connections, "
            f"{ingest['rounds']} rounds of {ingest['seconds']} s per endpoint; gunicorn "
            f"`{ingest['gunicorn']}`; `CALLBACK_SEND_COALESCE_SECONDS` "
            f"{ingest.get('send_coalesce_seconds', 'default')}.",
            "",
        ]
        rows = []
        for target in ("minimal", "callback"):
            for n, r in enumerate(ingest[target]["rounds"], 1):
                rows.append(
                    (
                        target,
                        n,
                        fmt(r["accepted_per_second"]),
                        fmt(r["p50_ms"], 1),
                        fmt(r["p90_ms"], 1),
                        fmt(r["p99_ms"], 1),
                        fmt(r.get("web_cpu_ms_per_request"), 2),
                        fmt(r.get("sqs_cpu_ms_per_request"), 2),
                        r["other_status"],
                    )
                )
        lines += _md_table(
            (
                "endpoint",
                "round",
                "accepted/s",
                "P50 ms",
                "P90 ms",
                "P99 ms",
                "web CPU ms/request",
                "SQS server CPU ms/request",
                "non-202",
            ),
            rows,
        )
    return lines


def _md_worker(report: dict) -> list[str]:
    lines: list[str] = []
    worker = report.get("worker")
    if worker:
        lines += [
            "",
            f"Worker runs ({worker['events']} events each, one per payment and group):",
            "",
        ]
        rows = []
        for r in worker["runs"].values():
            db = r.get("database_per_event") or {}
            rows.append(
                (
                    r["kind"],
                    r["processes"],
                    fmt(r["rate"]),
                    fmt(r["wall_seconds"], 1),
                    fmt(r.get("consumer_cpu_ms_per_event"), 2),
                    fmt(db.get("xact_commit"), 2),
                    fmt(_rows_written(db), 1),
                    fmt((r.get("bytes_per_event") or {}).get("total")),
                )
            )
        lines += _md_table(
            (
                "consumer",
                "processes",
                "events/s",
                "wall s",
                "consumer CPU ms/event",
                "transactions/event",
                "rows written/event",
                "bytes/event",
            ),
            rows,
        )
    return lines


def _queue_workers(money: dict) -> str:
    """The phase's queue workers, as many as it ran (two in a run from before the count was
    recorded: every earlier run had two)."""
    count = money.get("workers", 2)
    return f"{count} queue worker{'' if count == 1 else 's'}"


def _md_money(report: dict) -> list[str]:
    money = report.get("money")
    if not money or "refunds" not in money:
        return []
    kinds = [w for w in ("debits", "refunds", "payouts") if money.get(w)]
    lines = [
        "",
        f"Money out against money in: {money['items']} debits, then a refund of each"
        + (", then as many payouts" if "payouts" in kinds else "")
        + f", by {money['clients']} API clients; gunicorn `{money['gunicorn']}`, "
        f"{_queue_workers(money)} (`{money['worker_command']}`).",
        "",
    ]
    rows = [
        (
            what,
            fmt(run["made"]),
            fmt(run.get("created_per_second", run["api_per_second"])),
            f"{fmt(run['api_p50_ms'], 1)} / {fmt(run['api_p99_ms'], 1)}",
            fmt(run["seconds"], 1),
            fmt(run["confirmed_per_second"]),
            fmt(run["cpu_ms_per_item"], 2),
            _cpu_parts(run.get("cpu_ms_per_event")),
        )
        for what, run in ((w, money[w]) for w in kinds)
    ]
    lines += _md_table(
        (
            "run",
            "made",
            "API creates/s",
            "API P50 / P99 ms",
            "s to the last confirmed",
            "confirmed/s",
            "CPU ms per payment's life",
            "CPU ms/item web / workers / SQS / PostgreSQL / generator",
        ),
        rows,
    )
    return lines + _md_money_goals(money, kinds)


_MONEY_GOAL_NAMES = {
    "money_created_per_second": "created through the API, per second",
    "money_confirmed_per_second": "confirmed per second, first request to last confirmation",
    "money_cpu_ms_per_payment": "CPU ms per payment's life, every part but the generator",
    "vs_debit_cpu": "CPU per payment against the debits'",
    "vs_debit_rate": "confirmed/s against the debits'",
}


def _md_money_goals(money: dict, kinds: list[str]) -> list[str]:
    """Each kind's figures against the goals, met or not: reported, never enforced."""
    goals = money.get("goals")
    if not goals:
        return []
    rows = []
    for name, title in _MONEY_GOAL_NAMES.items():
        cells, goal = [], None
        for what in kinds:
            key = name if name.startswith("money_") else f"{what[:-1]}_{name}"
            verdict = goals.get(what, {}).get(key)
            if verdict is None:
                cells.append("")
                continue
            goal = f"{verdict['way']} {verdict['goal']:g}"
            met = {True: "met", False: "not met", None: "-"}[verdict["met"]]
            digits = 0 if "per_second" in key else 2
            cells.append(f"{fmt(verdict['value'], digits)}: {met}")
        rows.append((title, goal or "", *cells))
    return [
        "",
        "Against the goals (reported, never enforced):",
        "",
        *_md_table(("figure", "goal", *kinds), rows),
    ]


def _md_e2e(report: dict, key: str = "e2e") -> list[str]:
    """The steady run and the steps of the pipeline (``e2e``) or of the Celery peer (``peer``)."""
    lines: list[str] = []
    e2e = report.get(key)
    if e2e and "steady" in e2e:
        if key == "peer":
            title = f"Celery peer: gunicorn `{e2e['gunicorn']}`, `{e2e['worker_command']}`."
        else:
            title = (
                f"End to end: gunicorn `{e2e['gunicorn']}`, {e2e['workers']} workers "
                f"(`{e2e['worker_command']}`)."
            )
        lines += ["", title, ""]
        rows = []
        for step in [e2e["steady"], *e2e.get("steps", [])]:
            rows.append(
                (
                    step["offered_rate"],
                    step["seconds"],
                    fmt(step.get("accepted_per_second"), 0)
                    if "accepted_per_second" in step
                    else "-",
                    fmt(step.get("applied_per_second")),
                    fmt(step.get("backlog_max")),
                    fmt(step.get("backlog_trend_per_second"), 1),
                    f"{fmt(step['accepted_to_applied_p50_ms'], 0)} / "
                    f"{fmt(step['accepted_to_applied_p99_ms'], 0)}",
                    f"{fmt(step['http_p50_ms'], 1)} / {fmt(step['http_p99_ms'], 1)}",
                    fmt(step.get("cores_busy"), 2),
                    _cpu_parts(step.get("cpu_ms_per_event")),
                    "steady run"
                    if step is e2e["steady"]
                    else ("sustained" if step["sustained"] else "; ".join(step["why_not"])),
                )
            )
        lines += _md_table(
            (
                "offered/s",
                "s",
                "accepted/s",
                "applied/s",
                "backlog max",
                "backlog trend/s",
                "202->applied P50 / P99 ms",
                "HTTP P50 / P99 ms",
                "cores busy",
                "CPU ms/event web / workers / SQS / PostgreSQL / generator",
                "verdict",
            ),
            rows,
        )
    return lines


def _number(value: float) -> str:
    """A figure of any kind with the digits that matter to it."""
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"


def _md_guard(guard: dict | None, load_now) -> list[str]:
    """The regression guard's section (``bench.guard``): each headline figure against the last
    run of the same machine and sizes, those past their noise marked."""
    if not guard:
        return []
    lines = ["", "## Against the last run on this machine", ""]
    previous = guard.get("previous")
    if previous is None:
        lines.append(
            f"Machine `{guard['machine']}`: no earlier run of these sizes to compare with; this "
            "run is recorded for the next."
        )
    else:
        load = previous.get("load_average_start") or []
        moved = [r for r in guard["rows"] if r["moved"]]
        lines += [
            f"Machine `{guard['machine']}`, against the run of {previous['started_at']} (commit "
            f"{previous.get('commit')}, 1-minute load average {_load(load)} at its start; this "
            f"run's {_load(load_now or [])}), the last of {guard['comparable_runs']} recorded "
            "run(s) of these sizes. A figure moved "
            "when its change is past its noise: from the spread of the recorded runs when 3 or "
            "more hold it, else its kind's default (docs/benchmarks.md). Reported, never "
            f"enforced: {len(moved)} of {len(guard['rows'])} figures moved.",
            "",
        ]
        rows = [
            (
                r["figure"],
                _number(r["previous"]),
                _number(r["value"]),
                "-" if r["change"] is None else f"{r['change']:+.1%}",
                f"±{r['noise']:.0%} ({r['noise_from']})",
                f"**{r['verdict']}**" if r["moved"] else "",
            )
            for r in guard["rows"]
        ]
        lines += _md_table(("figure", "previous", "now", "change", "noise", "moved"), rows)
    notes = _guard_notes(guard)
    return lines + (["", *(f"- {note}" for note in notes)] if notes else [])


def _load(load: list) -> str:
    return f"{load[0]:.2f}" if load else "-"


def _guard_notes(guard: dict) -> list[str]:
    notes = []
    other = guard.get("other_sizes")
    if other:
        differs = ", ".join(
            f"{key} {d['then']} then, {d['now']} now" for key, d in other["latest_differs"].items()
        )
        notes.append(
            f"{other['runs']} recorded run(s) of other sizes are not compared (the latest: "
            f"{differs})."
        )
    if guard.get("with_problems"):
        notes.append(
            f"{guard['with_problems']} recorded run(s) of these sizes reported problems and are "
            "no baseline."
        )
    if guard.get("previous") is not None and guard.get("without_previous"):
        notes.append(
            f"{len(guard['without_previous'])} figure(s) without a value in that run: "
            + ", ".join(guard["without_previous"])
            + "."
        )
    notes += [f"Skipped history file {note}." for note in guard.get("notes", [])]
    if guard.get("recorded"):
        notes.append(f"Recorded as `{guard['recorded']}`.")
    return notes
