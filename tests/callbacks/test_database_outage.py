"""PostgreSQL down for 3 minutes under traffic, on the real stack.

A cluster of the session's own (``pg_cluster``; the shared server is never stopped), gunicorn
serving the callback endpoint and the payments API on it, the sandbox processor over HTTP
sending signed callbacks to that endpoint, two ``run_sqs_worker`` processes and the local SQS
server. Payments are created and submitted first; then the database goes away for 180 s while
their settlements (and returns, and duplicate deliveries) keep arriving, while callbacks of our
own are posted and while the payments API is called; then it comes back.

The claims: the API answers 503 with Retry-After throughout; the endpoint accepts every
callback (202, it needs no database); the workers log one line when the database goes and one
when it is back (not a traceback per loop), look again at the pace of ``WORKER_BACKOFF_*``, and
spend no message's receive budget: no dead letter. After recovery every accepted callback is
applied exactly once and each payment was charged once.
"""

import json
import re
import signal
import time
import uuid
from datetime import UTC, datetime

import pytest
import requests

from callbacks.models import QueueMessage
from payments import signing
from payments.models import Payment, PaymentEvent, ProcessedEvent
from sandbox import FaultConfig, SandboxProcessor
from tests.callbacks.test_endpoint import SECRET
from tests.callbacks.worker_support import WorkerProcess, drain
from tests.gunicorn_support import free_port, gunicorn_running
from tests.payments.test_api_database_outage import API_USER, assert_unavailable
from tests.pg_cluster import django_env, django_run
from tests.waiting import wait_for

pytestmark = pytest.mark.scale

OUTAGE_SECONDS = 180  # the spec's outage
MERCHANT = "m-dbdown"
BACKOFF = {"WORKER_BACKOFF_BASE_SECONDS": "0.5", "WORKER_BACKOFF_CAP_SECONDS": "4"}
BACKOFF_CAP = float(BACKOFF["WORKER_BACKOFF_CAP_SECONDS"])
# Settlements land about this long into the outage; the sandbox's returns after settlement
# (``tok_nsf``) about RETURN_AFTER later, still inside it.
SETTLE_AFTER = 15.0
RETURN_AFTER = 40.0
API_EVERY = 10.0  # seconds between rounds of payments API calls during the outage
REPLAY_EVERY = 30.0  # seconds between redeliveries of a callback already delivered
OUR_RETURNS_AT = 120.0  # seconds into the outage: returns of settled payments posted by us
TRACEBACKS_ALLOWED = 3  # "a handful": never one per loop (the loop goes round every few s)
TABLES = {
    "payment": Payment._meta.db_table,
    "event": PaymentEvent._meta.db_table,
    "processed": ProcessedEvent._meta.db_table,
    "queue_message": QueueMessage._meta.db_table,
}


@pytest.fixture
def stack(pg_cluster, sqs_queues, module_settings, monkeypatch, tmp_path):
    """gunicorn and two workers on the cluster, the sandbox posting callbacks to gunicorn."""
    cluster = pg_cluster
    token = django_run(cluster.url, API_USER.format(merchant=MERCHANT)).strip()
    queues = {
        "SQS_ENDPOINT_URL": module_settings.SQS_ENDPOINT_URL,
        "SQS_QUEUE_NAME": module_settings.SQS_QUEUE_NAME,
        "SQS_DLQ_NAME": module_settings.SQS_DLQ_NAME,
    }
    for name, value in queues.items():
        monkeypatch.setenv(name, value)  # django_run's processes (DLQ ingestion) see the queues
    env = django_env(
        cluster.url,
        **queues,
        CALLBACK_SIGNING_SECRETS=SECRET,
        GUNICORN_BIND=f"127.0.0.1:{free_port()}",
        GUNICORN_WORKERS="1",
        GUNICORN_THREADS="4",
    )
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    web_log = tmp_path / "gunicorn.log"
    with gunicorn_running(env, web_log) as base:
        sandbox = SandboxProcessor(
            callback_url=f"{base}/callbacks/processor/",
            signing_secret=SECRET,
            faults=FaultConfig(
                settle_after_seconds=SETTLE_AFTER, return_after_seconds=RETURN_AFTER
            ),
            callback_backoff_seconds=0.5,
        ).start()
        module_settings.PROCESSOR_BASE_URL = sandbox.base_url
        for name, value in BACKOFF.items():
            setattr(module_settings, name, float(value))
        workers = [
            WorkerProcess(
                "--wait-time",
                "1",
                "--visibility-timeout",
                "30",
                log_dir=tmp_path,
                name=f"worker{i}",
                DATABASE_URL=cluster.url,
                **BACKOFF,
            )
            for i in range(2)
        ]
        try:
            yield cluster, base, token, sandbox, workers, sqs_queues, web_log
        finally:
            cluster.start()
            for worker in workers:
                if worker.process.poll() is None:
                    worker.signal(signal.SIGTERM)
                    worker.wait(60)
            sandbox.stop()


