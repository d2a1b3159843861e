"""A benchmark run's options, read once from the ``BENCH_*`` environment, and what every phase
shares: the signing secret, the callback path, the list of problems the run reports, the log."""

import os
import time

from devstack.env import EnvError, env_choices, env_int, env_ints

# history and storage run only when named (BENCH_PHASES=history,storage): the history preload
# takes minutes and gigabytes.
PHASES = (
    "ingest",
    "worker",
    "money",
    "e2e",
    "peer",
    "recovery",
    "webhooks",
    "profile",
    "history",
    "storage",
)


def _phases() -> list[str]:
    phases = env_choices("BENCH_PHASES", "ingest,worker,money,e2e,peer,recovery,webhooks", PHASES)
    if os.environ.get("BENCH_PROFILE") == "1" and "profile" not in phases:
        phases.append("profile")
    return phases


def _config() -> dict:
    try:
        return {
            "payments": env_int("BENCH_PAYMENTS", 10_000),
            "ingest_seconds": env_int("BENCH_INGEST_SECONDS", 10),
            "ingest_connections": env_int("BENCH_CONNECTIONS", 16),
            "ingest_pool": env_int("BENCH_INGEST_POOL", 50_000),
            "ingest_rounds": env_int("BENCH_INGEST_ROUNDS", 2),
            "gunicorn_workers": env_int("BENCH_GUNICORN_WORKERS", 2),
            "gunicorn_threads": env_int("BENCH_GUNICORN_THREADS", 8),
            "e2e_rate": env_int("BENCH_E2E_RATE", 200),
            "e2e_seconds": env_int("BENCH_E2E_SECONDS", 20),
            "e2e_workers": env_int("BENCH_E2E_WORKERS", 2),
            # Production runs the outbox relay in every worker loop; BENCH_E2E_RELAY=0 shows
            # its cost.
            "e2e_relay": os.environ.get("BENCH_E2E_RELAY", "1") != "0",
            "e2e_connections": env_int("BENCH_E2E_CONNECTIONS", 64),
            # From 50/s, the peer's first step: the CPU per event is compared at a rate both
            # sustain, also on a loaded machine.
            "step_rates": env_ints("BENCH_STEPS", "50,100,150,200,300,400,600,850,1000"),
            "step_seconds": env_int("BENCH_STEP_SECONDS", 15),
            # The Celery peer's steps start lower: it may not sustain the product's first step.
            "peer_step_rates": env_ints("BENCH_PEER_STEPS", "50,100,150,200,300,400,600"),
            # Money out beside money in: debits through the API, then a refund of each.
            "money_payments": env_int("BENCH_MONEY_PAYMENTS", 1_000),
            "money_clients": env_int("BENCH_MONEY_CLIENTS", 8),
            # One queue worker on this 2-core machine, beside gunicorn, PostgreSQL and the
            # generator: it keeps up at the phase's rate, and a second one adds about a sixth
            # to a payment's CPU (docs/benchmarks.md, the money phase's topology).
            "money_workers": env_int("BENCH_MONEY_WORKERS", 1),
            # One web process of BENCH_GUNICORN_THREADS threads for the same reason: at the
            # phase's rate it has headroom, and a second one costs a payment a twentieth to a
            # seventh more (docs/benchmarks.md, the money phase's topology). The other phases
            # run BENCH_GUNICORN_WORKERS: their rates need more than one core's worth of web.
            "money_gunicorn_workers": env_int("BENCH_MONEY_GUNICORN_WORKERS", 1),
            "recovery_payments": env_int("BENCH_RECOVERY_PAYMENTS", 5_000),
            # Unset: the product's default OUTAGE_RELEASE_PER_SECOND.
            "recovery_cap": env_int("BENCH_RECOVERY_CAP", 0) or None,
            # Webhook events sent by that many `webhooks_deliver` processes.
            "webhook_events": env_int("BENCH_WEBHOOK_EVENTS", 2_000),
            "webhook_senders": env_int("BENCH_WEBHOOK_SENDERS", 2),
            "history_payments": env_int("BENCH_HISTORY_PAYMENTS", 5_000_000),
            "partition_rows": env_int("BENCH_PARTITION_ROWS", 2_000_000),
            "database": os.environ.get("BENCH_DATABASE") or "payments_benchrun",
            # The regression guard's history: the last runs kept per machine (bench.guard).
            "guard_keep": env_int("BENCH_GUARD_KEEP", 20),
            "phases": _phases(),
        }
    except EnvError as exc:
        raise SystemExit(str(exc)) from None


CONFIG = _config()


SECRETS = ["bench-signing-secret"]


CALLBACK_PATH = "/callbacks/processor/"


# Measured on the benchmark machine before any product code existed (issue 8).
REFERENCE = {
    "plain_sql_tx_per_second": {"1": 1500, "2": 2700},
    "naive_orm_tx_per_second": {"1": 560, "2": 1050},
    "minimal_drf_post_gunicorn_2_workers": {"requests_per_second": 2100, "p99_ms": 9},
    "fauxqs_receive_delete_per_second": 3500,
}


problems: list[str] = []


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", flush=True)
