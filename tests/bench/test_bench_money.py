"""The money phase's payouts and goals (bench/money.py, bench/report.py): the funding of the
payouts and each kind's figures against the goals, as plain tests. None of them measures
speed."""

from decimal import Decimal

import pytest

from bench.money import FUNDING_MAX, MERCHANTS, PAYOUT_AMOUNT, funding, money_goals
from bench.report import markdown, table


def _money_run(
    confirmed: float, cpu: float, created: float = 120.0, generator: float = 3.0
) -> dict:
    return {"made": 100, "requests": 100, "api_per_second": created, "created_per_second": created,
            "api_p50_ms": 40.0, "api_p99_ms": 90.0, "seconds": 2.0,
            "confirmed_per_second": confirmed, "cpu_ms_per_item": cpu,
            "cpu_ms_per_event": {"web": 4.0, "workers": 4.0, "sqs": 1.0, "postgres": 1.0,
                                 "generator": generator}}  # fmt: skip


def _report(money: dict) -> dict:
    return {
        "started_at": "2026-12-04T21:00:00+00:00",
        "wall_seconds": 60.0,
        "machine": {
            "cores": 2,
            "cpu": "x",
            "platform": "linux",
            "load_average_start": (0.5, 0.4, 0.3),
            "load_average_end": (1, 1, 1),
        },  # fmt: skip
        "versions": {"git_commit": "abc1234", "git_tree_clean": True},
        "problems": [],
        "money": money,
    }


def test_each_kind_of_payment_is_held_to_the_goals_of_its_whole_life():
    out = {"debits": _money_run(120.0, 14.0), "refunds": _money_run(101.0, 15.8, created=99.0),
           "payouts": _money_run(80.0, 15.0),
           "refund_vs_debit_rate": 0.84, "refund_vs_debit_cpu": 1.13,
           "payout_vs_debit_rate": 0.67, "payout_vs_debit_cpu": None}  # fmt: skip
    goals = money_goals(out)
    assert goals["debits"]["money_confirmed_per_second"] == {
        "value": 120.0, "goal": 100, "way": ">=", "met": True
    }  # fmt: skip
    assert goals["debits"]["money_cpu_ms_per_payment"]["met"] is True
    assert "refund_vs_debit_cpu" not in goals["debits"]
    assert goals["refunds"]["money_created_per_second"]["met"] is False
    assert goals["refunds"]["money_cpu_ms_per_payment"]["met"] is False
    assert goals["refunds"]["refund_vs_debit_cpu"]["met"] is False
    assert goals["payouts"]["money_cpu_ms_per_payment"]["met"] is True  # 15.0 <= 15
    assert goals["payouts"]["payout_vs_debit_cpu"]["met"] is None  # not measured


def test_the_report_states_each_kinds_rates_cpu_and_goals():
    debits, refunds = _money_run(120.0, 14.0), _money_run(101.0, 15.8, created=99.0)
    money = {"items": 100, "clients": 8, "gunicorn": "config.wsgi --workers 1", "workers": 1,
             "worker_command": "run_sqs_worker", "debits": debits, "refunds": refunds,
             "payouts": _money_run(80.0, 15.0), "refund_vs_debit_rate": 0.84,
             "refund_vs_debit_cpu": 1.13, "payout_vs_debit_rate": 0.67,
             "payout_vs_debit_cpu": 1.07, "refund_vs_debit_cpu_paced": 0.95}  # fmt: skip
    money["goals"] = money_goals(money)
    report = _report(money)
    lines = table(report).splitlines()
    created = next(li for li in lines if li.startswith("refunds: created/s / confirmed/s"))
    assert "99 / 101" in created and created.rstrip().endswith(">= 100: not met / met")
    cpu = next(li for li in lines if li.startswith("refunds: CPU ms per payment's life"))
    assert "15.80" in cpu and "14.00 debits" in cpu and "1.13" in cpu
    assert cpu.rstrip().endswith("<= 15: not met; ratio <= 1.1: not met")
    cpu = next(li for li in lines if li.startswith("payouts: CPU ms per payment's life"))
    assert cpu.rstrip().endswith("<= 15: met; ratio <= 1.1: met")
    md = markdown(report)
    assert "gunicorn `config.wsgi --workers 1`, 1 queue worker (`run_sqs_worker`)." in md
    assert "| payouts | 100 | 120 | 40.0 / 90.0 | 2.0 | 80 | 15.00 |" in md
    assert (
        "| CPU ms per payment's life, every part but the generator | <= 15 | 14.00: met "
        "| 15.80: not met | 15.00: met |" in md
    )
    assert "| CPU per payment against the debits' | <= 1.1 |  | 1.13: not met | 1.07: met |" in md
    paced = next(
        li for li in lines if li.startswith("refunds: CPU against the debits', each paced")
    )
    assert "0.95" in paced and "reported" in paced