def api(base, token, method, path, body=None) -> requests.Response:
    return requests.request(
        method,
        f"{base}{path}",
        json=body,
        headers={"Authorization": f"Token {token}"},
        timeout=30,
    )


def post_callback(base, raw: bytes) -> requests.Response:
    headers = {"Content-Type": "application/json", signing.HEADER: signing.sign(raw, [SECRET])}
    return requests.post(f"{base}/callbacks/processor/", data=raw, headers=headers, timeout=30)


def processor_event_body(payment_id: str, event_type: str, amount: str) -> dict:
    """A callback as the processor sends it; a return is an R01 of a settled debit."""
    body = {
        "payment_id": payment_id,
        "event_type": event_type,
        "processor_event_id": f"evt_ours_{uuid.uuid4().hex}",
        "amount": amount,
        "timestamp": datetime.now(UTC).isoformat(),
    }
    if event_type == "returned":
        body.update({"reason_code": "R01", "message": "Insufficient funds"})
    return body


def rows(cluster, sql: str, *params):
    return cluster.execute(sql.format(**TABLES), params or None)


def payment_states(cluster, ids: list[str]) -> dict[str, str]:
    return dict(
        rows(cluster, "SELECT id::text, state FROM {payment} WHERE id::text = ANY(%s)", ids)
    )


