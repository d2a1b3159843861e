"""The ``money`` phase: money out at the cost of money in, and each payment's whole life.

Three runs through the whole product, one after the other on one stack: gunicorn serving the
product (the API and the callback endpoint) in ``BENCH_MONEY_GUNICORN_WORKERS`` (1) processes of
``BENCH_GUNICORN_THREADS`` threads, ``BENCH_MONEY_WORKERS`` (1) ``run_sqs_worker``
processes with production options (the outbox relay on), and the sandbox processor over HTTP,
which calls back into gunicorn (``submitted``, then ``settled``):

- **debits**, the baseline: ``BENCH_MONEY_PAYMENTS`` ``POST /api/payments/`` by
  ``BENCH_MONEY_CLIENTS`` clients at once, each debit submitted by the workers, its callbacks
  through the endpoint and the queue, until every one is confirmed: the settlement the other
  phases measure, from the API on;
- **refunds**: a full refund of each of those settled debits, ``POST
  /api/payments/<id>/refunds/`` by the same clients, each an ACH credit submitted by the
  workers (``POST /v1/ach/credits``), its callbacks the same way, until every one is confirmed;
- **payouts**: as many ``POST /api/payouts/`` of 5.00 each to the merchant's own account, each
  an ACH credit the same way. A payout is paid from the merchant's available balance, so the
  warm-up first funds each merchant with debits that are not refunded (the bench settings make
  a settled debit available at once, ``AVAILABLE_AFTER_BANKING_DAYS=0``).

All come after a warm-up, unmeasured: 50 debits and their refunds, the funding debits, 50
payouts. Each run reports the API's creates per second and P50/P99, the items confirmed per
second from the first request to the last confirmation, and the CPU of each item's whole life
(its create, the relay, the submission, both callbacks through the endpoint and the queue, and
a ``VACUUM (ANALYZE)`` of what the run left behind, so that no run pays for another's),
each part's per item (web, workers, the SQS server, PostgreSQL; the generator's, with the
sandbox in it, apart) and their sum. Money out is compared with the debits of the same run
(``refund_vs_debit_*``, ``payout_vs_debit_*``), and every run with the goals
(``money_goals``): reported, never enforced. All runs are verified: every item confirmed, each
debit charged once, each credit sent once.
"""

import math
import signal
import subprocess
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from decimal import ROUND_UP, Decimal

import psycopg
import requests

from bench import stats
from bench.cpu import CpuMeter, cpu_summary
from bench.options import CONFIG, log, problems
from bench.prepare import payments_reset, queues_create
from bench.profiles import WORKER_CATEGORIES, profile_breakdown, profile_summary
from bench.report import GOALS, fmt
from bench.stack import RESULTS, BenchError, Gunicorn, Stack, py_spy, py_spy_finish, spawn
from devstack.processes import worker_command

MERCHANTS = [f"merchant-money-{n}" for n in range(10)]
AMOUNT = Decimal("25.00")
PAYOUT_AMOUNT = Decimal("5.00")
# The largest funding debit: under the fraud rules' first_large_debit (10,000.00), whose hold
# would keep the money from being available.
FUNDING_MAX = Decimal("5000.00")
# The parts the ratio compares: every part of the product's stack, not the generator (the
# clients, and the sandbox processor's threads beside them).
PARTS = ("web", "workers", "sqs", "postgres")
WARM_UP = 50
# Where a web process's samples go in the profiled debits (``_debits_profiled``): each stack to
# the first category one of whose markers a frame holds, as ``bench.profiles`` sorts them.
MONEY_WEB_CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("outbox publish", ("(callbacks/outbox.py)",)),
    ("callback ingest", ("(callbacks/apis.py)",)),
    ("fraud rules", ("(payments/services/fraud.py)", "(payments/fraud_rules.py)")),
    ("create checks' read", ("_debit_facts_read (", "(payments/kernel/reads.py)")),
    ("create rows", ("payment_build (", "(payments/insert_sql.py)")),
    ("create, the rest", ("payment_create (", "refund_create (", "payout_create (")),
    ("API frame", ("(payments/idempotency.py)", "(payments/api/")),
    ("logging", ("logging/", "(payments/logformat.py)", "(payments/logcontext.py)")),
    ("Django and DRF", ("django/", "rest_framework/", "whitenoise/")),
    ("gunicorn", ("gunicorn/",)),
)
# A money worker submits too: its processor calls before the queue's categories (their HTTP is
# urllib3's, as the SQS client's is).
MONEY_WORKER_CATEGORIES = (
    ("submission", ("(payments/services/submission.py)", "(payments/processor/")),
    *WORKER_CATEGORIES,
)


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


