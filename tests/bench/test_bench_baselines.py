"""The baselines added beside the pipeline, and the figures formed across phases: the batched
floor, the Celery peer's task and view, the worst ingest round, the connection spread, the
recovery's call rate, the minimal parts. None of these tests measures speed."""

import json
import socket

import psycopg
import pytest
from django.test import Client

from bench import consumers, events
from bench.ingest import min_round_ratio
from bench.peer.tasks import apply_processor_event
from bench.recovery import call_rates
from bench.sockets import connections_per_process
from bench.summary import cross_phase, minimal_parts
from bench.urls import PEER_PATH
from payments.models import LedgerEntry, Payment, PaymentEvent, ProcessedEvent
from tests.bench.test_bench_consumers import _database_url, _depth, _message_body, _send
from tests.factories import PaymentFactory

SECRETS = ["bench-signing-secret"]


@pytest.mark.django_db(transaction=True)
def test_batched_sql_consumer_applies_every_event_sharing_transactions(sqs_queues, local_sqs):
    payments = [PaymentFactory(state="submitted") for _ in range(12)]
    _send(sqs_queues, [str(p.id) for p in payments])
    report = consumers.consume(
        "batchedsql",
        endpoint_url=local_sqs.endpoint_url,
        queue_url=sqs_queues.url,
        database_url=_database_url(),
    )
    assert report["count"] == 12
    assert set(Payment.objects.values_list("state", flat=True)) == {"confirmed"}
    assert LedgerEntry.objects.count() == 12
    # now() is the transaction's start: events of one batch share it.
    assert ProcessedEvent.objects.values("processed_at").distinct().count() < 12
    assert _depth(sqs_queues) == 0
    assert report["backend_cpu_seconds"] is not None and report["backend_cpu_seconds"] >= 0


@pytest.mark.django_db(transaction=True)
def test_a_batch_with_an_event_it_cannot_apply_writes_nothing_for_the_whole_batch():
    good, bad = PaymentFactory(state="submitted"), PaymentFactory(state="confirmed")
    messages = [
        {"Body": json.dumps(_message_body(p, f"evt_{n}")), "MessageId": f"m{n}"}
        for n, p in enumerate((good, bad))
    ]
    with psycopg.connect(_database_url(), autocommit=True) as conn:
        with pytest.raises(consumers.PlainSqlError, match="is confirmed"):
            consumers.apply_settled_batch(conn, messages)
    good.refresh_from_db()
    assert good.state == "submitted"
    assert not ProcessedEvent.objects.exists() and not LedgerEntry.objects.exists()


def _settled(payment: Payment, event_id: str) -> dict:
    return json.loads(events.settled_callback(str(payment.id), event_id).body)


@pytest.mark.django_db
def test_the_peer_task_applies_a_settled_event_once_and_a_redelivery_changes_nothing():
    payment = PaymentFactory(state="submitted")
    event = _settled(payment, "evt_peer_1")
    assert apply_processor_event(event) == "applied"
    assert apply_processor_event(event) == "duplicate"
    payment.refresh_from_db()
    assert payment.state == "confirmed"
    assert LedgerEntry.objects.filter(payment=payment, kind="credit").count() == 1
    assert ProcessedEvent.objects.get(pk="evt_peer_1").outcome == "applied"
    [logged] = PaymentEvent.objects.filter(payment=payment, kind="processor_event")
    assert (logged.from_state, logged.to_state) == ("submitted", "confirmed")


@pytest.mark.django_db
def test_the_peer_task_records_an_event_for_a_payment_past_it_as_stale():
    payment = PaymentFactory(state="confirmed")
    assert apply_processor_event(_settled(payment, "evt_peer_2")) == "stale"
    assert not LedgerEntry.objects.exists()


@pytest.fixture
def peer_view(settings, module_settings):
    settings.ROOT_URLCONF = "bench.urls"
    module_settings.CALLBACK_SIGNING_SECRETS = SECRETS


@pytest.mark.django_db
def test_the_peer_view_publishes_a_signed_callback_and_refuses_an_unsigned_one(
    peer_view, monkeypatch
):
    published = []
    monkeypatch.setattr(apply_processor_event, "delay", lambda event: published.append(event))
    payment = PaymentFactory(state="submitted")
    callback = events.settled_callback(str(payment.id), "evt_view_1")
    client = Client()
    signed = client.post(
        PEER_PATH,
        callback.body,
        content_type="application/json",
        headers={"X-Processor-Signature": callback.signature(SECRETS)},
    )
    assert signed.status_code == 202
    assert [e["processor_event_id"] for e in published] == ["evt_view_1"]
    unsigned = client.post(PEER_PATH, callback.body, content_type="application/json")
    assert unsigned.status_code == 401 and "signature" in unsigned.json()["errors"]
    body = b'{"payment_id": "x"}'
    from payments import signing

    invalid = client.post(
        PEER_PATH,
        body,
        content_type="application/json",
        headers={"X-Processor-Signature": signing.sign(body, SECRETS)},
    )
    assert invalid.status_code == 400 and "payment_id" in invalid.json()["errors"]
    assert len(published) == 1


def test_the_worst_round_is_the_lowest_ratio_of_a_callback_round_to_its_minimal_round():
    rounds = {
        "minimal": [{"accepted_per_second": 2000.0}, {"accepted_per_second": 1000.0}],
        "callback": [{"accepted_per_second": 1400.0}, {"accepted_per_second": 900.0}],
    }
    assert min_round_ratio(rounds) == pytest.approx(0.7)  # not 0.45 (900 / 2000)
    assert min_round_ratio({"minimal": [], "callback": []}) is None