def test_three_minutes_without_the_database_under_traffic_lose_and_repeat_nothing(stack):
    cluster, base, token, sandbox, workers, queues, web_log = stack
    began = time.monotonic()

    # Payments created and submitted before the outage: plain ones (settled in the outage),
    # ones the sandbox returns after settlement and ones whose every callback comes twice.
    tokens = (
        [f"tok_dbdown_plain_{n}" for n in "abcdef"]
        + [f"tok_nsf_dbdown_{n}" for n in "abc"]
        + [f"tok_dupcb_dbdown_{n}" for n in "abc"]
    )
    payments = {}
    for source_token in tokens:
        created = api(
            base,
            token,
            "POST",
            "/api/payments/",
            {"merchant_id": MERCHANT, "amount": "25.00", "source_token": source_token},
        )
        assert created.status_code == 201, created.text
        payments[created.json()["id"]] = source_token
    ids = list(payments)
    wait_for(
        lambda: set(payment_states(cluster, ids).values()) == {"submitted"},
        60,
        "the submissions",
        watch=workers,
    )

    # The outage, with callbacks on their way in as it starts: a worker that received some
    # and cannot record them holds them back (hidden, no work done, no receive spent) until
    # the database answers. Late ``submitted`` events: stale, but each must be seen once.
    ours: list[dict] = []
    for pk in ids:
        event = processor_event_body(pk, "submitted", "25.00")
        response = post_callback(base, json.dumps(event).encode())
        assert response.status_code == 202, response.text
        ours.append(event)
    cluster.stop()
    outage_began = time.monotonic()
    api_answers = []
    replays = []
    next_api = next_replay = 0.0
    returns_posted = False
    while (elapsed := time.monotonic() - outage_began) < OUTAGE_SECONDS:
        if elapsed >= next_api:
            next_api += API_EVERY
            body = {"merchant_id": MERCHANT, "amount": "9.99", "source_token": "tok_dbdown_api"}
            api_answers += [
                api(base, token, "POST", "/api/payments/", body),
                api(base, token, "GET", f"/api/payments/{ids[0]}/"),
            ]
        if elapsed >= next_replay and sandbox.callbacks.delivered:
            next_replay += REPLAY_EVERY
            # A processor redelivering a callback it already delivered (it never saw our 202).
            replays.append(post_callback(base, sandbox.callbacks.delivered[-1]["raw"]))
        if elapsed >= OUR_RETURNS_AT and not returns_posted:
            returns_posted = True
            settled = {
                item["body"]["payment_id"]
                for item in sandbox.callbacks.delivered
                if item["body"]["event_type"] == "settled"
            }
            for payment_id in [p for p in ids if payments[p].startswith("tok_dbdown_plain")][:2]:
                assert payment_id in settled, "the settlement did not arrive in the outage"
                event = processor_event_body(payment_id, "returned", "25.00")
                response = post_callback(base, json.dumps(event).encode())
                assert response.status_code == 202, response.text
                ours.append(event)
        for worker in workers:
            assert worker.process.poll() is None, f"worker died in the outage:\n{worker.output}"
        time.sleep(0.5)
    delivered_in_outage = len(sandbox.callbacks.delivered)
    cluster.start()
    back_at = time.monotonic()
    outage_lasted = back_at - outage_began

    # Each worker notices within one backoff cap (its next look) of the database's return.
    noticed = {}
    while len(noticed) < len(workers) and time.monotonic() - back_at < BACKOFF_CAP + 10:
        for worker in workers:
            if worker.log_path.stem not in noticed and "database back after" in worker.output:
                noticed[worker.log_path.stem] = time.monotonic() - back_at
        time.sleep(0.1)
    assert len(noticed) == len(workers), [w.output[-3000:] for w in workers]

    # Recovery: every callback accepted meanwhile applied, every payment in its final state.
    returned_by_us = {event["payment_id"] for event in ours if event["event_type"] == "returned"}
    expected = {
        pk: "returned" if source.startswith("tok_nsf") or pk in returned_by_us else "confirmed"
        for pk, source in payments.items()
    }
    wait_for(lambda: payment_states(cluster, ids) == expected, 120, "recovery", watch=workers)
    recovered_after = time.monotonic() - back_at
    accepted = {item["body"]["processor_event_id"] for item in sandbox.callbacks.delivered} | {
        event["processor_event_id"] for event in ours
    }

    def all_processed() -> bool:
        found = rows(
            cluster,
            "SELECT count(*) FROM {processed} WHERE processor_event_id = ANY(%s)",
            list(accepted),
        )
        return found[0][0] == len(accepted)

    wait_for(all_processed, 60, "every accepted callback to be processed", watch=workers)
    for worker in workers:
        worker.signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait(60) == 0, worker.output
    elapsed_total = time.monotonic() - began

    # The payments API: 503 with Retry-After for every call while the database was down.
    for response in api_answers:
        assert_unavailable(response)
    # The callback endpoint: every callback taken while the database was down (ours, the
    # redeliveries and the sandbox's, which the sandbox only counts as delivered on a 2xx).
    assert all(response.status_code == 202 for response in replays), replays
    assert sandbox.stats()["callbacks_given_up"] == 0
    assert sandbox.stats()["callback_failed_attempts"] == 0

    # Every accepted callback applied exactly once: one dedup record and one log row that is
    # not a duplicate per event id, and each transition once per payment, in order.
    logged = rows(
        cluster,
        "SELECT processor_event_id, count(*) FROM {event} WHERE processor_event_id = ANY(%s) "
        "AND outcome <> 'duplicate' GROUP BY processor_event_id",
        list(accepted),
    )
    assert dict(logged) == dict.fromkeys(accepted, 1)
    for pk in ids:
        moves = rows(
            cluster,
            "SELECT from_state, to_state FROM {event} WHERE payment_id::text = %s "
            "AND outcome = 'applied' AND kind <> 'created' ORDER BY id",
            pk,
        )
        path = [("pending", "submitted"), ("submitted", "confirmed")]
        if expected[pk] == "returned":
            path.append(("confirmed", "returned"))
        assert moves == path, (pk, payments[pk], moves)
    assert sandbox.stats()["charges_by_payment"] == dict.fromkeys(ids, 1)

    # No dead letter: none recorded, none in the DLQ (ingestion finds nothing to take).
    assert rows(cluster, "SELECT count(*) FROM {queue_message} WHERE status = 'dead_lettered'") == [
        (0,)
    ]
    ingested = django_run(
        cluster.url,
        "from triage.ingestion import dead_letters_ingest\nprint(dead_letters_ingest())\n",
    )
    assert ingested.strip().splitlines()[-1] == "0"
    assert drain(queues.client, queues.dlq_url) == []

    # One line when the database went, one when it came back, no traceback per loop.
    held_back = {}
    tracebacks = {}
    for worker in workers:
        log = worker.output
        assert log.count("database unavailable since") == 1, log[-5000:]
        [back] = re.findall(r"database back after (\d+) s; (\d+) held-back message", log)
        assert OUTAGE_SECONDS - 5 <= int(back[0]) <= outage_lasted + BACKOFF_CAP + 5, back
        held_back[worker.log_path.stem] = int(back[1])
        tracebacks[worker.log_path.stem] = sum("Traceback" in line for line in log.splitlines())
        assert tracebacks[worker.log_path.stem] <= TRACEBACKS_ALLOWED, log[-5000:]
    # Looked again at the backoff's pace: within its cap of the database's return.
    assert all(seconds <= BACKOFF_CAP + 2 for seconds in noticed.values()), noticed
    web_tracebacks = sum("Traceback" in line for line in web_log.read_text().splitlines())

    print(
        f"\ndatabase outage: test {elapsed_total:.0f} s, outage {outage_lasted:.1f} s; "
        f"API 503s {len(api_answers)}; callbacks delivered by the sandbox "
        f"{len(sandbox.callbacks.delivered)} ({delivered_in_outage} by the outage's end), "
        f"redeliveries {len(replays)}, ours {len(ours)}; workers noticed the return after "
        f"{ {k: round(v, 1) for k, v in noticed.items()} } s; recovered {recovered_after:.1f} s "
        f"after the restart; held back {held_back}; tracebacks {tracebacks}, "
        f"gunicorn {web_tracebacks}"
    )
