"""The ``money`` phase: money out at the cost of money in.

Two runs through the whole product, one after the other on one stack: gunicorn serving the
product (the API and the callback endpoint), two ``run_sqs_worker`` processes with production
options (the outbox relay on), and the sandbox processor over HTTP, which calls back into
gunicorn (``submitted``, then ``settled``):

- **debits**, the baseline: ``BENCH_MONEY_PAYMENTS`` ``POST /api/payments/`` by
  ``BENCH_MONEY_CLIENTS`` clients at once, each debit submitted by the workers, its callbacks
  through the endpoint and the queue, until every one is confirmed: the settlement the other
  phases measure, from the API on;
- **refunds**: a full refund of each of those settled debits, ``POST
  /api/payments/<id>/refunds/`` by the same clients, each an ACH credit submitted by the
  workers (``POST /v1/ach/credits``), its callbacks the same way, until every one is confirmed.

Both come after a warm-up of 50 debits and their refunds, unmeasured. Each run reports the
API's answers per second and P50/P99, the items confirmed per second from
the first request to the last confirmation, and each part's CPU per item (web, workers, the SQS
server, PostgreSQL; the generator's, with the sandbox in it, apart). The refunds are compared
with the debits of the same run: ``refund_vs_debit_rate`` and ``refund_vs_debit_cpu``. Both runs
are verified: every item confirmed, each debit charged once, each credit sent once.
"""

import signal
import subprocess
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

import psycopg
import requests

from bench import stats
from bench.cpu import CpuMeter, cpu_summary
from bench.options import CONFIG, log, problems
from bench.prepare import payments_reset, queues_create
from bench.report import fmt
from bench.stack import RESULTS, BenchError, Gunicorn, Stack, spawn
from devstack.processes import worker_command

MERCHANTS = [f"merchant-money-{n}" for n in range(10)]
AMOUNT = Decimal("25.00")
# The parts the ratio compares: every part of the product's stack, not the generator (the
# clients, and the sandbox processor's threads beside them).
PARTS = ("web", "workers", "sqs", "postgres")
WARM_UP = 50


def _api_token() -> str:
    """An API user granted the run's merchants, and its token."""
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    from payments.models import MerchantAccess

    user, _ = get_user_model().objects.get_or_create(username="bench-money")
    for merchant_id in MERCHANTS:
        MerchantAccess.objects.get_or_create(user=user, merchant_id=merchant_id)
    token, _ = Token.objects.get_or_create(user=user)
    return token.key


class Clients:
    """``count`` API clients, each with its own keep-alive session, sending requests at once."""

    def __init__(self, base_url: str, token: str, count: int) -> None:
        self.base_url, self.count = base_url, count
        self._local = threading.local()
        self._token = token

    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            session.headers["Authorization"] = f"Token {self._token}"
            self._local.session = session
        return session

    def post_all(self, requests_: list[tuple[str, dict]]) -> list[tuple[int, float, dict]]:
        """Each (path, body) posted once with an Idempotency-Key of its own: (status, seconds,
        answer) in order."""

        def post(item: tuple[str, dict]) -> tuple[int, float, dict]:
            path, body = item
            started = time.perf_counter()
            try:
                response = self._session().post(
                    f"{self.base_url}{path}",
                    json=body,
                    headers={"Idempotency-Key": str(uuid.uuid4())},
                    timeout=30,
                )
            except requests.RequestException:
                return 0, time.perf_counter() - started, {}
            answer = response.json() if response.status_code < 500 else {}
            return response.status_code, time.perf_counter() - started, answer

        with ThreadPoolExecutor(self.count, thread_name_prefix="money-client") as pool:
            return list(pool.map(post, requests_))


