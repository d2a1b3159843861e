"""What a payment's life costs, step by step: statements and CPU in process, for a debit, a
refund and a payout.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/<any> .venv/bin/python \\
        scripts/payment_life_cost.py [--payments 200] [--database NAME]

It starts the local SQS server (fauxqs) and the sandbox processor on free loopback ports and a
database of its own on DATABASE_URL's server (``--database``, created afresh, migrated, dropped
at the end), the way ``scripts/worker_batch_cost.py`` does. Then, ``--payments`` of each kind
in turn, it drives each step as production does (``tests/payment_life.py``):

- ``create``: ``POST`` through DRF's test client with an ``Idempotency-Key``, the outbox row's
  publish after commit included (the web request pays it);
- ``submission``: the queue worker drains the submit commands, each one call to the sandbox
  over HTTP;
- ``ingest``: the processor's signed callback posted to the callback endpoint, which queues it;
- ``apply``: the queue worker drains the callbacks, in batches of up to ten.

For each step it prints the statements per payment (every round trip, transaction control
included), the CPU and wall time per payment of this thread (``time.thread_time``: the
sandbox answers from threads of its own, whose CPU is the processor's, not ours) and the CPU
of this thread's PostgreSQL backend (read from ``/proc``, in the kernel's ticks: 10 ms, so
only a step over many payments reads true; ``nan`` where a step moved to a new connection).
The SQS server's CPU is not in these figures. The statement counts are exact; CPU and wall
time vary with the machine's load, so compare them only within one run.

``--ledger N`` grows the merchant's ledger by N entries first (settled debits of a month ago,
written in bulk), so each step is measured for a merchant with a long history: a payout's
balance read must not grow with it.

``--profile`` runs each kind's lives once more under ``cProfile``, one profile per step, and
prints where each step's CPU goes (the top ``--profile-lines`` functions by cumulative time;
``docs/performance.md`` keeps a debit's).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from worker_batch_cost import database_recreate, run_environment  # noqa: E402

STEPS = ("create", "submission", "ingest", "apply")
KINDS = ("debit", "refund", "payout")


def postgres_cpu() -> tuple[int, float]:
    """This thread's PostgreSQL backend (its pid) and its CPU seconds so far, from ``/proc``
    (the server runs on this machine); NaN where they cannot be read."""
    from django.db import connection

    connection.ensure_connection()
    pid = connection.connection.info.backend_pid
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return pid, float("nan")
    # utime and stime, the 14th and 15th fields, counted after the command's closing ")".
    return pid, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Step:
    """Statements, thread CPU, its PostgreSQL backend's CPU and wall time of one step over many
    payments."""

    def __init__(self) -> None:
        self.statements = 0
        self.cpu = 0.0
        self.postgres = 0.0
        self.wall = 0.0

    def run(self, call, *args):
        from tests.payment_life import statements_counted

        with statements_counted() as counted:
            backend, postgres = postgres_cpu()
            cpu, wall = time.thread_time(), time.perf_counter()
            result = call(*args)
            self.cpu += time.thread_time() - cpu
            self.wall += time.perf_counter() - wall
            backend_after, postgres_after = postgres_cpu()
            # A step that ran on a new connection: what the one it left had used is lost.
            self.postgres += postgres_after - postgres if backend_after == backend else math.nan
        self.statements += len(counted)
        return result


def life_of(kind: str, payments: int, client, debit_id: str) -> dict[str, Step]:
    """``payments`` of ``kind`` created, submitted, settled; each step's figures."""
    from tests import payment_life

    steps = {step: Step() for step in STEPS}
    create = {
        "debit": lambda: payment_life.debit_create(client, "1.00"),
        "refund": lambda: payment_life.refund_create(client, debit_id, "1.00"),
        "payout": lambda: payment_life.payout_create(client, "1.00"),
    }[kind]
    created = [steps["create"].run(create) for _ in range(payments)]
    steps["submission"].run(payment_life.worker_drain)
    callbacks = [payment_life.callback_body(payment_id, "settled") for payment_id in created]
    for raw in callbacks:
        steps["ingest"].run(payment_life.callback_post, raw)
    steps["apply"].run(payment_life.worker_drain)
    return steps


