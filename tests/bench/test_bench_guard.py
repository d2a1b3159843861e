"""The regression guard (bench/guard.py): the comparison is pure, so these are plain tests; one
runs the recording and the comparison against a temporary results directory. None of them
measures speed."""

import json

import pytest

from bench import guard
from bench.guard import Figure, compare, headline_figures, noise
from bench.machine import machine_fingerprint
from bench.report import markdown, table

SIZES = {"payments": 2000, "step_rates": [50, 100]}


def _money_run(confirmed: float, cpu: float, created: float = 120.0) -> dict:
    return {"made": 100, "requests": 100, "api_per_second": created, "created_per_second": created,
            "api_p50_ms": 40.0, "api_p99_ms": 90.0, "seconds": 2.0,
            "confirmed_per_second": confirmed, "cpu_ms_per_item": cpu,
            "cpu_ms_per_event": {"web": 4.0, "workers": 4.0, "sqs": 1.0, "postgres": 1.0,
                                 "generator": 3.0}}  # fmt: skip


def _report(**phases) -> dict:
    return {
        "started_at": "2026-12-04T21:00:00+00:00",
        "wall_seconds": 60.0,
        "machine": {
            "cores": 2,
            "cpu": "x",
            "platform": "linux",
            "fingerprint": "2c-x-0000",
            "load_average_start": (0.5, 0.4, 0.3),
            "load_average_end": (1, 1, 1),
        },  # fmt: skip
        "config": {**SIZES, "phases": list(phases), "database": "payments_benchrun"},
        "versions": {"git_commit": "abc1234", "git_tree_clean": True},
        "problems": [],
        **phases,
    }


def _record(figures: dict[str, float], *, sizes=SIZES, problems=0, at="21:00:00") -> dict:
    return {"version": 1, "started_at": f"2026-12-04T{at}+00:00", "sizes": sizes,
            "problems": problems, "commit": "abc", "load_average_start": [0.5],
            "figures": figures}  # fmt: skip


# --- the figures -------------------------------------------------------------------------------


def test_headline_figures_name_each_phases_figures_with_their_kind_and_leave_out_missing_ones():
    report = _report(
        ingest={"generator": "wrk", "callback_vs_minimal": 0.5,
                "callback": {"accepted_per_second": 900.0, "p50_ms": 9.0, "p99_ms": None},
                "minimal": {"accepted_per_second": 1800.0}},
        worker={"summary": {"1": {"worker_events_per_second": 300.0,
                                  "worker_vs_batched_sql": 0.4,
                                  "worker_cpu_ms_per_event": 1.6}}},
        money={"debits": _money_run(50.0, 10.0), "refunds": _money_run(45.0, 12.0),
               "refund_vs_debit_cpu": 1.2},
        e2e={"steady": {"offered_rate": 200, "accepted_to_applied_p99_ms": 80.0},
             "sustained_events_per_second": 200, "pipeline_cpu_ms_per_event": 8.7},
    )  # fmt: skip
    figures = headline_figures(report)
    assert figures["ingest (wrk): callback / minimal view"] == Figure(0.5, "ratio", "higher")
    assert figures["ingest (wrk): callback P50 ms"] == Figure(9.0, "p50", "lower")
    assert "ingest (wrk): callback P99 ms" not in figures  # None: not measured
    assert figures["worker x1: CPU ms per event"] == Figure(1.6, "cpu", "lower")
    assert figures["money, refunds: CPU / debits'"] == Figure(1.2, "ratio", "lower")
    assert figures["money, debits: confirmed/s"] == Figure(50.0, "rate", "higher")
    assert figures["money, refunds: API P99 ms"] == Figure(90.0, "p99", "lower")
    assert figures["e2e at 200/s: accepted->applied P99 ms"] == Figure(80.0, "p99", "lower")
    assert figures["e2e: sustained events/s"] == Figure(200.0, "rate", "higher")
    assert not any(name.startswith(("peer", "recovery", "webhooks")) for name in figures)


def test_sizes_leave_out_the_phases_database_and_history_and_compare_as_json_gives_them_back():
    config = {"payments": 2000, "step_rates": (50, 100), "phases": ["money"], "database": "x",
              "guard_keep": 5}  # fmt: skip
    assert guard.sizes(config) == SIZES


# --- the noise ---------------------------------------------------------------------------------