def _confirmed(db_url: str, ids: list[str]) -> tuple[int, float | None]:
    """How many of ``ids`` are confirmed, and when the last of them was (epoch seconds)."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        count, last = conn.execute(
            "SELECT count(*), extract(epoch FROM max(state_changed_at)) FROM payments_payment "
            "WHERE state = 'confirmed' AND id = ANY(%s::uuid[])",
            (ids,),
        ).fetchone()
    return count, float(last) if last is not None else None


def _wait_confirmed(db_url: str, ids: list[str], what: str, timeout: float) -> float | None:
    """Wait until every one of ``ids`` is confirmed; when the last one was."""
    deadline = time.time() + timeout
    while True:
        count, last = _confirmed(db_url, ids)
        if count == len(ids):
            return last
        if time.time() > deadline:
            problems.append(f"money: {count} of {len(ids)} {what} confirmed after {timeout:.0f} s")
            return last
        time.sleep(0.25)


def _run(
    stack: Stack,
    meter: CpuMeter,
    clients: Clients,
    what: str,
    requests_: list[tuple[str, dict]],
) -> tuple[dict, list[str]]:
    """Post every request, wait for every item it made to be confirmed; the run's figures and
    the ids of the items made."""
    cpu_before = meter.snapshot()
    started = time.time()
    answers = clients.post_all(requests_)
    answered = time.time()
    made = [a["id"] for status, _, a in answers if status == 201 and "id" in a]
    refused = len(answers) - len(made)
    if refused:
        statuses = sorted({status for status, _, _ in answers if status != 201})
        problems.append(f"money: {refused} of {len(answers)} {what} not made (status {statuses})")
    last = _wait_confirmed(stack.database_url, made, what, timeout=120 + len(made) / 5)
    used = CpuMeter.used(cpu_before, meter.snapshot())
    seconds = (last or time.time()) - started
    latencies = [1000 * s for status, s, _ in answers if status == 201]
    figures = {
        "requests": len(answers),
        "made": len(made),
        "api_per_second": round(len(answers) / max(answered - started, 1e-9), 1),
        "api_p50_ms": stats.percentile(latencies, 50),
        "api_p99_ms": stats.percentile(latencies, 99),
        "seconds": round(seconds, 2),
        "confirmed_per_second": round(len(made) / max(seconds, 1e-9), 1),
        **cpu_summary(used, len(made), seconds),
    }
    figures["cpu_ms_per_item"] = round(
        sum(figures["cpu_ms_per_event"].get(part, 0.0) for part in PARTS), 2
    )
    log(
        f"money, {what}: {len(made)} made at {figures['api_per_second']:.0f}/s through the API, "
        f"all confirmed {seconds:.1f} s after the first ({figures['confirmed_per_second']:.0f}"
        f"/s), {figures['cpu_ms_per_item']:.2f} ms CPU each"
    )
    return figures, made


def _verify(sandbox, debits: list[str], refunds: list[str]) -> None:
    """Each debit charged once, each refund's credit sent once, the processor's own count."""
    sent = sandbox.stats()
    charged = sent["charges_by_payment"]
    twice = [p for p in debits if charged.get(p) != 1]
    if twice:
        problems.append(f"money: {len(twice)} debits not charged exactly once")
    credited = sent["credits_sent_by_payment"]
    wrong = [p for p in refunds if credited.get(p) != 1]
    if wrong:
        problems.append(f"money: {len(wrong)} refunds not credited exactly once")


def _debit_bodies(count: int, prefix: str) -> list[tuple[str, dict]]:
    return [
        (
            "/api/payments/",
            {
                "merchant_id": MERCHANTS[n % len(MERCHANTS)],
                "amount": f"{AMOUNT:.2f}",
                "currency": "USD",
                "source_token": f"tok_{prefix}_{n:06d}xyz",
            },
        )
        for n in range(count)
    ]


def _refund_bodies(debits: list[str]) -> list[tuple[str, dict]]:
    """A full refund of each debit."""
    return [
        (f"/api/payments/{debit}/refunds/", {"amount": f"{AMOUNT:.2f}", "reason": "bench"})
        for debit in debits
    ]


def money_phase(stack: Stack) -> dict:
    from sandbox import FaultConfig, SandboxProcessor

    count, clients_count = CONFIG["money_payments"], CONFIG["money_clients"]
    payments_reset(stack.database_url, 0)  # empty tables: the runs' items are all there is
    token = _api_token()
    name, dlq, _ = queues_create("money")
    server = Gunicorn(
        stack,
        queue=(name, dlq),
        workers=CONFIG["gunicorn_workers"],
        threads=CONFIG["gunicorn_threads"],
    ).start()
    sandbox = SandboxProcessor(
        callback_url=f"{server.url}/callbacks/processor/",
        faults=FaultConfig(settle_after_seconds=0.2),
        callback_threads=8,
    ).start()
    env = stack.env(name, dlq, PROCESSOR_BASE_URL=sandbox.base_url)
    cmd = worker_command(until_empty=False, wait_time=20, relay=True)
    workers = [spawn(cmd, env, RESULTS / f"money-worker-{i}.log") for i in range(2)]
    out: dict = {
        "items": count,
        "clients": clients_count,
        "gunicorn": " ".join(server.command[1:]),
        "worker_command": " ".join(["manage.py", *cmd[2:]]),
    }
    try:
        time.sleep(2)  # let the workers start their first long poll
        if any(w.poll() is not None for w in workers):
            raise BenchError(f"a worker exited at start; see {RESULTS}/money-worker-*.log")
        meter = CpuMeter(stack, server, workers)
        clients = Clients(server.url, token, clients_count)
        # Every thread's connections, caches and first requests of both paths, unmeasured:
        # the debits run first, and would otherwise pay them alone.
        warm = _run(stack, meter, clients, "warm-up debits", _debit_bodies(WARM_UP, "warm"))[1]
        _run(stack, meter, clients, "warm-up refunds", _refund_bodies(warm))
        out["debits"], debits = _run(stack, meter, clients, "debits", _debit_bodies(count, "run"))
        out["refunds"], refunds = _run(stack, meter, clients, "refunds", _refund_bodies(debits))
    finally:
        for w in workers:
            if w.poll() is None:
                w.send_signal(signal.SIGTERM)
        server.stop()
        for w in workers:
            try:
                w.wait(30)
            except subprocess.TimeoutExpired:
                w.kill()
                w.wait()
        sandbox.stop()
    _verify(sandbox, debits, refunds)
    d, r = out["debits"], out["refunds"]
    out["refund_vs_debit_rate"] = stats.ratio(r["confirmed_per_second"], d["confirmed_per_second"])
    out["refund_vs_debit_cpu"] = stats.ratio(r["cpu_ms_per_item"], d["cpu_ms_per_item"])
    out["refund_vs_debit_api_rate"] = stats.ratio(r["api_per_second"], d["api_per_second"])
    log(
        f"money: refunds against debits, rate {fmt(out['refund_vs_debit_rate'], 2)}, CPU per "
        f"item {fmt(out['refund_vs_debit_cpu'], 2)}"
    )
    return out