def _confirmed(conn: psycopg.Connection, ids: list[str]) -> tuple[int, float | None]:
    """How many of ``ids`` are confirmed, and when the last of them was (epoch seconds)."""
    count, last = conn.execute(
        "SELECT count(*), extract(epoch FROM max(state_changed_at)) FROM payments_payment "
        "WHERE state = 'confirmed' AND id = ANY(%s::uuid[])",
        (ids,),
    ).fetchone()
    return count, float(last) if last is not None else None


def _wait_confirmed(
    conn: psycopg.Connection, ids: list[str], what: str, timeout: float
) -> float | None:
    """Wait until every one of ``ids`` is confirmed; when the last one was. One connection asks
    throughout (the run's own): a new backend per look would be PostgreSQL CPU charged to the
    run."""
    deadline = time.time() + timeout
    while True:
        count, last = _confirmed(conn, ids)
        if count == len(ids):
            return last
        if time.time() > deadline:
            problems.append(f"money: {count} of {len(ids)} {what} confirmed after {timeout:.0f} s")
            return last
        time.sleep(0.25)


def _vacuum(conn: psycopg.Connection) -> float:
    """``VACUUM (ANALYZE)`` the database: the seconds it took. Each run ends with it, inside
    its measure, so a run pays for cleaning up the rows it left behind, and the next starts
    with nothing of this one's for autovacuum to take up: otherwise the refunds' and payouts'
    PostgreSQL CPU carries the vacuuming of the runs before them (autovacuum fires on what has
    piled up, whichever run is measured then). ``conn`` is in autocommit (``VACUUM`` runs in
    no transaction)."""
    started = time.perf_counter()
    conn.execute("VACUUM (ANALYZE)")
    return time.perf_counter() - started


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
    with psycopg.connect(stack.database_url, autocommit=True) as conn:
        last = _wait_confirmed(conn, made, what, timeout=120 + len(made) / 5)
        vacuum_seconds = _vacuum(conn)
    used = CpuMeter.used(cpu_before, meter.snapshot())
    seconds = (last or time.time()) - started
    latencies = [1000 * s for status, s, _ in answers if status == 201]
    figures = {
        "requests": len(answers),
        "made": len(made),
        "api_per_second": round(len(answers) / max(answered - started, 1e-9), 1),
        "created_per_second": round(len(made) / max(answered - started, 1e-9), 1),
        "api_p50_ms": stats.percentile(latencies, 50),
        "api_p99_ms": stats.percentile(latencies, 99),
        "seconds": round(seconds, 2),
        "confirmed_per_second": round(len(made) / max(seconds, 1e-9), 1),
        "vacuum_seconds": round(vacuum_seconds, 2),
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


def _verify(sandbox, debits: list[str], credits: dict[str, list[str]]) -> None:
    """Each debit charged once, each refund's and payout's credit sent once, the processor's
    own count."""
    sent = sandbox.stats()
    charged = sent["charges_by_payment"]
    twice = [p for p in debits if charged.get(p) != 1]
    if twice:
        problems.append(f"money: {len(twice)} debits not charged exactly once")
    credited = sent["credits_sent_by_payment"]
    for what, ids in credits.items():
        wrong = [p for p in ids if credited.get(p) != 1]
        if wrong:
            problems.append(f"money: {len(wrong)} {what} not credited exactly once")


def _debit_bodies(count: int, prefix: str, amount: Decimal = AMOUNT) -> list[tuple[str, dict]]:
    return [
        (
            "/api/payments/",
            {
                "merchant_id": MERCHANTS[n % len(MERCHANTS)],
                "amount": f"{amount:.2f}",
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


def _payout_bodies(count: int) -> list[tuple[str, dict]]:
    """Payouts of PAYOUT_AMOUNT, the merchants in turn, each to its own account."""
    return [
        (
            "/api/payouts/",
            {
                "merchant_id": MERCHANTS[n % len(MERCHANTS)],
                "amount": f"{PAYOUT_AMOUNT:.2f}",
                "currency": "USD",
                "destination_token": f"tok_payout_{n % len(MERCHANTS):02d}xyz",
            },
        )
        for n in range(count)
    ]


def funding(*runs: int) -> tuple[int, Decimal]:
    """The debits that fund runs of that many payouts each (the merchants in turn, as
    ``_payout_bodies`` makes them): how many, each merchant's in turn as ``_debit_bodies``
    makes them, and the amount of each, at most FUNDING_MAX."""
    per_merchant = sum(-(-run // len(MERCHANTS)) for run in runs) * PAYOUT_AMOUNT
    each = max(1, math.ceil(per_merchant / FUNDING_MAX))
    amount = (per_merchant / each).quantize(Decimal("0.01"), rounding=ROUND_UP)
    return each * len(MERCHANTS), amount


def money_phase(stack: Stack) -> dict:
    from sandbox import FaultConfig, SandboxProcessor

    count, clients_count = CONFIG["money_payments"], CONFIG["money_clients"]
    payments_reset(stack.database_url, 0)  # empty tables: the runs' items are all there is
    token = _api_token()
    name, dlq, _ = queues_create("money")
    server = Gunicorn(
        stack,
        queue=(name, dlq),
        workers=CONFIG["money_gunicorn_workers"],
        threads=CONFIG["gunicorn_threads"],
    ).start()
    sandbox = SandboxProcessor(
        callback_url=f"{server.url}/callbacks/processor/",
        faults=FaultConfig(settle_after_seconds=0.2),
        callback_threads=8,
    ).start()
    env = stack.env(name, dlq, PROCESSOR_BASE_URL=sandbox.base_url)
    cmd = worker_command(until_empty=False, wait_time=20, relay=True)
    workers = [
        spawn(cmd, env, RESULTS / f"money-worker-{i}.log") for i in range(CONFIG["money_workers"])
    ]
    out: dict = {
        "items": count,
        "clients": clients_count,
        "workers": len(workers),
        "gunicorn": " ".join(server.command[1:]),
        "worker_command": " ".join(["manage.py", *cmd[2:]]),
    }
    try:
        time.sleep(2)  # let the workers start their first long poll
        if any(w.poll() is not None for w in workers):
            raise BenchError(f"a worker exited at start; see {RESULTS}/money-worker-*.log")
        meter = CpuMeter(stack, server, workers)
        clients = Clients(server.url, token, clients_count)
        _warm_up(stack, meter, clients, count)
        out["debits"], debits = _run(stack, meter, clients, "debits", _debit_bodies(count, "run"))
        out["refunds"], refunds = _run(stack, meter, clients, "refunds", _refund_bodies(debits))
        out["payouts"], payouts = _run(stack, meter, clients, "payouts", _payout_bodies(count))
        if "profile" in CONFIG["phases"]:
            out["profile"], profiled = _debits_profiled(stack, meter, clients, server, workers)
            debits += profiled
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
    _verify(sandbox, debits, {"refunds": refunds, "payouts": payouts})
    d = out["debits"]
    for what in ("refund", "payout"):
        run = out[f"{what}s"]
        out[f"{what}_vs_debit_rate"] = stats.ratio(
            run["confirmed_per_second"], d["confirmed_per_second"]
        )
        out[f"{what}_vs_debit_cpu"] = stats.ratio(run["cpu_ms_per_item"], d["cpu_ms_per_item"])
        out[f"{what}_vs_debit_api_rate"] = stats.ratio(run["api_per_second"], d["api_per_second"])
        out[f"{what}_vs_debit_cpu_paced"] = _paced_ratio(run, d)
    out["goals"] = money_goals(out)
    log(
        f"money: against the debits, refunds' rate {fmt(out['refund_vs_debit_rate'], 2)} and CPU "
        f"per item {fmt(out['refund_vs_debit_cpu'], 2)}, payouts' "
        f"{fmt(out['payout_vs_debit_rate'], 2)} and {fmt(out['payout_vs_debit_cpu'], 2)}; the "
        f"CPU paced by the generator's {fmt(out['refund_vs_debit_cpu_paced'], 2)} and "
        f"{fmt(out['payout_vs_debit_cpu_paced'], 2)}"
    )
    return out


def _paced_ratio(run: dict, debits: dict) -> float | None:
    """``run``'s CPU per item against the debits', each first divided by its run's load
    generator's CPU per item. The generator does the same work for every item of every run (a
    request, the sandbox's call and two callbacks), so its CPU moves only with the machine's
    speed, which moves by a tenth or more within one phase on a shared machine: this ratio
    takes that out. Reported beside the plain ratio, which the goal judges."""
    generator = (
        run["cpu_ms_per_event"].get("generator"),
        debits["cpu_ms_per_event"].get("generator"),
    )
    if not all(generator):
        return None
    return stats.ratio(
        run["cpu_ms_per_item"] / generator[0], debits["cpu_ms_per_item"] / generator[1]
    )


def _debits_profiled(
    stack: Stack, meter: CpuMeter, clients: Clients, server: Gunicorn, workers: list
) -> tuple[dict, list[str]]:
    """With the ``profile`` phase: one more run of debits, after the measured ones, with py-spy
    sampling every web and worker process: where a debit's life spends its CPU in each, as the
    processes run it under load (not in one process through the test client). Its figures are
    not the run's: the sampling slows what it samples."""
    count = CONFIG["money_payments"]
    raws = {
        **{f"web-{i}": pid for i, pid in enumerate(server.worker_pids())},
        **{f"worker-{i}": w.pid for i, w in enumerate(workers)},
    }
    spies = {
        name: (py_spy(pid, raw, gil=True), raw)
        for name, pid in raws.items()
        for raw in [RESULTS / f"profile-money-{name}.txt"]
    }
    _, made = _run(stack, meter, clients, "profiled debits", _debit_bodies(count, "spy"))
    out: dict = {}
    for name, (spy, raw) in spies.items():
        if spy is None:
            continue
        py_spy_finish(spy, 60, stop=True)
        if raw.exists():
            categories = MONEY_WEB_CATEGORIES if name.startswith("web") else MONEY_WORKER_CATEGORIES
            out[name] = {
                **profile_summary(raw),
                "breakdown_percent": profile_breakdown(raw, categories),
            }
            log(f"money, profiled {name}: {out[name]['breakdown_percent']}")
    return out, made


def _warm_up(stack: Stack, meter: CpuMeter, clients: Clients, payouts: int) -> None:
    """Every thread's connections, caches and first requests of the three paths, unmeasured
    (the debits run first, and would otherwise pay them alone); and the merchants' funding for
    the warm-up's payouts and the measured ones, settled before any payout asks for it."""
    warm = _run(stack, meter, clients, "warm-up debits", _debit_bodies(WARM_UP, "warm"))[1]
    _run(stack, meter, clients, "warm-up refunds", _refund_bodies(warm))
    count, amount = funding(payouts, WARM_UP)
    _run(stack, meter, clients, "funding debits", _debit_bodies(count, "fund", amount))
    _run(stack, meter, clients, "warm-up payouts", _payout_bodies(WARM_UP))


# Each run's figure, the goal's key in GOALS, and which way meets it.
_LIFE_GOALS = (
    ("created_per_second", "money_created_per_second", ">="),
    ("confirmed_per_second", "money_confirmed_per_second", ">="),
    ("cpu_ms_per_item", "money_cpu_ms_per_payment", "<="),
)


def money_goals(out: dict) -> dict[str, dict[str, dict]]:
    """Each run's figures against the goals, by run and goal: the value, the goal and whether
    it is met (None when the figure is missing). Reported, never enforced."""
    verdicts: dict[str, dict[str, dict]] = {}
    for what in ("debits", "refunds", "payouts"):
        run = out.get(what)
        if not run:
            continue
        goals = {key: (run.get(figure), GOALS[key], way) for figure, key, way in _LIFE_GOALS}
        if what != "debits":
            single = what[:-1]
            for kind, way in (("rate", ">="), ("cpu", "<=")):
                key = f"{single}_vs_debit_{kind}"
                goals[key] = (out.get(key), GOALS[key], way)
        verdicts[what] = {
            key: {"value": value, "goal": goal, "way": way, "met": _met(value, goal, way)}
            for key, (value, goal, way) in goals.items()
        }
    return verdicts


def _met(value: float | None, goal: float, way: str) -> bool | None:
    if value is None:
        return None
    return value >= goal if way == ">=" else value <= goal
