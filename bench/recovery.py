"""The ``recovery`` phase: how long after the processor returns until the payments that waited
out an outage are all submitted, and the processor call rate during that drain.

``BENCH_RECOVERY_PAYMENTS`` (5,000) pending payments, each with its ``submit_payment`` message
on the queue; the processor's breaker open, so two ``run_sqs_worker`` processes (production
options) park every submission behind an outage hold. Then the breaker's pause ends with the
processor (the sandbox, over HTTP) healthy: the trial calls go, the breaker closes, and the
workers release the rest at ``OUTAGE_RELEASE_PER_SECOND`` (``BENCH_RECOVERY_CAP``, else the
product's default). Measured from the end of the pause: the seconds until every payment is
submitted, and the calls per second (``ProcessorAttempt.started_at``), mean and the busiest
second.
"""

import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import psycopg

from bench.options import CONFIG, log, problems
from bench.prepare import payments_reset, queues_create
from bench.stack import RESULTS, BenchError, Stack, spawn
from devstack.processes import stop_process, worker_command


def _count(db_url: str, sql: str, params: tuple = ()) -> int:
    with psycopg.connect(db_url, autocommit=True) as conn:
        return conn.execute(sql, params).fetchone()[0]


def _breaker_open() -> None:
    """The processor's breaker open for a day: every submission is parked."""
    from datetime import timedelta

    from django.db.models.functions import Now

    from payments.models import BreakerState, CircuitBreaker
    from payments.processor.breaker import PROCESSOR, processor_breaker_get

    processor_breaker_get()
    CircuitBreaker.objects.filter(name=PROCESSOR).update(
        state=BreakerState.OPEN, opened_at=Now(), open_until=Now() + timedelta(days=1)
    )


def _pause_end(db_url: str) -> float:
    """The breaker's pause over now (the processor is back): the next tick starts the trial.
    Returns when, as the database's clock reads it."""
    from django.db.models.functions import Now

    from payments.models import CircuitBreaker
    from payments.processor.breaker import PROCESSOR

    CircuitBreaker.objects.filter(name=PROCESSOR).update(open_until=Now())
    with psycopg.connect(db_url, autocommit=True) as conn:
        return float(conn.execute("SELECT extract(epoch FROM now())").fetchone()[0])


def _submissions_queue(url: str, ids: list[str], run: str) -> None:
    from callbacks import sqs

    client = sqs.sqs_client()
    entries = [
        {
            "Id": str(n % 10),
            "MessageBody": json.dumps({"kind": "submit_payment", "payment_id": pid}),
            "MessageGroupId": pid,
            "MessageDeduplicationId": f"{run}-{n}",
        }
        for n, pid in enumerate(ids)
    ]

    def send(start: int) -> None:
        response = client.send_message_batch(QueueUrl=url, Entries=entries[start : start + 10])
        if response.get("Failed"):
            raise BenchError(f"queueing the submissions failed: {response['Failed'][:3]}")

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(send, range(0, len(entries), 10)))


def _wait(what: str, done, timeout: float) -> float:
    started = time.time()
    while not done():
        if time.time() - started > timeout:
            raise BenchError(f"recovery: {what} not reached within {timeout:.0f} s")
        time.sleep(0.25)
    return time.time() - started


def call_rates(times: list[float]) -> dict:
    """Mean calls per second between the first and the last call, and the most calls any one
    second (a sliding window) held."""
    times = sorted(times)
    if len(times) < 2:
        return {"calls": len(times), "mean": None, "peak": len(times) or None}
    peak, start = 0, 0
    for end, at in enumerate(times):
        while at - times[start] >= 1.0:
            start += 1
        peak = max(peak, end - start + 1)
    span = times[-1] - times[0]
    return {"calls": len(times), "mean": (len(times) - 1) / span if span else None, "peak": peak}


def recovery_phase(stack: Stack) -> dict:
    from sandbox import SandboxProcessor

    count = CONFIG["recovery_payments"]
    ids = payments_reset(stack.database_url, count, state="pending")
    name, dlq, url = queues_create("recovery")
    _breaker_open()
    _submissions_queue(url, ids, uuid.uuid4().hex[:8])
    sandbox = SandboxProcessor().start()
    extra = {"PROCESSOR_BASE_URL": sandbox.base_url}
    if CONFIG["recovery_cap"]:
        extra["OUTAGE_RELEASE_PER_SECOND"] = str(CONFIG["recovery_cap"])
    env = stack.env(name, dlq, **extra)
    cmd = worker_command(wait_time=20, relay=True)
    workers = [spawn(cmd, env, RESULTS / f"recovery-worker-{i}.log") for i in range(2)]
    db = stack.database_url
    out: dict = {"payments": count, "worker_command": " ".join(["manage.py", *cmd[2:]])}
    try:
        out["park_seconds"] = round(
            _wait(
                "every submission parked",
                lambda: (
                    _count(
                        db,
                        "SELECT count(*) FROM callbacks_paymenthold WHERE kind = 'outage' "
                        "AND released_at IS NULL",
                    )
                    >= count
                ),
                timeout=120 + count / 20,
            ),
            1,
        )
        log(f"recovery: {count} submissions parked in {out['park_seconds']} s; processor back")
        back_at = _pause_end(db)
        _wait(
            "every payment submitted",
            lambda: (
                _count(db, "SELECT count(*) FROM payments_payment WHERE state = 'pending'") == 0
            ),
            timeout=120 + count / 5,
        )
        with psycopg.connect(db, autocommit=True) as conn:
            times = [
                float(t)
                for (t,) in conn.execute(
                    "SELECT extract(epoch FROM started_at) FROM payments_processorattempt "
                    "WHERE started_at >= to_timestamp(%s)",
                    (back_at,),
                )
            ]
            last = conn.execute(
                "SELECT extract(epoch FROM max(state_changed_at)) FROM payments_payment"
            ).fetchone()[0]
    finally:
        for w in workers:
            stop_process(w, timeout=30)
        sandbox.stop()
    rates = call_rates(times)
    out["drain_seconds"] = round(float(last) - back_at, 1)
    out["calls"] = rates["calls"]
    out["calls_per_second_mean"] = rates["mean"]
    out["calls_per_second_peak"] = rates["peak"]
    out["cap_per_second"] = CONFIG["recovery_cap"] or _product_cap()
    stats = sandbox.stats()
    out["processor_debit_requests"] = stats["requests"].get("debit_create")
    if rates["calls"] < count:
        problems.append(f"recovery: {rates['calls']} processor calls for {count} payments")
    log(
        f"recovery: {count} payments submitted {out['drain_seconds']} s after the processor "
        f"returned; {rates['calls']} calls, {rates['mean'] or 0:.0f}/s mean, "
        f"{rates['peak']} in the busiest second (cap {out['cap_per_second']}/s)"
    )
    return out


def _product_cap() -> int:
    from callbacks import conf

    return int(conf.OUTAGE_RELEASE_PER_SECOND)