def steps_profiled(kind: str, payments: int, client, debit_id: str, lines: int) -> str:
    """Each step of ``payments`` lives of ``kind`` under ``cProfile``: per step, the CPU per
    payment profiled and the top ``lines`` functions by cumulative CPU time."""
    import cProfile
    import io
    import pstats

    from tests import payment_life

    out = io.StringIO()
    profilers = {step: cProfile.Profile(time.thread_time) for step in STEPS}

    def profiled(step: str, call, *args):
        # This thread's CPU, as the table counts it: the waits on PostgreSQL and SQS are not ours.
        profilers[step].enable()
        try:
            return call(*args)
        finally:
            profilers[step].disable()

    create = {
        "debit": lambda: payment_life.debit_create(client, "1.00"),
        "refund": lambda: payment_life.refund_create(client, debit_id, "1.00"),
        "payout": lambda: payment_life.payout_create(client, "1.00"),
    }[kind]
    created = [profiled("create", create) for _ in range(payments)]
    profiled("submission", payment_life.worker_drain)
    for payment_id in created:
        profiled(
            "ingest", payment_life.callback_post, payment_life.callback_body(payment_id, "settled")
        )
    profiled("apply", payment_life.worker_drain)
    for step, profiler in profilers.items():
        stats = pstats.Stats(profiler, stream=out)
        print(
            f"{kind} {step}: {1000 * stats.total_tt / payments:.2f} ms of CPU per payment profiled",
            file=out,
        )
        stats.sort_stats("cumulative").print_stats(lines)
    return out.getvalue()


def table(figures: dict[str, dict[str, Step]], payments: int) -> str:
    lines = [
        "| kind | step | statements per payment | CPU ms per payment "
        "| PostgreSQL CPU ms per payment | wall ms per payment |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]

    def line(kind: str, name: str, step: Step) -> str:
        return (
            f"| {kind} | {name} | {step.statements / payments:.1f} "
            f"| {1000 * step.cpu / payments:.2f} | {1000 * step.postgres / payments:.2f} "
            f"| {1000 * step.wall / payments:.2f} |"
        )

    for kind, steps in figures.items():
        total = Step()
        for name, step in steps.items():
            lines.append(line(kind, name, step))
            total.statements += step.statements
            total.cpu += step.cpu
            total.postgres += step.postgres
            total.wall += step.wall
        lines.append(line(kind, "**life**", total))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--payments", type=int, default=200)
    parser.add_argument("--database", default="payment_life_cost")
    parser.add_argument("--profile", action="store_true", help="profile each step too")
    parser.add_argument("--profile-lines", type=int, default=40)
    parser.add_argument(
        "--ledger",
        type=int,
        default=0,
        help="grow the merchant's ledger by this many entries first (a long history)",
    )
    options = parser.parse_args()

    admin_url, server = run_environment(options.database, queue_prefix="life")
    sandbox = None
    try:
        import django

        django.setup()
        import logging

        from django.conf import settings
        from django.core.management import call_command
        from django.test.utils import override_settings

        from callbacks.queues import queues_ensure
        from sandbox import SandboxProcessor
        from tests import payment_life

        # One log line per step is part of the cost; where it goes is not.
        logging.getLogger().handlers = [logging.StreamHandler(open(os.devnull, "w"))]  # noqa: SIM115
        call_command("migrate", verbosity=0)
        queues_ensure(visibility_timeout=30)
        sandbox = SandboxProcessor().start()
        payments = {
            **settings.PAYMENTS,
            "PROCESSOR_BASE_URL": sandbox.base_url,
            "AVAILABLE_AFTER_BANKING_DAYS": 0,
            # The fraud rules on, as tests/payments/test_statement_counts.py pins them; the
            # velocity floor above the run's thousands of debits of one merchant in a day.
            "FRAUD_RULES": {"velocity": {"floor": "100000000.00"}},
        }
        # The test client's host, which pytest-django allows in the tests.
        with override_settings(PAYMENTS=payments, ALLOWED_HOSTS=["testserver"]):
            client = payment_life.api_client_for()
            debit_id = payment_life.collected_debit(f"{10 * options.payments}.00")
            payment_life.accounts_known_for_weeks()
            if options.ledger:
                payment_life.ledger_grown(options.ledger)
            life_of("debit", 3, client, debit_id)  # the first requests fill the caches
            figures = {kind: life_of(kind, options.payments, client, debit_id) for kind in KINDS}
            profiles = [
                steps_profiled(kind, options.payments, client, debit_id, options.profile_lines)
                for kind in (KINDS if options.profile else ())
            ]
        print(table(figures, options.payments))
        for profile in profiles:
            print(profile)
    finally:
        if sandbox is not None:
            sandbox.stop()
        server.stop()
        from django.db import connections

        connections.close_all()
        database_recreate(admin_url, options.database, drop_only=True)


if __name__ == "__main__":
    main()
