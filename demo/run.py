"""`make demo`: the whole system on one machine, driven by real traffic, until Ctrl-C.

1. Prepares ``var/`` (a fresh SQLite database in WAL mode each run), migrates, creates a demo
   admin login and an API token.
2. Starts every process of the Procfile through honcho (local SQS server, sandbox processor with
   a fault mix, gunicorn, two ``run_sqs_worker`` processes, Celery worker and beat); their output
   goes to ``var/demo.log``.
3. Drives payments through the real API (demo/traffic.py), waits for them to settle, prints the
   summary and its checks, and keeps everything running for you to explore until Ctrl-C, which
   stops every process it started.

``DEMO_BACKEND=nacha`` runs it on the bank backend instead (``Procfile.nacha``,
demo/bank_traffic.py): the vault's key and the NACHA settings come from the environment, files
go through a directory transport under ``var/bank/``, and the sandbox answers as a bank.
"""

import base64
import json
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


BACKENDS = {"processor": "Procfile", "nacha": "Procfile.nacha"}
# The demo's API client (demo/traffic.py's create_demo_users).
API_CLIENT = "demo-api-client"
DEMO_FRAUD_RULES = {
    "new_destination": {"enabled": False},
    "velocity": {"floor": "100000000.00"},
}
# The originator of the demo's files: a made-up company at a made-up ODFI (valid check digit).
DEMO_ORIGINATOR = {
    "odfi_routing_number": "091000019",
    "odfi_name": "DEMO ODFI BANK",
    "immediate_origin": "1234567890",
    "immediate_origin_name": "DEMO PAYMENTS INC",
    "company_name": "DEMO PAYMENTS",
    "company_identification": "1234567890",
}


def demo_backend() -> str:
    backend = os.environ.get("DEMO_BACKEND", "processor")
    if backend not in BACKENDS:
        sys.exit(f"DEMO_BACKEND must be one of {', '.join(BACKENDS)}, not {backend!r}")
    return backend


def bank_environment(var: Path) -> dict[str, str]:
    """The bank backend's settings, as a host's environment gives them: the vault's key (a
    fresh one each run), the originator, the directory transport under ``var/bank/``, and a
    submission looking again for its file every 2 s (files are cut every 2 s, not per window)."""
    return {
        "PROCESSOR_BACKEND": "bank.nacha.backend.NachaBankBackend",
        "VAULT_KEYS": f"demo1:{base64.b64encode(secrets.token_bytes(32)).decode()}",
        "VAULT_ACTIVE_KEY": "demo1",
        "NACHA_ORIGINATOR": json.dumps(DEMO_ORIGINATOR),
        "NACHA_TRANSPORT": json.dumps(
            {
                "kind": "directory",
                "outbound": str(var / "bank" / "outbound"),
                "inbound": str(var / "bank" / "inbound"),
            }
        ),
        # NACHA's WEB debit rule: the demo's stand-in for a host's validation service.
        "ACCOUNT_VALIDATION_SERVICE": "demo.validation.DemoValidationService",
        # The sandbox bank's BAI2 statements (demo/books_check.py writes and closes them).
        "BOOKS_STATEMENT_TRANSPORT": json.dumps(
            {"kind": "directory", "inbound": str(var / "bank" / "statements")}
        ),
    }


def demo_environment(backend: str = "processor") -> dict[str, str]:
    from demo.risk import FRAUD_RULES as RISK_FRAUD_RULES

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
            # Money settled a minute ago is available to pay out (a host keeps its reserve).
            "AVAILABLE_AFTER_BANKING_DAYS": "0",
            # The demo refunds and pays out to accounts made a minute before, and each merchant
            # collects thousands in its first minutes: new_destination and velocity would hold
            # them all. first_large_debit runs as a host has it, and the risk section's merchant
            # is watched for new destinations by a rule of its own (demo/risk.py).
            "FRAUD_RULES": json.dumps({**DEMO_FRAUD_RULES, **RISK_FRAUD_RULES}),
            "PYTHONUNBUFFERED": "1",
        }
    )
    from demo.webhooks import ENVIRONMENT as WEBHOOKS_ENVIRONMENT

    env.update(WEBHOOKS_ENVIRONMENT)
    if backend == "nacha":
        env.update(bank_environment(VAR))
    else:
        from demo.validation_settings import ENVIRONMENT as VALIDATION_ENVIRONMENT

        env.update(VALIDATION_ENVIRONMENT)
    return env


