"""`make demo`: the whole system on one machine, driven by real traffic, until Ctrl-C.

1. Prepares ``var/`` (a fresh SQLite database in WAL mode each run), migrates, creates a demo
   admin login and an API token.
2. Starts every process of the Procfile through honcho (local SQS server, sandbox processor with
   a fault mix, gunicorn, two ``run_sqs_worker`` processes, Celery worker and beat); their output
   goes to ``var/demo.log``.
3. Drives payments through the real API (demo/traffic.py), waits for them to settle, prints the
   summary and its checks, and keeps everything running for you to explore until Ctrl-C, which
   stops every process it started.
"""

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VAR = ROOT / "var"
VENV_BIN = Path(sys.executable).parent
sys.path.insert(0, str(ROOT))


def port_free(port: int) -> bool:
    with socket.socket() as s:
        # SO_REUSEADDR: a port left in TIME_WAIT by the previous run is free; a listener is not.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def demo_environment() -> dict[str, str]:
    ports = {
        "WEB_PORT": os.environ.get("DEMO_WEB_PORT", "8000"),
        "SQS_PORT": os.environ.get("DEMO_SQS_PORT", "9324"),
        "SANDBOX_PORT": os.environ.get("DEMO_SANDBOX_PORT", "8701"),
    }
    for name, port in ports.items():
        if not port_free(int(port)):
            sys.exit(
                f"port {port} ({name}) is in use: stop what holds it, or choose another with "
                f"DEMO_{name}=<port> make demo"
            )
    env = dict(os.environ)
    env.update(ports)
    env.update(
        {
            "PATH": f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",
            "DJANGO_SETTINGS_MODULE": "config.settings.base",
            "SECRET_KEY": "demo-only-" + secrets.token_hex(16),
            "DEBUG": "true",
            "ALLOWED_HOSTS": "127.0.0.1,localhost",
            "DATABASE_URL": f"sqlite:///{VAR / 'demo.sqlite3'}",
            "AWS_ACCESS_KEY_ID": "demo",
            "AWS_SECRET_ACCESS_KEY": "demo",
            "AWS_REGION": "us-east-1",
            "SQS_ENDPOINT_URL": f"http://127.0.0.1:{ports['SQS_PORT']}",
            "SQS_QUEUE_NAME": "payments.fifo",
            "SQS_DLQ_NAME": "payments-dlq.fifo",
            "PROCESSOR_BASE_URL": f"http://127.0.0.1:{ports['SANDBOX_PORT']}",
            "PROCESSOR_API_KEY": "demo-processor-key",
            "PROCESSOR_TIMEOUT_SECONDS": "2",
            "CALLBACK_SIGNING_SECRETS": "demo-signing-secret",
            "CELERY_BROKER_URL": f"sqs://127.0.0.1:{ports['SQS_PORT']}",
            "PROMETHEUS_MULTIPROC_DIR": str(VAR / "prometheus"),
            "WORKER_BACKOFF_CAP_SECONDS": "8",
            # Short breaker pauses, so the demo's 30 s processor outage ends visibly soon after.
            "PROCESSOR_BREAKER_PAUSE_SECONDS": "5",
            "PROCESSOR_BREAKER_MAX_PAUSE_SECONDS": "10",
            # ... and its incident (its one alert) over 15 s after the last close, not 300 s.
            "PROCESSOR_BREAKER_INCIDENT_COOLDOWN_SECONDS": "15",
            "DLQ_INGEST_INTERVAL_SECONDS": "5",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def manage(env: dict[str, str], *args: str) -> None:
    subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, check=True)


def main() -> int:
    if VAR.exists():
        shutil.rmtree(VAR)
    (VAR / "prometheus").mkdir(parents=True)
    env = demo_environment()
    os.environ.update(env)

    print("Preparing a fresh SQLite database in var/ ...", flush=True)
    manage(env, "migrate", "--no-input", "-v", "0")
    manage(env, "collectstatic", "--no-input", "-v", "0")

    import django

    django.setup()
    # This process's own log lines (alerts raised by the DLQ ingestion it runs, ...) go to a
    # file, so the terminal shows only the progress, the summary and the checks.
    import logging

    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    file_handler = logging.FileHandler(VAR / "demo-traffic.log")
    file_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root.addHandler(file_handler)
    from demo.traffic import create_demo_users, run_traffic

    password = secrets.token_urlsafe(12)
    token = create_demo_users(password=password)

    log_path = VAR / "demo.log"
    print(f"Starting the processes of the Procfile (their output: {log_path}) ...", flush=True)
    with open(log_path, "w") as log:
        honcho = subprocess.Popen(
            [str(VENV_BIN / "honcho"), "start", "-f", "Procfile"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def stop(*_: object) -> None:
        print("\nStopping every process ...", flush=True)
        if honcho.poll() is None:
            os.killpg(honcho.pid, signal.SIGTERM)
            try:
                honcho.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(honcho.pid, signal.SIGKILL)
        sys.exit(0)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)

    web = f"http://127.0.0.1:{env['WEB_PORT']}"
    ok = run_traffic(
        web_url=web,
        sandbox_url=env["PROCESSOR_BASE_URL"],
        token=token,
        payments=int(os.environ.get("DEMO_PAYMENTS", "500")),
        honcho=honcho,
        log_path=log_path,
    )
    print(
        f"\n  Admin:            {web}/admin/   (user: admin, password: {password})\n"
        f"  Triage dashboard: {web}/admin/triage/triagedashboard/\n"
        f"  Dead letters:     {web}/admin/triage/deadletter/\n"
        f"  Metrics:          {web}/metrics\n"
        f"  API token:        {token}  (Authorization: Token <token>)\n"
        f"  Logs:             {log_path}\n"
        "\nEverything keeps running for you to explore. Press Ctrl-C to stop it all.",
        flush=True,
    )
    if not ok:
        print("\nSOME SUMMARY CHECKS FAILED: see above.", flush=True)
    while honcho.poll() is None:
        time.sleep(1)
    print(f"A process stopped unexpectedly (honcho exited {honcho.returncode}); see {log_path}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