def test_with_fewer_than_three_runs_the_noise_is_the_kinds_default():
    assert noise([100.0, 110.0], "rate") == (0.15, "default")
    assert noise([100.0, 110.0], "p99") == (0.25, "default")


def test_with_three_runs_or_more_the_noise_is_three_mads_of_the_run_to_run_changes():
    level, source = noise([100.0, 120.0, 96.0, 120.0], "rate")  # +20 %, -20 %, +25 %
    assert source == "4 runs"
    assert level == pytest.approx(3 * 0.05)  # median +20 %, deviations 0, 40, 5 points


def test_the_noise_from_the_spread_is_never_below_the_floor():
    assert noise([100.0, 101.0, 102.01], "rate") == (guard.NOISE_FLOOR, "3 runs")


def test_a_change_from_zero_is_not_a_relative_change():
    assert guard.relative_change(0.0, 5.0) is None
    assert noise([0.0, 5.0, 6.0], "rate") == (0.15, "default")  # one change only


# --- the comparison ----------------------------------------------------------------------------


def test_a_figure_past_its_noise_is_marked_worse_or_better_by_its_direction():
    figures = {
        "rate": Figure(80.0, "rate", "higher"),
        "cpu": Figure(8.0, "cpu", "lower"),
        "p99": Figure(110.0, "p99", "lower"),
    }
    out = compare(figures, SIZES, [_record({"rate": 100.0, "cpu": 10.0, "p99": 100.0})])
    rows = {r["figure"]: r for r in out["rows"]}
    assert rows["rate"]["change"] == pytest.approx(-0.2)
    assert (rows["rate"]["moved"], rows["rate"]["verdict"]) == (True, "worse")
    assert (rows["cpu"]["moved"], rows["cpu"]["verdict"]) == (True, "better")
    assert (rows["p99"]["moved"], rows["p99"]["verdict"]) == (False, None)  # 10 % < 25 %
    assert out["previous"]["started_at"] == "2026-12-04T21:00:00+00:00"


def test_the_noise_comes_from_the_recorded_runs_of_the_same_sizes_only():
    earlier = [
        _record({"rate": 100.0}, at="18:00:00"),
        _record({"rate": 50.0}, sizes={"payments": 200}, at="18:30:00"),
        _record({"rate": 101.0}, at="19:00:00"),
        _record({"rate": 100.0}, at="20:00:00"),
    ]
    out = compare({"rate": Figure(90.0, "rate", "higher")}, SIZES, earlier)
    row = out["rows"][0]
    assert row["previous"] == 100.0 and row["noise_from"] == "3 runs"
    assert row["noise"] == guard.NOISE_FLOOR and row["verdict"] == "worse"  # -10 % past 5 %
    assert out["other_sizes"] == {
        "runs": 1,
        "latest_differs": {
            "payments": {"then": 200, "now": 2000},
            "step_rates": {"then": None, "now": [50, 100]},
        },
    }


def test_a_run_of_other_sizes_is_not_compared_but_says_why():
    figures = {"rate": Figure(90.0, "rate", "higher")}
    out = compare(figures, {"payments": 200}, [_record({"rate": 1.0})])
    assert out["previous"] is None and out["rows"] == []
    assert out["other_sizes"]["runs"] == 1
    assert out["without_previous"] == ["rate"]


def test_a_run_that_reported_problems_is_no_baseline():
    earlier = [_record({"rate": 100.0}, at="20:00:00"), _record({"rate": 10.0}, problems=2)]
    out = compare({"rate": Figure(95.0, "rate", "higher")}, SIZES, earlier)
    assert out["rows"][0]["previous"] == 100.0
    assert out["with_problems"] == 1


def test_a_figure_the_previous_run_did_not_have_is_listed_apart():
    out = compare(
        {"old": Figure(1.0, "rate", "higher"), "new": Figure(2.0, "rate", "higher")},
        SIZES,
        [_record({"old": 1.0})],
    )
    assert [r["figure"] for r in out["rows"]] == ["old"]
    assert out["without_previous"] == ["new"]


@pytest.mark.parametrize(
    ("record", "why"),
    [
        ([1, 2], "not a record but list"),
        ({"version": 7, "sizes": {}, "figures": {}}, "record version 7, not 1"),
        ({"version": 1, "sizes": {}}, "no sizes or figures"),
        ({"version": 1, "sizes": {}, "figures": {"rate": "fast"}}, "a figure that is not a number"),
    ],
)
def test_a_file_that_is_not_a_record_says_why(record, why):
    assert guard.record_problem(record) == why