def manage(env: dict[str, str], *args: str) -> None:
    subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, check=True)


def risk_section(backend: str, *, web_url: str, token: str, env: dict[str, str]) -> bool:
    """The risk controls (demo/risk.py), after the traffic's own summary: limits run past,
    holds decided in the admin, an R17 QUESTIONABLE return; whether its checks pass."""
    from demo.risk import bank_accounts, processor_accounts, run_risk
    from demo.traffic import section_print

    if backend == "nacha":
        account, sandbox_url = bank_accounts(web_url, token), ""
    else:
        account, sandbox_url = processor_accounts(), env["PROCESSOR_BASE_URL"]
    rows, checks = run_risk(
        web_url=web_url,
        token=token,
        client_username=API_CLIENT,
        account=account,
        sandbox_url=sandbox_url,
    )
    return section_print("Risk controls", rows, checks)


def validation_section(*, web_url: str, token: str, sandbox_url: str) -> bool:
    """The processor backend's account validation (demo/validation.py): micro-entries verified
    after a wrong try, others left to expire, the WEB debits held on them released or failed
    once, one refused; whether its checks pass."""
    import requests

    from demo.traffic import section_print
    from demo.validation import micro_entries_checks, micro_entries_run, micro_entries_setup

    micro_entries_setup(API_CLIENT)
    story = micro_entries_run(web_url=web_url, token=token, sandbox_url=sandbox_url)
    stats = requests.get(f"{sandbox_url}/_sandbox/stats", timeout=10).json()
    rows, checks = micro_entries_checks(story, sandbox_stats=stats)
    return section_print("Account validation (micro-entries)", rows, checks)


def main() -> int:
    backend = demo_backend()
    if VAR.exists():
        shutil.rmtree(VAR)
    (VAR / "prometheus").mkdir(parents=True)
    env = demo_environment(backend)
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
            [str(VENV_BIN / "honcho"), "start", "-f", BACKENDS[backend]],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def stop_processes() -> None:
        print("\nStopping every process ...", flush=True)
        if honcho.poll() is None:
            os.killpg(honcho.pid, signal.SIGTERM)
            try:
                honcho.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(honcho.pid, signal.SIGKILL)

    def stop(*_: object) -> None:
        stop_processes()
        sys.exit(0)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)

    web = f"http://127.0.0.1:{env['WEB_PORT']}"
    payments = int(os.environ.get("DEMO_PAYMENTS", "500"))
    try:
        if backend == "nacha":
            from demo.bank_traffic import run_bank_traffic

            ok = run_bank_traffic(
                web_url=web, token=token, payments=payments, honcho=honcho, log_path=log_path
            )
        else:
            ok = run_traffic(
                web_url=web,
                sandbox_url=env["PROCESSOR_BASE_URL"],
                token=token,
                payments=payments,
                honcho=honcho,
                log_path=log_path,
            )
            ok = (
                validation_section(web_url=web, token=token, sandbox_url=env["PROCESSOR_BASE_URL"])
                and ok
            )
        ok = risk_section(backend, web_url=web, token=token, env=env) and ok
    except Exception:
        # A check that crashes must not leave the Procfile's processes holding the ports and
        # the database: stop them all, then let the error say what broke (exit non-zero).
        print("\nTHE DEMO STOPPED ON AN ERROR: see below.", flush=True)
        stop_processes()
        raise
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
