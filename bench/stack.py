"""What a benchmark run shares between its phases: the environment of every child process, the
gunicorn it measures, the consumers and the profiler it starts. The commands themselves are
devstack's, shared with ``make chaos``."""

import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import requests

from bench.options import log
from devstack.processes import GUNICORN_CONFIG, PY, ROOT, free_port, gunicorn_command, stop_process

RESULTS = ROOT / "bench" / "results"


class BenchError(Exception):
    """The benchmark cannot go on; the message says what failed."""


@dataclass
class Stack:
    """What every child process needs to find the database, the queue and the settings."""

    database_url: str
    sqs_endpoint: str
    secrets: list[str]
    # Shared by every product process of the run, as on a production host (see
    # config/gunicorn.py): prometheus-client's multiprocess mode, with its file writes.
    metrics_dir: Path | None = None
    sqs_pid: int | None = None  # the local SQS server's process, for CPU accounting

    def env(self, queue_name: str = "", dlq_name: str = "", **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            DJANGO_SETTINGS_MODULE="bench.settings",
            DATABASE_URL=self.database_url,
            SQS_ENDPOINT_URL=self.sqs_endpoint,
            CALLBACK_SIGNING_SECRETS=",".join(self.secrets),
            AWS_ACCESS_KEY_ID=env.get("AWS_ACCESS_KEY_ID", "test"),
            AWS_SECRET_ACCESS_KEY=env.get("AWS_SECRET_ACCESS_KEY", "test"),
            PYTHONPATH=str(ROOT),
        )
        if self.metrics_dir is not None:
            env["PROMETHEUS_MULTIPROC_DIR"] = str(self.metrics_dir)
        if queue_name:
            env.update(SQS_QUEUE_NAME=queue_name, SQS_DLQ_NAME=dlq_name)
        env.update(extra)
        return env

    def manage(self, *args: str) -> str:
        done = subprocess.run(
            [PY, str(ROOT / "manage.py"), *args],
            env=self.env(),
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise BenchError(f"manage.py {' '.join(args)} failed:\n{done.stdout}{done.stderr}")
        return done.stdout


@dataclass
class WorkerRuns:
    """What bench/run.py lends the history and storage phases: its worker run, its config, its
    problem list."""

    run: Callable[..., dict]  # run(processes, *, prepare=None, during=None, tag="") -> result
    config: dict
    problems: list[str]


def metrics_dir_fresh() -> Path | None:
    """An empty directory for prometheus-client's multiprocess files when the production
    gunicorn config (which uses them) is present; None otherwise."""
    if not GUNICORN_CONFIG.exists():
        return None
    path = RESULTS / "prometheus"
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def queue_names(tag: str) -> tuple[str, str]:
    suffix = f"{tag}-{uuid.uuid4().hex[:8]}"
    return f"bench-{suffix}.fifo", f"bench-{suffix}-dlq.fifo"


class Gunicorn:
    """gunicorn serving config.wsgi with the bench settings, like production serves it."""

    def __init__(
        self,
        stack: Stack,
        *,
        queue: tuple[str, str],
        workers: int,
        threads: int,
        env: dict[str, str] | None = None,
    ):
        """``env``: the processes' whole environment, instead of the stack's for ``queue``."""
        self.stack, self.queue, self.workers, self.threads = stack, queue, workers, threads
        self.environment = env
        self.port = free_port()
        self.process: subprocess.Popen | None = None
        self.log = RESULTS / f"gunicorn-{self.port}.log"

    @property
    def command(self) -> list[str]:
        return gunicorn_command(
            "--bind", f"127.0.0.1:{self.port}",
            "--workers", str(self.workers),
            "--threads", str(self.threads),
        )  # fmt: skip

    def start(self) -> "Gunicorn":
        env = self.environment or self.stack.env(*self.queue)
        with self.log.open("w") as log:
            self.process = subprocess.Popen(
                self.command, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise BenchError(f"gunicorn exited at start; see {self.log}")
            try:
                if requests.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.2)
        raise BenchError(f"gunicorn did not answer /healthz within 30 s; see {self.log}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def worker_pids(self) -> list[int]:
        if self.process is None:
            return []
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        try:
            return [int(p) for p in children.read_text().split()]
        except OSError:
            return []

    def stop(self) -> None:
        stop_process(self.process)


def spawn(cmd: Sequence[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with log.open("w") as err:
        return subprocess.Popen(
            list(cmd), env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True
        )


def consumer_command(kind: str, *, endpoint: str, queue_url: str, db_url: str) -> list[str]:
    cmd = [PY, "-m", "bench.consumers", kind, "--endpoint-url", endpoint, "--queue-url", queue_url]
    if kind != "noop":
        cmd += ["--database-url", db_url]
    return cmd


def py_spy(
    pid: int, output: Path, duration: int | None = None, *, gil: bool = False
) -> subprocess.Popen | None:
    """py-spy sampling ``pid`` into ``output`` (raw collapsed stacks); None without py-spy.
    ``gil``: only the thread holding the GIL, so a threaded server's waits (its poll loop, its
    idle pool threads, a thread waiting on PostgreSQL) are not sampled as work."""
    spy = Path(PY).with_name("py-spy")
    if not spy.exists():
        spy_path = shutil.which("py-spy")
        if spy_path is None:
            log("py-spy is not installed (pip install py-spy): no profile")
            return None
        spy = Path(spy_path)
    cmd = [str(spy), "record", "--pid", str(pid), "--rate", "250", "--format", "raw"]
    cmd += ["--output", str(output), "--nonblocking"]
    if gil:
        cmd.append("--gil")
    if duration:
        cmd += ["--duration", str(duration)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def py_spy_finish(
    spy: subprocess.Popen | None, timeout: float, *, stop: bool = False, grace: float = 10
) -> None:
    """Let ``spy`` (from ``py_spy``) write its profile and exit, within ``timeout`` seconds:
    interrupted first when ``stop`` (it writes what it sampled on SIGINT). A py-spy that hangs
    (it can, sampling a process whose threads come and go) is interrupted, then killed, and
    named: that profile is missing, the run goes on."""
    if spy is None:
        return
    if stop:
        spy.send_signal(signal.SIGINT)
    try:
        spy.wait(timeout)
        return
    except subprocess.TimeoutExpired:
        spy.send_signal(signal.SIGINT)
    try:
        spy.wait(grace)
        log(f"py-spy (pid {spy.pid}) took longer than {timeout:.0f} s: interrupted")
    except subprocess.TimeoutExpired:
        spy.kill()
        spy.wait()
        log(f"py-spy (pid {spy.pid}) hung: killed, its profile is missing")