# --- the files ---------------------------------------------------------------------------------


def _money_report(confirmed: float, started: str) -> dict:
    money = {"items": 100, "clients": 8, "gunicorn": "config.wsgi",
             "worker_command": "run_sqs_worker", "debits": _money_run(confirmed, 10.0),
             "refunds": _money_run(45.0, 11.0)}  # fmt: skip
    return {**_report(money=money), "started_at": started}


def test_runs_are_recorded_compared_with_the_last_one_and_bad_files_skipped(tmp_path):
    report = _money_report(50.0, "2026-12-04T20:00:00+00:00")
    first = guard.guard_run(report, tmp_path, keep=3)
    assert first["previous"] is None and first["notes"] == []
    machine_dir = tmp_path / "2c-x-0000"
    assert (
        json.loads((machine_dir / "20261204T200000Z.json").read_text())["figures"][
            "money, debits: confirmed/s"
        ]
        == 50.0
    )

    (machine_dir / "20261204T203000Z.json").write_text('{"version": 1, "sizes"')
    (machine_dir / "20261204T204000Z.json").symlink_to(tmp_path / "gone.json")
    report = _money_report(30.0, "2026-12-04T21:00:00+00:00")
    second = guard.guard_run(report, tmp_path, keep=3)

    row = next(r for r in second["rows"] if r["figure"] == "money, debits: confirmed/s")
    assert (row["previous"], row["value"], row["verdict"]) == (50.0, 30.0, "worse")
    assert second["notes"][0].startswith("20261204T203000Z.json: not JSON (")
    assert second["notes"][1] == "20261204T204000Z.json: gone before it was read, skipped"
    md = markdown({**report, "guard": second})
    assert "## Against the last run on this machine" in md
    assert (
        "| money, debits: confirmed/s | 50.0 | 30.0 | -40.0% | ±15% (default) | **worse** |" in md
    )
    assert "Skipped history file 20261204T203000Z.json: not JSON" in md
    text = table({**report, "guard": second})
    line = next(li for li in text.splitlines() if li.startswith("against the last"))
    assert "money, debits: confirmed/s -40% (worse)" in line

    guard.guard_run(_money_report(31.0, "2026-12-04T22:00:00+00:00"), tmp_path, keep=3)
    assert sorted(p.name for p in machine_dir.glob("*.json")) == [
        "20261204T204000Z.json",  # the broken link is the oldest of the last 3 kept
        "20261204T210000Z.json",
        "20261204T220000Z.json",
    ]


def test_a_history_that_cannot_be_written_is_a_note_not_a_crash(tmp_path):
    (tmp_path / "2c-x-0000").write_text("a file where the machine's directory should be")
    report = _money_report(50.0, "2026-12-04T20:00:00+00:00")
    out = guard.guard_run(report, tmp_path, keep=20)
    assert out["recorded"] is None
    assert out["notes"][0].startswith("this run could not be recorded (")
    assert "no earlier run of these sizes" in markdown({**report, "guard": out})


def test_the_machine_fingerprint_is_stable_and_tells_machines_apart():
    one = machine_fingerprint("AMD EPYC 7B13 64-Core Processor", 2, 8, "x86_64")
    assert one == machine_fingerprint("AMD EPYC 7B13 64-Core Processor", 2, 8, "x86_64")
    assert one.startswith("2c-amd-epyc-7b13-64-core-processor-")
    assert one != machine_fingerprint("AMD EPYC 7B13 64-Core Processor", 4, 8, "x86_64")


def test_a_run_of_other_sizes_is_recorded_and_its_section_says_why_it_is_not_compared(tmp_path):
    guard.guard_run(_money_report(50.0, "2026-12-04T20:00:00+00:00"), tmp_path, keep=20)
    report = _money_report(50.0, "2026-12-04T21:00:00+00:00")
    report["config"]["payments"] = 200
    out = guard.guard_run(report, tmp_path, keep=20)
    assert out["previous"] is None and out["recorded"].endswith("20261204T210000Z.json")
    md = markdown({**report, "guard": out})
    assert "no earlier run of these sizes to compare with" in md
    assert (
        "1 recorded run(s) of other sizes are not compared (the latest: payments 2000 then, "
        "200 now)." in md
    )
