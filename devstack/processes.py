"""Starting and stopping the stack's processes and a run's own database, on 127.0.0.1 only.

``make bench`` and ``make chaos`` both build their commands here, so gunicorn runs with the
production config and the workers with the product's command whichever run starts them.
"""

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
GUNICORN_CONFIG = ROOT / "config" / "gunicorn.py"
FAUXQS_LAUNCHER = ROOT / "localsqs" / "server.mjs"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def database_url(name: str) -> str:
    base = os.environ.get("BENCH_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432")
    return f"{base.rstrip('/')}/{name}"


def database_create(name: str) -> str:
    """Drop and create the run's own database; return its URL."""
    with psycopg.connect(database_url("postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return database_url(name)


def database_drop(name: str) -> None:
    with psycopg.connect(database_url("postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def stop_process(process: subprocess.Popen | None, timeout: float = 15, *, group: bool = False):
    """SIGTERM, then SIGKILL if it has not exited within ``timeout``. ``group``: signal its
    whole process group (a child started in its own session, with children of its own)."""
    if process is None or process.poll() is not None:
        return

    def send(signum: int) -> None:
        if group:
            os.killpg(process.pid, signum)
        else:
            process.send_signal(signum)

    try:
        send(signal.SIGTERM)
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        send(signal.SIGKILL)
        process.wait()
    except ProcessLookupError:
        pass


def fauxqs_command(port: int) -> list[str]:
    """The local SQS server on ``port``; it prints ``LISTENING <port>`` once it is up."""
    return ["node", str(FAUXQS_LAUNCHER), str(port)]


def gunicorn_command(*options: str) -> list[str]:
    """gunicorn serving config.wsgi as production serves it (``config/gunicorn.py`` when it is
    present); ``options`` override the config file's, which reads ``GUNICORN_*``."""
    cmd = [str(Path(PY).with_name("gunicorn")), "config.wsgi:application"]
    if GUNICORN_CONFIG.exists():
        cmd += ["--config", str(GUNICORN_CONFIG.relative_to(ROOT))]
    return cmd + list(options)


def worker_command(
    *, wait_time: int, visibility_timeout: int = 30, relay: bool = True, until_empty: bool = False
) -> list[str]:
    """``run_sqs_worker`` with full batches of 10, as production runs it."""
    cmd = [PY, str(ROOT / "manage.py"), "run_sqs_worker", "--batch-size", "10"]
    cmd += ["--wait-time", str(wait_time), "--visibility-timeout", str(visibility_timeout)]
    if not relay:
        cmd.append("--no-relay")
    if until_empty:
        cmd.append("--until-empty")
    return cmd