def test_connections_are_counted_for_the_process_holding_the_accepted_socket():
    import os

    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
        accepted = [listener.accept()[0] for _ in clients]
        try:
            assert connections_per_process([os.getpid()], port) == [3]
            assert connections_per_process([2**22 + 1], port) == [0]  # no such process
        finally:
            for s in clients + accepted:
                s.close()


def test_call_rates_give_the_mean_and_the_busiest_second():
    times = [0.0, 0.1, 0.2, 0.3, 1.5, 2.0, 2.2, 3.0]
    rates = call_rates(times)
    assert rates["calls"] == 8
    assert rates["peak"] == 4  # 0.0-0.3
    assert rates["mean"] == pytest.approx(7 / 3.0)
    assert call_rates([1.0]) == {"calls": 1, "mean": None, "peak": 1}


def _cross_report() -> dict:
    return {
        "ingest": {"minimal": {"web_cpu_ms_per_request": 0.8}},
        "worker": {
            "runs": {
                "noop_1": {"consumer_cpu_ms_per_event": 0.2, "sqs_cpu_ms_per_event": 0.1},
                "batchedsql_1": {
                    "consumer_cpu_ms_per_event": 0.5,
                    "sqs_cpu_ms_per_event": 0.1,
                    "postgres_cpu_ms_per_event": 0.4,
                },
            }
        },
        "e2e": {
            "sustained_events_per_second": 400,
            "steps": [
                {"offered_rate": 300, "sustained": True, "cpu_ms_per_event": {"web": 9.0}},
                {
                    "offered_rate": 400,
                    "sustained": True,
                    "cpu_ms_per_event": {"web": 2.0, "workers": 1.0, "generator": 5.0},
                },
                {"offered_rate": 600, "sustained": False, "cpu_ms_per_event": {"web": 1.0}},
            ],
        },
        "peer": {
            "celery_sustained_events_per_second": 100,
            "celery_cpu_ms_per_event": 12.0,
            "steps": [
                {"offered_rate": 300, "sustained": True, "cpu_ms_per_event": {"web": 18.0}},
                {"offered_rate": 400, "sustained": False, "cpu_ms_per_event": {"web": 1.0}},
            ],
        },
    }


def test_the_minimal_parts_are_the_view_the_queue_floor_and_the_floors_database_work():
    parts = minimal_parts(_cross_report())
    assert parts == {"web": 0.8, "queue": 0.3, "database": 0.7, "total": 1.8}
    report = _cross_report()
    del report["worker"]["runs"]["batchedsql_1"]["postgres_cpu_ms_per_event"]
    assert minimal_parts(report) is None  # a server whose backends cannot be read


def test_cross_phase_figures_use_the_highest_sustained_step_without_the_generator():
    report = _cross_report()
    cross_phase(report)
    assert report["e2e"]["pipeline_cpu_ms_per_event"] == 3.0  # the 400/s step, no generator
    assert report["e2e"]["cpu_vs_minimal_parts"] == pytest.approx(0.6)
    assert report["peer"]["pipeline_vs_celery_sustained"] == 4.0
    assert report["peer"]["pipeline_vs_celery_cpu"] == pytest.approx(0.25)
    # At the highest rate both sustained (300/s): 9.0 against 18.0.
    assert report["peer"]["common_sustained_rate"] == 300
    assert report["peer"]["pipeline_vs_celery_cpu_same_rate"] == pytest.approx(0.5)


def test_the_report_shows_the_peer_and_the_recovery_beside_the_pipeline():
    from bench.report import table
    from tests.bench.test_bench_harness import _report

    report = _report()
    report["peer"] = {
        "steady": {"offered_rate": 200},
        "celery_sustained_events_per_second": 100,
        "celery_cpu_ms_per_event": 12.0,
        "celery_accepted_to_applied_p99_ms": 900.0,
        "pipeline_vs_celery_sustained": None,
        "pipeline_vs_celery_cpu": None,
    }
    report["recovery"] = {
        "payments": 5000,
        "drain_seconds": 80.0,
        "calls_per_second_mean": 62.0,
        "calls_per_second_peak": 100,
        "cap_per_second": 100,
    }
    text = table(report)
    assert "100 Celery" in text and "12.00 Celery" in text
    assert "5,000 held payments" in text and "62 / 100" in text


def test_profile_breakdown_puts_each_stack_in_its_first_category(tmp_path):
    from bench.profiles import WORKER_CATEGORIES, profile_breakdown

    root = "main (manage.py:1);payment_apply_event (payments/services/events.py:9)"
    raw = tmp_path / "raw.txt"
    raw.write_text(
        f"{root};event_write (payments/event_sql.py:3) 6\n"
        f"{root};__enter__ (django/db/transaction.py:1) 2\n"
        f"{root};payment_lock (payments/services/writes.py:2) 1\n"
        "_bootstrap (threading.py:1);_worker (concurrent/futures/thread.py:2) 1\n"
    )
    assert profile_breakdown(raw, WORKER_CATEGORIES) == {
        "write": 60.0,
        "savepoint": 20.0,
        "lock": 10.0,
        "idle threads": 10.0,
    }
