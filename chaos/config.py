"""The chaos run's settings (``CHAOS_*``), its fixed fault sizes, and the environment every
process of the run gets: nothing of the caller's that could point it elsewhere, a bounded
retry budget, and the sandbox processor's faults."""

from __future__ import annotations

import json
import os
import random
import re
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

from devstack.env import EnvError, env_int
from devstack.processes import ROOT

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

QUEUE_OUTAGE_SECONDS = 5.0


# The first debit from an account above this is held for review (chaos/review.py): load
# amounts run from 1.00 to 500.00 and every load debit is its account's first, so about one in
# twelve of the merchants without a single-entry cap is held.
FIRST_LARGE_DEBIT = "460.00"

# new_destination off: the run's refunds and payouts go to accounts made seconds before, and
# would all be held. velocity above anything the load creates in a day per merchant.
RUN_FRAUD_RULES = {
    "new_destination": {"enabled": False},
    "velocity": {"floor": "100000000.00"},
    "first_large_debit": {"amount": FIRST_LARGE_DEBIT},
}


# The micro-entries' wrong tries before a validation fails (the setting's default, stated so the
# run's racing verifies and its check read the same number).
MICRO_ENTRY_MAX_ATTEMPTS = 3


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
                # A new seed each run unless one is given: every run tries another draw of
                # the faults; the seed is printed and kept in the report to replay it.
                seed=env_int("CHAOS_SEED", random.SystemRandom().randrange(1, 2**31)),
                database=database,
            )
        except EnvError as exc:
            raise SetupError(str(exc)) from None


# Prefixes of the caller's variables a run drops: an AWS endpoint, an alert webhook, a mail
# server, another database must not reach it.
FOREIGN_PREFIXES = (
    "SANDBOX_", "SQS_", "GUNICORN_", "PROCESSOR_", "DJANGO_", "AWS_", "ALERT_", "CELERY_",
    "EMAIL_", "ADMINS", "DATABASE_", "CALLBACK_", "WORKER_", "PROMETHEUS_",
    "ACCOUNT_VALIDATION_", "UNVALIDATED_", "MICRO_ENTRY_",
)  # fmt: skip

# The processor's faults (sandbox/faults.py).
SANDBOX_FAULTS = {
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
    # Callbacks never delivered: only the processor's events API (the run's pull) lists them.
    "SANDBOX_P_DROPPED_CALLBACK": "0.03",
}

# How often the run's ``processor_events_pull --every`` pulls the processor's events.
PULL_EVERY_SECONDS = 5
# The run's webhook receiver answers 500 to this many requests first: it fails for a while,
# then comes back, and every event must still reach it.
WEBHOOK_RECEIVER_FAILS_FIRST = 40


def environment(ports: dict[str, int], database_url: str) -> dict[str, str]:
    """What every process of the run sees: the caller's environment without anything that could
    point the run elsewhere, then the run's own settings and the processor's faults."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(FOREIGN_PREFIXES)}
    env.update(_settings(ports, database_url, path=env.get("PATH", "")))
    env.update(SANDBOX_FAULTS)
    return env


def _settings(ports: dict[str, int], database_url: str, *, path: str) -> dict[str, str]:
    return {
        "PATH": f"{Path(PYTHON).parent}{os.pathsep}{path}",
        "PYTHONUNBUFFERED": "1",
        "DJANGO_SETTINGS_MODULE": "config.settings.base",
        "SECRET_KEY": f"chaos-{uuid.uuid4().hex}",
        "DEBUG": "false",
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "DATABASE_URL": database_url,
        "AWS_ACCESS_KEY_ID": "chaos",
        "AWS_SECRET_ACCESS_KEY": "chaos",
        "AWS_REGION": "us-east-1",
        "SQS_ENDPOINT_URL": f"http://127.0.0.1:{ports['proxy']}",
        "SQS_QUEUE_NAME": "chaos.fifo",
        "SQS_DLQ_NAME": "chaos-dlq.fifo",
        "PROCESSOR_BASE_URL": f"http://127.0.0.1:{ports['sandbox']}",
        "PROCESSOR_API_KEY": "chaos-processor-key",
        # Above the 3 s visibility timeout, so slow answers outlive it; the injected
        # timeouts sleep 5 s, past it.
        "PROCESSOR_TIMEOUT_SECONDS": "4",
        "CALLBACK_SIGNING_SECRETS": "chaos-signing-secret",
        # Money settled seconds ago may be paid out: the run's payouts have something to race.
        "AVAILABLE_AFTER_BANKING_DAYS": "0",
        # The fraud rules run on every create (their lock and read under the run's faults):
        # first_large_debit holds some of the load's debits for the run's reviewer
        # (chaos/review.py); limits past which creates are refused are set per merchant.
        "FRAUD_RULES": json.dumps(RUN_FRAUD_RULES),
        # A bounded run: retries come back within seconds, not the production 30 s cap.
        "WORKER_BACKOFF_BASE_SECONDS": "0.5",
        "WORKER_BACKOFF_CAP_SECONDS": "4",
        "WORKER_MAX_ATTEMPTS": "6",
        # Shorter pauses than production's 15-300 s, so recovery fits a bounded run.
        "PROCESSOR_BREAKER_PAUSE_SECONDS": "5",
        "PROCESSOR_BREAKER_MAX_PAUSE_SECONDS": "20",
        "GUNICORN_BIND": f"127.0.0.1:{ports['web']}",
        "GUNICORN_WORKERS": "2",
        "GUNICORN_THREADS": "8",
        "LOG_LEVEL": "INFO",
        # The project's .env is read too, for what is not set here: alerts go to the
        # log only, mail to the console.
        "ALERT_WEBHOOK_URL": "",
        "ADMINS": "",
        "EMAIL_BACKEND": "django.core.mail.backends.console.EmailBackend",
        "CELERY_BROKER_URL": "memory://",
        # The run's webhook receiver is on loopback, over http; its retries come back within
        # seconds (the production schedule spans three days).
        "WEBHOOK_ALLOW_HTTP": "true",
        "WEBHOOK_ALLOW_PRIVATE_ADDRESSES": "true",
        "WEBHOOK_TIMEOUT_SECONDS": "2",
        "WEBHOOK_RETRY_SCHEDULE": "[1, 1, 2, 2, 4, 4, 8, 8, 8, 8]",
        # One setting for the deployment: "hold" exercises both of the rule's answers (a debit
        # held, then sent or failed once; one refused after its account failed): see
        # chaos/validation.py.
        "UNVALIDATED_WEB_DEBITS": "hold",
        "MICRO_ENTRY_MAX_ATTEMPTS": str(MICRO_ENTRY_MAX_ATTEMPTS),
        "ACCOUNT_VALIDATION_SERVICE": "chaos.validation_service.ChaosValidationService",
        "CHAOS_VALIDATION_SERVICE_URL": f"http://127.0.0.1:{ports['validation']}",
    }
