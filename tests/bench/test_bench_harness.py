"""The benchmark's own pieces: signed callback pools, the minimal baseline view, the load
generator, the statistics and the payment fixture. None of these tests measures speed."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psycopg
import pytest
from django.db import connection
from django.test import Client

from bench import events, loadgen, stats
from bench.prepare import payments_reset
from bench.profiles import profile_summary
from bench.urls import MINIMAL_PATH
from callbacks.schema import parse_processor_event
from devstack.processes import ROOT
from payments import signing
from payments.models import Payment

SECRETS = ["bench-secret-a", "bench-secret-b"]


def test_signed_pool_holds_distinct_callbacks_each_verifying_against_its_body(tmp_path):
    path = tmp_path / "pool.tsv"
    timestamp = events.write_signed_pool(path, 40, SECRETS, run="t")
    lines = path.read_text().splitlines()
    assert len(lines) == 40
    ids = set()
    for line in lines:
        header, body = line.split("\t", 1)
        signing.verify(header, body.encode(), SECRETS[1:], now=timestamp)
        event = parse_processor_event(json.loads(body))
        assert event.event_type == "settled"
        ids.add(event.processor_event_id)
    assert len(ids) == 40


def test_a_pool_line_signed_with_another_secret_fails_verification(tmp_path):
    path = tmp_path / "pool.tsv"
    events.write_signed_pool(path, 1, ["other-secret"], run="t")
    header, body = path.read_text().rstrip("\n").split("\t", 1)
    with pytest.raises(signing.SignatureError):
        signing.verify(header, body.encode(), SECRETS)


@pytest.fixture
def bench_urls(settings):
    settings.ROOT_URLCONF = "bench.urls"


def test_minimal_view_answers_202_to_a_valid_callback_body(bench_urls):
    callback = events.settled_callback("0f3c7d2e-7a55-4c1e-9d0b-2b7f1d9e4a10", "evt_1")
    response = Client().post(MINIMAL_PATH, callback.body, content_type="application/json")
    assert response.status_code == 202
    assert response.json() == {"status": "accepted", "processor_event_id": "evt_1"}


def test_minimal_view_answers_400_naming_each_bad_field(bench_urls):
    body = {
        "payment_id": "not-a-uuid",
        "event_type": "settled",
        "processor_event_id": "evt 1",
        "amount": "0.00",
        "timestamp": "yesterday",
    }
    response = Client().post(MINIMAL_PATH, json.dumps(body), content_type="application/json")
    assert response.status_code == 400
    assert set(response.json()["errors"]) == {
        "payment_id",
        "processor_event_id",
        "amount",
        "timestamp",
    }


class _Answer202(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: list[bytes] = []

    def do_POST(self):  # noqa: N802 - http.server's naming
        length = int(self.headers["Content-Length"])
        body = self.rfile.read(length)
        status = 400 if b"bad" in body else 202
        type(self).seen.append(body)
        self.send_response(status)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass


@pytest.fixture
def http_server():
    _Answer202.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Answer202)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _factory(port: int):
    def make(n: int) -> tuple[str, bytes]:
        body = b"bad" if n == 3 else f"body-{n}".encode()
        return f"k{n}", loadgen.build_request("127.0.0.1", port, "/x", body, {})

    return make


def test_open_loop_sends_each_scheduled_request_once_and_records_every_answer(http_server):
    port = http_server.server_address[1]
    result = loadgen.open_loop(
        "127.0.0.1", port, _factory(port), rate=40, seconds=0.25, connections=3
    )
    assert sorted(s.key for s in result.samples) == [f"k{n}" for n in range(10)]
    assert sorted(_Answer202.seen) == sorted([b"bad"] + [f"body-{n}".encode() for n in range(10)
                                                          if n != 3])  # fmt: skip
    assert result.count(202) == 9 and result.count(400) == 1
    assert all(s.intended <= s.sent <= s.answered for s in result.samples)


def test_open_loop_counts_refused_connections_as_errors():
    with ThreadingHTTPServer(("127.0.0.1", 0), _Answer202) as closed:
        port = closed.server_address[1]  # bound, then closed: nothing listens any more
    result = loadgen.open_loop("127.0.0.1", port, _factory(port), rate=20, seconds=0.1,
                               connections=2)  # fmt: skip
    assert result.count(0) == 2
    assert result.errors == {"ConnectionRefusedError": 2}


def test_closed_loop_keeps_connections_busy_until_the_deadline(http_server):
    port = http_server.server_address[1]
    result = loadgen.closed_loop("127.0.0.1", port, _factory(port), seconds=0.2, connections=2)
    assert len(result.samples) == len(_Answer202.seen) > 0
    assert result.count(202) + result.count(400) == len(result.samples)


def test_percentile_is_nearest_rank():
    values = list(range(1, 101))
    assert stats.percentile(values, 50) == 50
    assert stats.percentile(values, 99) == 99
    assert stats.percentile(values, 100) == 100
    assert stats.percentile([7.0], 99) == 7.0
    assert stats.percentile([], 50) is None
    with pytest.raises(ValueError, match="within 0..100"):
        stats.percentile(values, 101)


def test_rate_counts_intervals_between_first_and_last_completion():
    assert stats.rate(11, 100.0, 102.0) == 5.0
    assert stats.rate(1, 100.0, 100.0) is None
    assert stats.rate(5, None, 3.0) is None


def test_backlog_growth_is_a_trend_not_a_wobble():
    flat = [(t, 10.0 + (3 if t % 2 else -3)) for t in range(20)]
    growing = [(t, 40.0 * t) for t in range(20)]
    slow_growth = [(t, 1.0 * t) for t in range(20)]
    assert not stats.backlog_grows(flat, 400)
    assert stats.backlog_grows(growing, 400)
    assert not stats.backlog_grows(slow_growth, 400)
    assert stats.backlog_grows([(0, 0.0), (1, 900.0)], 400)
    assert stats.slope([(0, 1.0), (2, 5.0)]) == 2.0


def test_profile_summary_shares_samples_by_function(tmp_path):
    raw = tmp_path / "profile.txt"
    root = ROOT  # wherever this checkout lives (CI clones it into another folder)
    raw.write_text(
        f"main ({root}/manage.py:10);apply ({root}/payments/services.py:5) 3\n"
        f"main ({root}/manage.py:10);recv (/x/site-packages/botocore/client.py:9) 1\n"
    )
    summary = profile_summary(raw)
    assert summary["samples"] == 4
    assert dict(summary["inclusive_percent"])["main (manage.py)"] == 100.0
    assert dict(summary["self_percent"]) == {
        "apply (payments/services.py)": 75.0,
        "recv (botocore/client.py)": 25.0,
    }


@pytest.mark.django_db(transaction=True)
def test_payments_reset_writes_submitted_payments_the_models_can_read():
    s = connection.settings_dict
    url = f"postgres://{s['USER']}@{s['HOST']}:{s['PORT']}/{s['NAME']}"
    payments_reset(url, 3)
    ids = payments_reset(url, 5)  # a second reset starts from empty tables
    assert sorted(str(i) for i in Payment.objects.values_list("id", flat=True)) == sorted(ids)
    payment = Payment.objects.get(pk=ids[0])
    assert payment.state == "submitted" and payment.amount == events.AMOUNT
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT count(*) FROM payments_payment").fetchone()[0] == 5


def test_backlog_trend_ignores_the_ramp_up_at_the_start_of_a_step():
    ramp_then_flat = [(t / 2, min(t, 8) * 2.5) for t in range(30)]  # 0 -> 20 in 4 s, then flat
    assert stats.slope(ramp_then_flat) > 0.5
    assert stats.backlog_trend(ramp_then_flat, settle=4.0) == 0.0
    assert not stats.backlog_grows(ramp_then_flat, 100, settle=4.0)


def _report() -> dict:
    ingest_round = {
        "accepted_per_second": 900.0,
        "p50_ms": 10.0,
        "p90_ms": 20.0,
        "p99_ms": 40.0,
        "other_status": 0,
    }
    run = {"kind": "worker", "processes": 1, "rate": 250.0, "wall_seconds": 41.0,
           "consumer_cpu_ms_per_event": 2.3, "bytes_per_event": {"total": 3100.0},
           "database_per_event": {"xact_commit": 2.1, "xact_rollback": 0.0, "tup_inserted": 4.0,
                                  "tup_updated": 2.0, "tup_deleted": 0.0}}  # fmt: skip
    step = {"offered_rate": 400, "seconds": 15, "accepted_per_second": 399.0,
            "applied_per_second": None, "backlog_max": 900.0, "backlog_trend_per_second": 60.0,
            "accepted_to_applied_p50_ms": None, "accepted_to_applied_p99_ms": None,
            "http_p50_ms": 9.0, "http_p99_ms": 30.0, "sustained": False,
            "why_not": ["the queue backlog kept growing"]}  # fmt: skip
    return {
        "started_at": "2026-11-29T21:00:00+00:00",
        "wall_seconds": 500.0,
        "machine": {"cores": 2, "cpu": "x", "platform": "linux", "load_average_start": (1, 2, 3),
                    "load_average_end": (2, 2, 3)},  # fmt: skip
        "versions": {"python": "3.11", "git_commit": "abc", "git_tree_clean": True},
        "ingest": {"generator": "wrk", "connections": 16, "rounds": 1, "seconds": 10,
                   "gunicorn": "config.wsgi", "callback_vs_minimal": 0.5,
                   "minimal": {**ingest_round, "accepted_per_second": 1800.0,
                               "rounds": [ingest_round]},
                   "callback": {**ingest_round, "rounds": [ingest_round]}},  # fmt: skip
        "worker": {"events": 10, "runs": {"worker_1": run},
                   "summary": {"1": {"worker_events_per_second": 250.0,
                                     "plain_sql_events_per_second": None,
                                     "noop_messages_per_second": 4000.0,
                                     "worker_vs_plain_sql": None, "worker_vs_noop": 0.06,
                                     "worker_database_per_event": run["database_per_event"],
                                     "plain_sql_database_per_event": None,
                                     "worker_bytes_per_event": run["bytes_per_event"],
                                     "plain_sql_bytes_per_event": None}}},  # fmt: skip
        "e2e": {"gunicorn": "config.wsgi", "workers": 2, "worker_command": "run_sqs_worker",
                "steady": {**step, "offered_rate": 200, "accepted_to_applied_p50_ms": 12.0,
                           "accepted_to_applied_p99_ms": 80.0},
                "steps": [step], "sustained_events_per_second": 0, "limit_reached": True},
        "problems": [],
    }  # fmt: skip


def test_report_renders_as_text_and_markdown_with_missing_figures_shown_as_dashes():
    from bench.report import markdown, table

    report = _report()
    text = table(report)
    assert "callback ingest, accepted/s" in text and "0.50" in text
    assert "< 400 (lowest step)" in text
    md = markdown(report)
    assert "| worker | 1 | 250 | 41.0 | 2.30 | 2.10 | 6.0 | 3,100 |" in md
    assert "the queue backlog kept growing" in md
    assert "| 400 | 15 | 399 | - | 900 | 60.0 | - / - |" in md


def test_the_ratio_over_rounds_with_even_web_processes_is_shown_beside_the_headline():
    from bench.report import table

    report = _report()
    assert "web processes even" not in table(report)  # a report from before the figure existed
    report["ingest"]["callback_vs_minimal_even_rounds"] = 0.72
    line = next(li for li in table(report).splitlines() if "web processes even" in li)
    assert "0.72" in line
    report["ingest"]["callback_vs_minimal_even_rounds"] = None  # no even round of one endpoint
    line = next(li for li in table(report).splitlines() if "web processes even" in li)
    assert line.split()[-1] == "-"


def test_a_stall_drained_before_the_step_ends_is_not_a_growing_backlog():
    stall_then_drained = [(t, 0.0) for t in range(10)]
    stall_then_drained += [(10, 100.0), (11, 200.0), (12, 300.0), (13, 2.0)]
    assert stats.backlog_trend(stall_then_drained) > 5
    assert not stats.backlog_grows(stall_then_drained, 150)
    still_growing = [(t, 12.0 * t) for t in range(15)]
    assert stats.backlog_grows(still_growing, 150)


def test_the_money_phase_shows_refunds_against_the_debits_of_the_same_run():
    from bench.report import markdown, table

    report = _report()
    assert "refunds: " not in table(report)  # a report from before the phase existed
    debits = {"made": 100, "api_per_second": 80.0, "api_p50_ms": 40.0, "api_p99_ms": 90.0,
              "seconds": 2.0, "confirmed_per_second": 50.0, "cpu_ms_per_item": 10.0,
              "cpu_ms_per_event": {"web": 4.0, "workers": 4.0, "sqs": 1.0, "postgres": 1.0,
                                   "generator": 3.0}}  # fmt: skip
    refunds = {**debits, "confirmed_per_second": 45.0, "cpu_ms_per_item": 12.0}
    report["money"] = {"items": 100, "clients": 8, "gunicorn": "config.wsgi",
                       "worker_command": "run_sqs_worker", "debits": debits, "refunds": refunds,
                       "refund_vs_debit_rate": 0.9, "refund_vs_debit_cpu": 1.2,
                       "refund_vs_debit_api_rate": 1.0}  # fmt: skip

    lines = table(report).splitlines()
    rate = next(li for li in lines if li.startswith("refunds: confirmed/s against the debits'"))
    assert "45" in rate and "50 debits" in rate and "0.90" in rate and ">= 0.9" in rate
    cpu = next(li for li in lines if li.startswith("refunds: CPU ms per payment's life"))
    assert "12.00" in cpu and "10.00 debits" in cpu and "1.20" in cpu and "<= 1.1" in cpu
    assert cpu.rstrip().endswith(": -")  # a report from before the goals: no verdict
    assert not any(li.startswith("payouts:") for li in lines)  # nor payouts
    md = markdown(report)
    assert (
        "| refunds | 100 | 80 | 40.0 / 90.0 | 2.0 | 45 | 12.00 | 4.0 / 4.0 / 1.0 / 1.0 / 3.0 |"
        in md
    )


def _sleeper(*, ignore_interrupt: bool):
    import subprocess
    import sys

    # Set either way: a child inherits an ignored SIGINT (pytest-xdist's workers ignore it),
    # and Python then installs no handler of its own.
    handler = "signal.SIG_IGN" if ignore_interrupt else "signal.default_int_handler"
    code = f"import signal, time\nsignal.signal(signal.SIGINT, {handler})\n"
    code += "print('ready', flush=True)\ntime.sleep(60)\n"
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline() == "ready\n"
    return process


def test_a_profiler_that_outlives_its_wait_is_interrupted(capsys):
    from bench.stack import py_spy_finish

    process = _sleeper(ignore_interrupt=False)
    py_spy_finish(process, 0.2)
    assert process.returncode is not None and process.returncode != 0
    assert "took longer than" in capsys.readouterr().out


def test_a_profiler_that_hangs_is_killed_and_named_and_the_run_goes_on(capsys):
    from bench.stack import py_spy_finish

    process = _sleeper(ignore_interrupt=True)
    py_spy_finish(process, 0.2, grace=0.5)
    assert process.returncode == -9
    assert "hung: killed, its profile is missing" in capsys.readouterr().out


def test_a_profiler_stopped_on_purpose_is_interrupted_at_once(capsys):
    from bench.stack import py_spy_finish

    process = _sleeper(ignore_interrupt=False)
    started = time.monotonic()
    py_spy_finish(process, 5, stop=True)
    # Ended by the first SIGINT (KeyboardInterrupt), not the second after the wait, nor killed.
    assert time.monotonic() - started < 5
    assert process.returncode not in (None, 0, -9)
    assert capsys.readouterr().out == ""
