"""``make chaos``: payments through the real stack while faults are injected, then the invariants.

The stack, every part a real process on 127.0.0.1, on a fresh PostgreSQL database:

- fauxqs (the local SQS server), reached by every other process through a small TCP proxy of
  this module, so the queue endpoint can be cut and restored without losing fauxqs' in-memory
  queues (restarting fauxqs itself would be data loss, not an outage);
- the sandbox processor (``bench.chaos_sandbox``: the project's SandboxProcessor with seeded
  faults, recording every callback it delivers);
- gunicorn serving the web app (payments API and callback endpoint);
- two ``run_sqs_worker`` processes (which also relay the outbox) with a 3 s visibility timeout.

Faults, all bounded in count and time: processor 5xx, 4xx, timeouts and latencies above the
visibility timeout; duplicate and delayed callbacks; returns, before settlement and some seconds
after it (duplicated and delayed like any callback); source-token rules (tok_fail5xx_2,
tok_timeout_1, tok_reject, tok_return, tok_nsf, tok_unauth, tok_dupcb); a worker SIGKILLed every
few seconds and restarted; a window in which the queue endpoint refuses connections (the
callback endpoint answers 503 and the processor retries its callbacks; payments created
meanwhile are published by the outbox relay afterwards); a processor outage (every API call has
its connection dropped) lasting PROCESSOR_OUTAGE_SECONDS, more than three times the workers'
whole retry budget, which the processor's circuit breaker must turn into one incident and no
dead letter, followed by PROCESSOR_FLAP_SECONDS of flapping (every other debit fails), one
incident too; the run's database refusing every connection for DATABASE_OUTAGE_SECONDS (no
receive spent, no dead letter); PostgreSQL backends of the run's database terminated a few
times; two gunicorn workers SIGKILLed; and a faulty processor's callbacks (``settled`` for a
payment it rejected, an event for an unknown payment, a reused event id with another amount),
which must end in triage.
Payments are created through ``POST /api/payments/`` with an Idempotency-Key, retried with the
same key on 5xx, 409 and connection errors.

Then it waits (bounded) until nothing moves, runs ``ingest_dlq``, stops the processor to read
its record, and runs ``bench.invariants``. Output: a summary, the invariant report, and
``bench/results/chaos/`` (every process's log, ``report.json``).

Settings (environment): CHAOS_PAYMENTS (default 1000), CHAOS_SECONDS (length of the fault
window; default 60 + payments / 4: payments are created over its first 70 %), CHAOS_QUIESCE_SECONDS
(longest wait for the system to settle afterwards, default 300; it stops sooner when nothing
finished for 60 s), CHAOS_SEED (default 1), CHAOS_DATABASE (default payments_chaosrun; dropped and
created by the run).

Exit status: 0 all invariants hold; 1 an invariant is violated or the API lost or doubled a
payment; 3 the system did not settle within CHAOS_QUIESCE_SECONDS (the invariants are still
checked and printed); 2 the run itself could not be set up, or a fault could not be injected.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

import requests

from bench.env import EnvError, env_int
from bench.stack import database_create, database_url, free_port, stop_process

ROOT = Path(__file__).resolve().parent.parent
# Under bench/results/ (git-ignored), not var/: ``make demo`` starts by deleting var/.
VAR = ROOT / "bench" / "results" / "chaos"
PYTHON = sys.executable
VISIBILITY_TIMEOUT = 3
STALL_SECONDS = 60
MERCHANTS = 10
# The workers' retry budget in this run (WORKER_* below): 6 attempts, backoff ceilings 0.5, 1, 2,
# 4, 4 s, so at most 11.5 s from the first try to the dead letter. The outage lasts over 3x that.
RETRY_BUDGET_SECONDS = 0.5 + 1 + 2 + 4 + 4
PROCESSOR_OUTAGE_SECONDS = 36
PROCESSOR_OUTAGE_MODE = "reset"
# After the outage, the processor flaps (every other debit answers 503) for this long: the
# breaker must see it as an incident, one alert, and dead-letter nothing.
PROCESSOR_FLAP_SECONDS = 20
# Early in the run, the database refuses every connection (and drops the open ones) this long:
# no receive may be spent on it, no message dead-lettered.
DATABASE_OUTAGE_SECONDS = 10


class SetupError(Exception):
    """The run could not be set up (a port, a process, the database)."""


@dataclass(frozen=True)
class Config:
    payments: int
    seconds: int
    quiesce_seconds: int
    seed: int
    database: str

    @classmethod
    def from_env(cls) -> Config:
        database = os.environ.get("CHAOS_DATABASE", "payments_chaosrun")
        if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", database):
            raise SetupError(f"CHAOS_DATABASE={database!r}: use lower-case letters, digits, _")
        try:
            payments = env_int("CHAOS_PAYMENTS", 1000)
            return cls(
                payments=payments,
                seconds=env_int("CHAOS_SECONDS", 60 + payments // 4),
                quiesce_seconds=env_int("CHAOS_QUIESCE_SECONDS", 300),
                seed=env_int("CHAOS_SEED", 1),
                database=database,
            )
        except EnvError as exc:
            raise SetupError(str(exc)) from None


# --- the processes ---------------------------------------------------------------------------


def wait_tcp(port: int, timeout: float, process: Child | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and not process.alive:
            raise SetupError(f"{process.name} exited while starting: see {process.log_path}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise SetupError(f"nothing listens on 127.0.0.1:{port} after {timeout:.0f} s")


class Child:
    """One process of the stack, in its own session so it and its children stop together."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        self.name = name
        self.argv = argv
        self.env = env
        self.log_path = VAR / f"{name}.log"
        self.process: subprocess.Popen | None = None
        self.starts = 0
        self.killed_by_us = 0
        self.unexpected_exits: list[int] = []
        self.lock = threading.RLock()

    def start(self) -> Child:
        with self.lock:
            self.starts += 1
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.log_path, "a") as log:
                log.write(f"\n===== start {self.starts} at {time.strftime('%H:%M:%S')} =====\n")
                log.flush()
                self.process = subprocess.Popen(
                    self.argv,
                    cwd=ROOT,
                    env=self.env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
        return self

    @property
    def alive(self) -> bool:
        process = self.process
        return process is not None and process.poll() is None

    def sigkill(self) -> bool:
        """Kill it outright (a crash, as far as the system can tell); False if not running."""
        with self.lock:
            if self.process is None or self.process.poll() is not None:
                return False
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()
            self.process = None
            self.killed_by_us += 1
            return True

    def stop(self, timeout: float = 15) -> int | None:
        """SIGTERM the process group, then SIGKILL it if it does not exit in time."""
        process = self.process
        if process is None:
            return None
        stop_process(process, timeout, group=True)
        return process.returncode

    def check_exit(self) -> int | None:
        """If it exited by itself, record the status and return it."""
        with self.lock:
            if self.process is not None and self.process.poll() is not None:
                code = self.process.returncode
                self.unexpected_exits.append(code)
                self.process = None
                return code
        return None


class TcpProxy:
    """127.0.0.1:listen_port -> 127.0.0.1:target_port; ``cut()`` closes the listener and every
    open connection (new ones are refused), ``restore()`` listens again on the same port."""

    def __init__(self, listen_port: int, target_port: int) -> None:
        self.listen_port = listen_port
        self.target_port = target_port
        self.loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self.loop.run_forever, name="sqs-proxy")
        self._thread.daemon = True

    def start(self) -> TcpProxy:
        self._thread.start()
        self.restore()
        return self

    def _call(self, coro) -> None:
        asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    def restore(self) -> None:
        self._call(self._listen())

    def cut(self) -> None:
        self._call(self._cut())

    def close(self) -> None:
        self._call(self._close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)

    async def _close(self) -> None:
        await self._cut()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(
            self._handle, "127.0.0.1", self.listen_port, reuse_address=True
        )

    async def _cut(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._server is None:  # accepted just before a cut
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            return
        if self._server is None:
            writer.transport.abort()
            up_writer.transport.abort()
            return
        self._writers.update((writer, up_writer))

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.transport.abort()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._writers.discard(writer)
        self._writers.discard(up_writer)


# --- the load --------------------------------------------------------------------------------

# (share of payments, source-token prefix): the sandbox's token rules, for deterministic faults
# on top of the random ones.
TOKEN_MIX = (
    (0.03, "tok_reject"),
    (0.04, "tok_fail5xx_2"),
    (0.01, "tok_timeout_1"),
    (0.03, "tok_return"),
    (0.03, "tok_nsf"),  # settled, then returned R01
    (0.02, "tok_unauth"),  # settled, then returned R10
    (0.04, "tok_dupcb"),
)


def source_token(rng: random.Random, index: int) -> str:
    draw = rng.random()
    for share, prefix in TOKEN_MIX:
        if draw < share:
            return f"{prefix}_p{index:05d}"
        draw -= share
    return f"tok_chaos_p{index:05d}"


@dataclass
class LoadStats:
    created: dict[str, str] = field(default_factory=dict)  # Idempotency-Key -> payment id
    statuses: Counter = field(default_factory=Counter)
    retries: int = 0
    double_sends: int = 0
    failures: list[str] = field(default_factory=list)  # keys given up on, with the reason
    lock: threading.Lock = field(default_factory=threading.Lock)


# Every DOUBLE_SEND-th payment is sent twice at once with the same Idempotency-Key, as a client
# whose first try seemed to hang would: both answers must name the same payment.
DOUBLE_SEND = 20


def create_payments(
    *, base_url: str, token: str, config: Config, spread_seconds: float, stats: LoadStats
) -> None:
    """POST the payments at an even rate over ``spread_seconds``, four at a time; each one is
    retried with the same Idempotency-Key until it gets its answer (or 120 s pass)."""
    rng = random.Random(config.seed)
    jobs = []
    for i in range(config.payments):
        body = {
            "merchant_id": f"merchant-{i % MERCHANTS}",
            "amount": f"{Decimal(rng.randint(100, 50_000)) / 100:.2f}",
            "currency": "USD",
            "source_token": source_token(rng, i),
        }
        jobs.append((i, str(uuid.uuid4()), body))
    start = time.monotonic()
    interval = spread_seconds / max(config.payments, 1)
    queue = list(reversed(jobs))
    headers = {"Authorization": f"Token {token}"}

    def post(session: requests.Session, key: str, body: dict, answers: list[str]) -> None:
        deadline = time.monotonic() + 120
        attempt = 0
        while True:
            attempt += 1
            try:
                response = session.post(
                    f"{base_url}/api/payments/",
                    json=body,
                    headers={**headers, "Idempotency-Key": key},
                    timeout=15,
                )
                status = str(response.status_code)
            except requests.RequestException as exc:
                response, status = None, type(exc).__name__
            with stats.lock:
                stats.statuses[status] += 1
            if response is not None and response.status_code in (200, 201):
                answers.append(response.json()["id"])
                return
            retryable = (
                response is None
                or response.status_code in (409, 429)
                or (response.status_code >= 500)
            )
            if not retryable or time.monotonic() > deadline:
                text = response.text[:300] if response is not None else status
                with stats.lock:
                    stats.failures.append(f"{key}: {status} {text}")
                return
            with stats.lock:
                stats.retries += 1
            time.sleep(min(0.2 * 2 ** min(attempt, 4), 3.0))

    def run() -> None:
        session = requests.Session()
        while True:
            with stats.lock:
                if not queue:
                    return
                i, key, body = queue.pop()
            delay = start + i * interval - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            answers: list[str] = []
            twin = None
            if i % DOUBLE_SEND == 0:
                twin = threading.Thread(target=post, args=(requests.Session(), key, body, answers))
                twin.start()
            post(session, key, body, answers)
            if twin is not None:
                twin.join()
            with stats.lock:
                if answers:
                    stats.created[key] = answers[0]
                if len(set(answers)) > 1:
                    stats.failures.append(f"{key}: one key answered with payments {answers}")
                if twin is not None:
                    stats.double_sends += 1

    threads = [threading.Thread(target=run, name=f"load-{n}", daemon=True) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


# --- the run ---------------------------------------------------------------------------------


class ChaosRun:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.events: list[str] = []  # what was injected, when
        self.t0 = time.monotonic()
        self.ports = {name: free_port() for name in ("fauxqs", "proxy", "web", "sandbox")}
        self.database_url = database_url(config.database)
        self.record_path = VAR / "sandbox-record.json"
        self.env = self._environment()
        self.children: dict[str, Child] = {}
        self.proxy: TcpProxy | None = None
        self.workers: list[Child] = []
        self.stopping = threading.Event()
        self.pg_terminated = 0
        self.database_outages = 0
        self.web_kills = 0
        self.harness_errors: list[str] = []
        self.injected: list[dict] = []  # callbacks this run sent as a faulty processor would

    def log(self, message: str) -> None:
        line = f"[{time.monotonic() - self.t0:7.1f}s] {message}"
        self.events.append(line)
        print(line, flush=True)

    def _environment(self) -> dict[str, str]:
        # Nothing from the caller's environment that could point the run elsewhere (an AWS
        # endpoint, an alert webhook, a mail server, another database).
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(
                ("SANDBOX_", "SQS_", "GUNICORN_", "PROCESSOR_", "DJANGO_", "AWS_", "ALERT_",
                 "CELERY_", "EMAIL_", "ADMINS", "DATABASE_", "CALLBACK_", "WORKER_",
                 "PROMETHEUS_")
            )
        }  # fmt: skip
        env.update(
            {
                "PATH": f"{Path(PYTHON).parent}{os.pathsep}{env.get('PATH', '')}",
                "PYTHONUNBUFFERED": "1",
                "DJANGO_SETTINGS_MODULE": "config.settings.base",
                "SECRET_KEY": f"chaos-{uuid.uuid4().hex}",
                "DEBUG": "false",
                "ALLOWED_HOSTS": "127.0.0.1,localhost",
                "DATABASE_URL": self.database_url,
                "AWS_ACCESS_KEY_ID": "chaos",
                "AWS_SECRET_ACCESS_KEY": "chaos",
                "AWS_REGION": "us-east-1",
                "SQS_ENDPOINT_URL": f"http://127.0.0.1:{self.ports['proxy']}",
                "SQS_QUEUE_NAME": "chaos.fifo",
                "SQS_DLQ_NAME": "chaos-dlq.fifo",
                "PROCESSOR_BASE_URL": f"http://127.0.0.1:{self.ports['sandbox']}",
                "PROCESSOR_API_KEY": "chaos-processor-key",
                # Above the 3 s visibility timeout, so slow answers outlive it; the injected
                # timeouts sleep 5 s, past it.
                "PROCESSOR_TIMEOUT_SECONDS": "4",
                "CALLBACK_SIGNING_SECRETS": "chaos-signing-secret",
                # A bounded run: retries come back within seconds, not the production 30 s cap.
                "WORKER_BACKOFF_BASE_SECONDS": "0.5",
                "WORKER_BACKOFF_CAP_SECONDS": "4",
                "WORKER_MAX_ATTEMPTS": "6",
                # Shorter pauses than production's 15-300 s, so recovery fits a bounded run.
                "PROCESSOR_BREAKER_PAUSE_SECONDS": "5",
                "PROCESSOR_BREAKER_MAX_PAUSE_SECONDS": "20",
                "GUNICORN_BIND": f"127.0.0.1:{self.ports['web']}",
                "GUNICORN_WORKERS": "2",
                "GUNICORN_THREADS": "8",
                "LOG_LEVEL": "INFO",
                # The project's .env is read too, for what is not set here: alerts go to the
                # log only, mail to the console.
                "ALERT_WEBHOOK_URL": "",
                "ADMINS": "",
                "EMAIL_BACKEND": "django.core.mail.backends.console.EmailBackend",
                "CELERY_BROKER_URL": "memory://",
                # The processor's faults (sandbox/faults.py).
                "SANDBOX_P_5XX": "0.05",
                "SANDBOX_P_4XX": "0.02",
                "SANDBOX_P_TIMEOUT": "0.01",
                "SANDBOX_TIMEOUT_SECONDS": "5",
                # Lognormal: median 5 ms, mean near 150 ms, about 1.7 % of answers take 3 to
                # 3.9 s, past the visibility timeout and inside the client's timeout.
                "SANDBOX_LATENCY_MEDIAN_MS": "5",
                "SANDBOX_LATENCY_SIGMA": "3.0",
                "SANDBOX_LATENCY_MAX_MS": "3900",
                "SANDBOX_P_DUPLICATE_CALLBACK": "0.10",
                "SANDBOX_P_DELAYED_CALLBACK": "0.10",
                "SANDBOX_CALLBACK_DELAY_SECONDS": "4",
                "SANDBOX_P_RETURN": "0.05",
                "SANDBOX_SETTLE_AFTER_SECONDS": "0.5",
                # Settled debits that come back afterwards (R01 or R10), on top of tok_nsf and
                # tok_unauth.
                "SANDBOX_P_SETTLED_RETURN": "0.03",
                "SANDBOX_RETURN_AFTER_SECONDS": "2",
            }
        )
        return env

    # --- set-up
    def database_create(self) -> None:
        database_create(self.config.database)
        self.manage("migrate", "--no-input", "-v", "0")
        self.log(f"database {self.config.database} created and migrated")

    def manage(self, *args: str, timeout: float = 120) -> str:
        result = subprocess.run(
            [PYTHON, "manage.py", *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if result.returncode != 0:
            raise SetupError(
                f"manage.py {' '.join(args)} failed ({result.returncode}): "
                f"{(result.stderr or result.stdout)[-2000:]}"
            )
        return result.stdout

    def django_setup(self) -> str:
        """Set up Django in this process against the run's database; return an API token."""
        os.environ.clear()
        os.environ.update(self.env)
        import django

        django.setup()
        from django.contrib.auth import get_user_model
        from rest_framework.authtoken.models import Token

        from payments.models import MerchantAccess

        user = get_user_model().objects.create_user("chaos")
        # The API acts only for granted merchants: the load's merchants are granted.
        MerchantAccess.objects.bulk_create(
            MerchantAccess(user=user, merchant_id=f"merchant-{i}") for i in range(MERCHANTS)
        )
        return Token.objects.create(user=user).key

    def start_stack(self) -> None:
        ports = self.ports
        fauxqs = Child(
            "fauxqs", ["node", "localsqs/server.mjs", str(ports["fauxqs"])], self.env
        ).start()
        self.children["fauxqs"] = fauxqs
        wait_tcp(ports["fauxqs"], 15, fauxqs)
        self.proxy = TcpProxy(ports["proxy"], ports["fauxqs"]).start()
        self.log(f"fauxqs on :{ports['fauxqs']}, reached through the proxy on :{ports['proxy']}")
        print(self.manage("setup_queues", "--visibility-timeout", str(VISIBILITY_TIMEOUT)))
        web = Child(
            "web",
            [str(Path(PYTHON).parent / "gunicorn"), "config.wsgi", "-c", "config/gunicorn.py"],
            self.env,
        ).start()
        self.children["web"] = web
        wait_tcp(ports["web"], 30, web)
        callback_url = f"http://127.0.0.1:{ports['web']}/callbacks/processor/"
        sandbox = Child(
            "sandbox",
            [
                PYTHON, "-m", "bench.chaos_sandbox",
                "--port", str(ports["sandbox"]),
                "--callback-url", callback_url,
                "--seed", str(self.config.seed),
                "--record", str(self.record_path),
            ],
            self.env,
        ).start()  # fmt: skip
        self.children["sandbox"] = sandbox
        wait_tcp(ports["sandbox"], 30, sandbox)
        for n in (1, 2):
            worker = Child(
                f"worker{n}",
                [
                    PYTHON, "manage.py", "run_sqs_worker",
                    "--visibility-timeout", str(VISIBILITY_TIMEOUT),
                    "--wait-time", "1",
                    "--batch-size", "10",
                ],
                self.env,
            ).start()  # fmt: skip
            self.children[worker.name] = worker
            self.workers.append(worker)
        self.log(
            f"web :{ports['web']}, sandbox :{ports['sandbox']}, 2 workers "
            f"(visibility {VISIBILITY_TIMEOUT} s)"
        )

    # --- faults
    def thread(self, target, *args) -> threading.Thread:
        """A daemon thread whose failure is reported: a fault that was not injected would make
        a passing run mean less than it says."""

        def run() -> None:
            try:
                target(*args)
            except Exception as exc:  # noqa: BLE001 - reported and fails the run
                self.harness_errors.append(f"{target.__name__}: {type(exc).__name__}: {exc}")
                self.log(f"HARNESS ERROR in {target.__name__}: {type(exc).__name__}: {exc}")

        return threading.Thread(target=run, name=target.__name__, daemon=True)

    def supervise(self) -> None:
        """Restart a worker that exited on its own (and say so: that is worth a look)."""
        while not self.stopping.wait(0.5):
            for worker in self.workers:
                code = worker.check_exit()
                if code is not None:
                    self.log(f"UNEXPECTED: {worker.name} exited by itself with status {code}")
                    worker.start()
            for name in ("web", "sandbox", "fauxqs"):
                code = self.children[name].check_exit()
                if code is not None:
                    self.log(f"UNEXPECTED: {name} exited with status {code}; not restarted")

    def kill_workers(self, until: float) -> None:
        n = 0
        while not self.stopping.wait(self.rng.uniform(3, 6)):
            if time.monotonic() > until:
                return
            worker = self.workers[n % len(self.workers)]
            n += 1
            if worker.sigkill():
                self.log(f"fault: SIGKILL {worker.name}")
                time.sleep(0.5)
                worker.start()

    def kill_web_workers(self, times: list[float]) -> None:
        """SIGKILL one gunicorn worker (the master starts another): requests in flight die,
        so the API's clients retry with their Idempotency-Key and the processor its callbacks."""
        for at in times:
            if self.stopping.wait(max(0.0, at - time.monotonic())):
                return
            master = self.children["web"].process
            if master is None:
                continue
            try:
                children = Path(f"/proc/{master.pid}/task/{master.pid}/children").read_text()
            except OSError:
                continue
            pids = [int(p) for p in children.split()]
            if pids:
                os.kill(pids[0], signal.SIGKILL)
                self.web_kills += 1
                self.log(f"fault: SIGKILL gunicorn worker {pids[0]}")

    def queue_outage(self, at: float, seconds: float) -> None:
        if self.stopping.wait(max(0.0, at - time.monotonic())):
            return
        assert self.proxy is not None
        self.proxy.cut()
        self.log(f"fault: queue endpoint down for {seconds:.0f} s (proxy cut)")
        self.stopping.wait(seconds)
        self.proxy.restore()
        self.log("fault: queue endpoint back")

    def processor_outage(self, at: float, seconds: float) -> None:
        """The processor goes down as a whole (the sandbox's outage mode, over HTTP)."""
        if self.stopping.wait(max(0.0, at - time.monotonic())):
            return
        url = f"http://127.0.0.1:{self.ports['sandbox']}/_sandbox/outage"
        response = requests.post(
            url, json={"mode": PROCESSOR_OUTAGE_MODE, "seconds": seconds}, timeout=10
        )
        response.raise_for_status()
        self.log(
            f"fault: processor down ({PROCESSOR_OUTAGE_MODE}) for {seconds:.0f} s, "
            f"{seconds / RETRY_BUDGET_SECONDS:.1f}x the retry budget"
        )
        self.stopping.wait(seconds)
        self.log("fault: processor back")

    def processor_flap(self, at: float, seconds: float) -> None:
        """The processor flaps: every other debit fails (the sandbox's "flap" outage mode)."""
        if self.stopping.wait(max(0.0, at - time.monotonic())):
            return
        url = f"http://127.0.0.1:{self.ports['sandbox']}/_sandbox/outage"
        requests.post(url, json={"mode": "flap", "seconds": seconds}, timeout=10).raise_for_status()
        self.log(f"fault: processor flapping (every other debit 503) for {seconds:.0f} s")
        self.stopping.wait(seconds)
        self.log("fault: processor flap over")

    def database_outage(self, at: float, seconds: float) -> None:
        """The run's database refuses new connections and loses its open ones for ``seconds``
        (the shared server stays up for everyone else)."""
        import psycopg
        from psycopg import sql

        if self.stopping.wait(max(0.0, at - time.monotonic())):
            return
        name = sql.Identifier(self.config.database)
        admin = "postgresql://postgres@127.0.0.1:5432/postgres"
        try:
            with psycopg.connect(admin, autocommit=True) as c:
                c.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false").format(name))
                rows = c.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = %s AND pid <> pg_backend_pid()",
                    (self.config.database,),
                ).fetchall()
            self.database_outages += 1
            self.log(f"fault: database down for {seconds:.0f} s ({len(rows)} connection(s) cut)")
            self.stopping.wait(seconds)
        finally:
            with psycopg.connect(admin, autocommit=True) as c:
                c.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS true").format(name))
            self.log("fault: database back")

    def terminate_backends(self, times: list[float]) -> None:
        import psycopg

        for at in times:
            if self.stopping.wait(max(0.0, at - time.monotonic())):
                return
            try:
                with psycopg.connect(
                    "postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True
                ) as c:
                    rows = c.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE datname = %s AND pid <> pg_backend_pid()",
                        (self.config.database,),
                    ).fetchall()
            except psycopg.Error as exc:
                self.log(f"could not terminate backends: {exc}")
                continue
            self.pg_terminated += len(rows)
            self.log(f"fault: pg_terminate_backend on {len(rows)} connection(s)")

    def post_callback(self, body: dict) -> bool:
        """Deliver one signed callback as the processor does, retrying 5xx and connection errors
        for up to 30 s; True once it is accepted (202)."""
        from payments import signing

        raw = json.dumps(body, separators=(",", ":")).encode()
        url = f"http://127.0.0.1:{self.ports['web']}/callbacks/processor/"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not self.stopping.is_set():
            headers = {
                "Content-Type": "application/json",
                signing.HEADER: signing.sign(raw, [self.env["CALLBACK_SIGNING_SECRETS"]]),
            }
            try:
                response = requests.post(url, data=raw, headers=headers, timeout=10)
            except requests.RequestException:
                time.sleep(1)
                continue
            if response.status_code == 202:
                self.injected.append(body)
                return True
            if response.status_code < 500:
                self.log(f"injected callback refused ({response.status_code}): {response.text}")
                return False
            time.sleep(1)
        return False

    def inject_processor_bugs(self, at: float) -> None:
        """Callbacks a faulty processor sends, which must end in front of a human, not vanish:
        ``settled`` for a payment it rejected (then ``failed`` for it, which must wait behind the
        hold), an event for a payment that does not exist, and a reused processor_event_id with
        another amount (a conflict)."""
        if self.stopping.wait(max(0.0, at - time.monotonic())):
            return
        from django.db import connection
        from django.utils import timezone

        from payments.models import EventOutcome, PaymentEvent, PaymentState
        from payments.models import Payment as PaymentModel

        connection.close()  # it may have been terminated
        now = timezone.now().isoformat()

        def event(payment_id: str, event_type: str, amount: str, event_id: str = "") -> dict:
            return {
                "payment_id": payment_id,
                "event_type": event_type,
                "processor_event_id": event_id or f"evt_chaos_{uuid.uuid4().hex}",
                "amount": amount,
                "timestamp": now,
            }

        rejected = list(
            PaymentModel.objects.filter(
                state=PaymentState.FAILED, source_token__startswith="tok_reject"
            ).values_list("id", "amount")[:2]
        )
        for payment_id, amount in rejected:
            if self.post_callback(event(str(payment_id), "settled", f"{amount:.2f}")):
                self.log(f"fault: processor sent settled for rejected payment {payment_id}")
            time.sleep(1)
            self.post_callback(event(str(payment_id), "failed", f"{amount:.2f}"))
        if self.post_callback(event(str(uuid.uuid4()), "settled", "10.00")):
            self.log("fault: processor sent an event for a payment that does not exist")
        settled = list(
            PaymentEvent.objects.filter(
                event_type="settled", outcome=EventOutcome.APPLIED
            ).values_list("payment_id", "processor_event_id", "payment__amount")[:2]
        )
        for payment_id, event_id, amount in settled:
            body = event(str(payment_id), "settled", f"{amount + 1:.2f}", event_id)
            if self.post_callback(body):
                self.log(
                    f"fault: processor reused event id {event_id} with amount {body['amount']}"
                )

    # --- settling
    def sandbox_stats(self) -> dict:
        response = requests.get(
            f"http://127.0.0.1:{self.ports['sandbox']}/_sandbox/stats", timeout=10
        )
        response.raise_for_status()
        return response.json()

    def backlog(self) -> dict[str, int]:
        from django.db import connection

        from callbacks import sqs
        from callbacks.models import UNFINISHED_STATUSES, QueueMessage
        from payments.models import OutboxMessage

        connection.close()  # the run may have terminated this process's connection
        attributes = (
            sqs.sqs_client()
            .get_queue_attributes(
                QueueUrl=sqs.queue_url(self.env["SQS_QUEUE_NAME"]),
                AttributeNames=[
                    "ApproximateNumberOfMessages",
                    "ApproximateNumberOfMessagesNotVisible",
                    "ApproximateNumberOfMessagesDelayed",
                ],
            )
            .get("Attributes", {})
        )
        return {
            "queued": sum(int(v) for v in attributes.values()),
            "unfinished messages": QueueMessage.objects.filter(
                status__in=UNFINISHED_STATUSES
            ).count(),
            "unpublished outbox": OutboxMessage.objects.filter(published_at__isnull=True).count(),
            "callbacks pending": int(self.sandbox_stats().get("callbacks_pending", 0)),
        }

    def wait_quiet(self) -> tuple[bool, dict]:
        """Poll until nothing is queued, running, unpublished or undelivered three times in a
        row. Gives up after CHAOS_QUIESCE_SECONDS, or after STALL_SECONDS without a single
        message finishing (stuck, not slow)."""
        from callbacks.models import FINISHED_STATUSES, QueueMessage

        deadline = time.monotonic() + self.config.quiesce_seconds
        quiet_polls, finished, last_progress = 0, -1, time.monotonic()
        backlog: dict = {}
        while time.monotonic() < deadline and time.monotonic() - last_progress < STALL_SECONDS:
            try:
                backlog = self.backlog()
                done = QueueMessage.objects.filter(status__in=FINISHED_STATUSES).count()
            except Exception as exc:  # noqa: BLE001 - keep polling until the deadline
                backlog = {"error": f"{type(exc).__name__}: {exc}"}
                quiet_polls = 0
            else:
                quiet_polls = quiet_polls + 1 if not any(backlog.values()) else 0
                if done != finished:
                    finished, last_progress = done, time.monotonic()
            if quiet_polls >= 3:
                return True, backlog
            time.sleep(1)
        return False, backlog

    def ingest_dead_letters(self) -> int:
        total = 0
        for _ in range(20):
            out = self.manage("ingest_dlq", "--max-messages", "1000")
            match = re.search(r"(\d+) new dead letter", out)
            stored = int(match.group(1)) if match else 0
            total += stored
            if stored == 0:
                break
        return total

    # --- the whole run
    def run(self) -> int:
        VAR.mkdir(parents=True, exist_ok=True)
        for old in VAR.glob("*"):
            old.unlink()
        config = self.config
        self.log(
            f"chaos: {config.payments} payments, {config.seconds} s of faults, seed "
            f"{config.seed}, database {config.database}"
        )
        self.database_create()
        token = self.django_setup()
        self.start_stack()

        start = time.monotonic()
        end = start + config.seconds
        load = LoadStats()
        spread = config.seconds * 0.7
        threads = [
            self.thread(self.supervise),
            self.thread(self.kill_workers, end),
            self.thread(self.queue_outage, start + config.seconds * 0.35, 5.0),
            self.thread(
                self.processor_outage,
                outage_at := start + max(config.seconds - PROCESSOR_OUTAGE_SECONDS - 10, 0) * 0.6,
                float(PROCESSOR_OUTAGE_SECONDS),
            ),
            self.thread(
                self.processor_flap,
                outage_at + PROCESSOR_OUTAGE_SECONDS + 2,
                float(PROCESSOR_FLAP_SECONDS),
            ),
            self.thread(
                self.database_outage, start + config.seconds * 0.1, float(DATABASE_OUTAGE_SECONDS)
            ),
            self.thread(self.kill_web_workers, [start + config.seconds * f for f in (0.3, 0.55)]),
            self.thread(self.inject_processor_bugs, start + config.seconds * 0.6),
            self.thread(
                self.terminate_backends, [start + config.seconds * f for f in (0.2, 0.5, 0.8)]
            ),
        ]
        for thread in threads:
            thread.start()
        create_payments(
            base_url=f"http://127.0.0.1:{self.ports['web']}",
            token=token,
            config=config,
            spread_seconds=spread,
            stats=load,
        )
        self.log(
            f"load done: {len(load.created)} payments created, {load.retries} retries, "
            f"answers {dict(load.statuses)}"
        )
        remaining = end - time.monotonic()
        if remaining > 0:
            self.stopping.wait(remaining)
        fault_threads, supervisor = threads[1:], threads[0]
        for thread in fault_threads:
            thread.join(timeout=15)
        self.log("fault window over; waiting for the system to settle")

        settled, backlog = self.wait_quiet()
        self.log(f"{'settled' if settled else 'DID NOT SETTLE'}: {backlog}")
        self.stopping.set()
        supervisor.join(timeout=5)
        try:
            dead_letters = self.ingest_dead_letters()
            self.log(f"ingest_dlq stored {dead_letters} dead letter(s)")
        except (SetupError, subprocess.TimeoutExpired) as exc:
            dead_letters = -1
            self.log(f"FAILED: ingest_dlq: {exc}")

        for worker in self.workers:
            worker.stop()
        self.children["sandbox"].stop(timeout=30)
        record = json.loads(self.record_path.read_text())
        from django.db import connection

        from bench.invariants import check_invariants

        connection.close()
        sent = record["delivered"] + self.injected
        # What the checker reads, kept so it can be re-run on this database by hand.
        (VAR / "sandbox-stats.json").write_text(json.dumps(record["stats"]))
        (VAR / "callbacks-sent.json").write_text(json.dumps(sent))
        report = check_invariants(sandbox_stats=record["stats"], callbacks_sent=sent)
        api_problems = self.check_api(load)
        summary = self.summary(load, record["stats"], settled, backlog, dead_letters)
        print(summary)
        print(report.render())
        for problem in api_problems:
            print(f"  FAIL api: {problem}")
        (VAR / "report.json").write_text(
            json.dumps(
                {
                    "config": config.__dict__,
                    "events": self.events,
                    "settled": settled,
                    "backlog": backlog,
                    "api_problems": api_problems,
                    "harness_errors": self.harness_errors,
                    "load": {
                        "created": len(load.created),
                        "statuses": dict(load.statuses),
                        "retries": load.retries,
                        "failures": load.failures,
                    },
                    "sandbox": record["stats"],
                    "invariants": report.as_dict(),
                },
                indent=2,
                default=str,
            )
        )
        print(
            f"logs and report.json in {VAR.relative_to(ROOT)}/; check again with: "
            f"DJANGO_SETTINGS_MODULE=config.settings.test DATABASE_URL={self.database_url} "
            f"{Path(PYTHON).relative_to(ROOT) if ROOT in Path(PYTHON).parents else PYTHON} "
            "-m bench.invariants "
            f"--sandbox-stats {VAR.relative_to(ROOT)}/sandbox-stats.json "
            f"--callbacks-sent {VAR.relative_to(ROOT)}/callbacks-sent.json"
        )
        if not report.ok or api_problems:
            return 1
        if self.harness_errors:
            print(f"chaos: the fault schedule did not run fully: {self.harness_errors}")
            return 2
        return 0 if settled else 3

    def check_api(self, load: LoadStats) -> list[str]:
        """Each acknowledged Idempotency-Key made exactly one payment; none was lost."""
        from payments.models import Payment

        problems = []
        if load.failures:
            problems.append(
                f"{len(load.failures)} payment request(s) never got an answer: "
                + "; ".join(load.failures[:5])
            )
        ids = set(load.created.values())
        stored = {str(pk) for pk in Payment.objects.values_list("id", flat=True)}
        if len(ids) != len(load.created):
            problems.append("two Idempotency-Keys were answered with the same payment")
        if stored - ids:
            problems.append(
                f"{len(stored - ids)} payment(s) in the database that no answer named "
                f"(a retry created a second payment): {sorted(stored - ids)[:5]}"
            )
        if ids - stored:
            problems.append(f"{len(ids - stored)} acknowledged payment(s) are not in the database")
        return problems

    def summary(
        self, load: LoadStats, stats: dict, settled: bool, backlog: dict, dead_letters: int
    ) -> str:
        from django.db.models import Count

        from callbacks.models import ParkedMessage, PaymentHold
        from payments.models import (
            CircuitBreakerTransition,
            LedgerEntry,
            Payment,
            PaymentReturn,
            ProcessorAttempt,
        )
        from triage.models import DeadLetter

        states = dict(Payment.objects.values_list("state").annotate(n=Count("id")))
        attempts = dict(ProcessorAttempt.objects.values_list("outcome").annotate(n=Count("id")))
        slow = ProcessorAttempt.objects.filter(
            latency_ms__gt=VISIBILITY_TIMEOUT * 1000, outcome="accepted"
        ).count()
        dead = dict(DeadLetter.objects.values_list("last_error_class").annotate(n=Count("id")))
        holds = PaymentHold.objects.filter(released_at__isnull=True, kind="triage").count()
        outage_holds = PaymentHold.objects.filter(kind="outage").count()
        parked = ParkedMessage.objects.count()
        kills = sum(w.killed_by_us for w in self.workers)
        breaker = dict(CircuitBreakerTransition.objects.values_list("kind").annotate(n=Count("id")))
        unexpected = {w.name: w.unexpected_exits for w in self.workers if w.unexpected_exits}
        tracebacks = {
            child.name: child.log_path.read_text(errors="replace").count("Traceback")
            for child in self.children.values()
            if child.log_path.exists()
        }
        returns = dict(
            PaymentReturn.objects.values_list("after_settlement").annotate(n=Count("id"))
        )
        reversals = LedgerEntry.objects.filter(kind="reversal").count()
        lines = [
            "",
            "chaos summary",
            f"  payments: {len(load.created)} created of {self.config.payments}; states {states}",
            f"  api answers: {dict(load.statuses)}; retries {load.retries}; "
            f"{load.double_sends} sent twice at once with one key",
            f"  processor: {stats.get('total_charges')} charges over "
            f"{len(stats.get('charges', {}))} keys; answers {stats.get('responses')}",
            f"  processor attempts: {attempts}; {slow} accepted after more than the "
            f"{VISIBILITY_TIMEOUT} s visibility timeout",
            f"  injected faulty callbacks accepted: {len(self.injected)}; dead letters by error "
            f"{dead}; active holds for a person {holds}; parked messages {parked}",
            f"  callbacks: delivered {stats.get('callbacks_sent')}, failed attempts "
            f"{stats.get('callback_failed_attempts')}, given up {stats.get('callbacks_given_up')}",
            f"  faults: {kills} worker SIGKILLs, {self.web_kills} gunicorn worker SIGKILLs, "
            f"{self.pg_terminated} PostgreSQL backends "
            f"terminated, one {5} s queue outage, {self.database_outages} database outage(s) of "
            f"{DATABASE_OUTAGE_SECONDS} s",
            f"  processor outage: {PROCESSOR_OUTAGE_SECONDS} s ({PROCESSOR_OUTAGE_MODE}), then "
            f"{PROCESSOR_FLAP_SECONDS} s of flapping; breaker {breaker}; submissions parked "
            f"through it {outage_holds}",
            f"  worker exits not caused by the run: {unexpected or 'none'}",
            f"  tracebacks in logs: {tracebacks}",
            f"  returns: {returns.get(True, 0)} after settlement ({reversals} ledger "
            f"reversals), {returns.get(False, 0)} before settlement",
            f"  settled: {settled} {backlog}; dead letters ingested: {dead_letters}",
        ]
        return "\n".join(lines)

    def shutdown(self) -> None:
        self.stopping.set()
        for child in reversed(list(self.children.values())):
            try:
                child.stop(timeout=10)
            except Exception as exc:  # noqa: BLE001 - stop the others whatever happens
                print(f"stopping {child.name}: {exc}", file=sys.stderr)
        if self.proxy is not None:
            self.proxy.close()


def main() -> int:
    try:
        config = Config.from_env()
    except SetupError as exc:
        print(f"chaos: {exc}", file=sys.stderr)
        return 2
    run = ChaosRun(config)
    try:
        return run.run()
    except SetupError as exc:
        print(f"chaos: cannot run: {exc}", file=sys.stderr)
        return 2
    finally:
        run.shutdown()


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
