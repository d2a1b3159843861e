"""The project's gunicorn, started for a test as production starts it (config/gunicorn.py)."""

import contextlib
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gunicorn_test_env(module_settings, port: int, **extra: str) -> dict[str, str]:
    """The environment of a small gunicorn (one process, two threads) serving the test settings
    on ``port``, sending to the session's queues; ``extra`` adds or overrides variables."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings.test",
        "SQS_ENDPOINT_URL": module_settings.SQS_ENDPOINT_URL,
        "SQS_QUEUE_NAME": module_settings.SQS_QUEUE_NAME,
        "SQS_DLQ_NAME": module_settings.SQS_DLQ_NAME,
        "GUNICORN_BIND": f"127.0.0.1:{port}",
        "GUNICORN_WORKERS": "1",
        "GUNICORN_THREADS": "2",
        **extra,
    }
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)  # this process's metrics are not the server's
    return env


@contextlib.contextmanager
def web_server_running(
    argv: list[str], env: dict, log_path: Path, *, name: str, ok_only: bool, timeout: float = 60
) -> Iterator[str]:
    """Start the web server ``argv`` with ``env`` (which names its bind address in
    ``GUNICORN_BIND``), wait until ``/healthz`` answers (with 200 when ``ok_only``), yield its
    base URL, and stop it. Its output goes to ``log_path``, shown if it dies before it
    answers."""
    with open(log_path, "w") as log:
        server = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        base = f"http://{env['GUNICORN_BIND']}"
        try:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    answer = requests.get(f"{base}/healthz", timeout=5)
                    if not ok_only or answer.status_code == 200:
                        break
                except requests.RequestException:
                    pass  # not listening or still loading the application
                assert server.poll() is None, log_path.read_text()
                assert time.monotonic() < deadline, f"{name} did not start"
                time.sleep(0.1)
            yield base
        finally:
            server.terminate()
            server.wait(20)


@contextlib.contextmanager
def gunicorn_running(env: dict, log_path: Path, *, timeout: float = 60) -> Iterator[str]:
    """gunicorn with the module's config (``web_server_running``), ready once ``/healthz``
    answers 200."""
    argv = [str(ROOT / ".venv" / "bin" / "gunicorn"), "-c", "config/gunicorn.py", "config.wsgi"]
    with web_server_running(
        argv, env, log_path, name="gunicorn", ok_only=True, timeout=timeout
    ) as base:
        yield base