def test_the_paced_ratio_takes_the_machines_speed_out_of_the_cpu_ratio():
    from bench.money import _paced_ratio

    debits = _money_run(100.0, 15.0, generator=3.0)
    # The machine a fifth slower through the refunds: their CPU and the generator's alike.
    refunds = _money_run(100.0, 18.0, generator=3.6)
    assert _paced_ratio(refunds, debits) == pytest.approx(1.0)
    assert _paced_ratio(_money_run(100.0, 16.5, generator=3.0), debits) == pytest.approx(1.1)
    assert _paced_ratio(_money_run(100.0, 16.5, generator=0.0), debits) is None


@pytest.mark.parametrize("payouts", [1, 10, 55, 1000, 25_000])
def test_the_funding_debits_cover_every_merchants_payouts_each_below_the_largest(payouts):
    count, amount = funding(payouts, 50)
    assert count % len(MERCHANTS) == 0 and amount <= FUNDING_MAX
    each_merchant = -(-payouts // len(MERCHANTS)) + 5
    assert amount * (count // len(MERCHANTS)) >= each_merchant * PAYOUT_AMOUNT
    assert amount * (count // len(MERCHANTS)) - each_merchant * PAYOUT_AMOUNT < Decimal("0.10")


# --- the phase's queue workers and web processes ----------------------------------------------


@pytest.mark.parametrize(
    ("variable", "option"),
    [("BENCH_MONEY_WORKERS", "money_workers"),
     ("BENCH_MONEY_GUNICORN_WORKERS", "money_gunicorn_workers")],
)  # fmt: skip
def test_the_money_phase_runs_one_queue_worker_and_one_web_process_unless_told_and_refuses_none(
    monkeypatch, variable, option
):
    from bench import guard
    from bench.options import _config

    monkeypatch.delenv("BENCH_MONEY_WORKERS", raising=False)
    monkeypatch.delenv("BENCH_MONEY_GUNICORN_WORKERS", raising=False)
    monkeypatch.delenv("BENCH_GUNICORN_WORKERS", raising=False)
    one = _config()
    assert one[option] == 1
    # The other phases' web processes are their own option.
    assert one["gunicorn_workers"] == 2
    monkeypatch.setenv(variable, "2")
    two = _config()
    assert two[option] == 2
    # A size: the regression guard compares a run only with runs of the same count.
    assert guard.sizes(one) != guard.sizes(two)
    monkeypatch.setenv(variable, "0")
    with pytest.raises(SystemExit, match=f"{variable} must be at least 1, got 0"):
        _config()


def test_the_report_names_a_run_without_its_worker_count_as_one_of_two():
    from bench.report import _queue_workers

    assert _queue_workers({"workers": 1}) == "1 queue worker"
    assert _queue_workers({"workers": 3}) == "3 queue workers"
    # Runs recorded before the count: the phase ran two then.
    assert _queue_workers({}) == "2 queue workers"
