"""A worker whose clock is 2 minutes ahead, through a processor outage, on the real stack.

PostgreSQL, the local SQS server, the callback endpoint (live server), the sandbox processor
over HTTP sending signed callbacks, and two ``run_sqs_worker`` processes, one of them under
libfaketime (``faketime -f +2m``). The breaker keeps every time on the database's clock; if one
of them came from a worker's clock, the skewed worker would stretch a pause by 2 minutes (far
past its cap), stamp the incident in the future, and the payments would wait that long after
the outage. The skewed worker runs alone first, so it is the one that opens the breaker, runs a
trial and reopens it; then the other joins for the rest of the outage and the recovery.

A sampler on its own connection watches the breaker row and the payments every 0.2 s, on the
database's clock (``statement_timestamp()``), so nothing measured depends on any process's clock.
"""

import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import psycopg
import pytest
from django.conf import settings
from django.db import connection

from callbacks.models import HoldKind, PaymentHold, QueueMessage
from payments.models import (
    AttemptOutcome,
    BreakerTransitionKind,
    CircuitBreaker,
    CircuitBreakerTransition,
    Payment,
    PaymentState,
    ProcessorAttempt,
)
from payments.processor.backends.http import reset_client
from payments.processor.breaker import trial_lease_seconds
from sandbox import FaultConfig, SandboxProcessor
from tests.callbacks.worker_support import (
    WorkerProcess,
    applied_moves,
    drain,
    payments_created,
    worker_env,
)
from tests.waiting import wait_for

pytestmark = [pytest.mark.scale, pytest.mark.django_db(transaction=True)]

SKEW_SECONDS = 120
# --exclude-monotonic: only the wall clock is off. The worker paces its loop, backoffs and
# outage timers with time.monotonic(), which a wrong wall clock must not disturb (and which no
# real clock error moves either). -m: the thread-safe variant, the worker runs threads.
FAKETIME = ("faketime", "-m", "--exclude-monotonic", "-f", f"+{SKEW_SECONDS // 60}m")
# faketime runs its program as a child and does not pass signals on: the worker's SIGTERM
# would kill faketime and orphan the worker. So the worker gets faketime's environment (the
# LD_PRELOAD of libfaketime and its FAKETIME settings) and is the test's own child. Not the
# shared-memory clock of FAKETIME_SHARED, which dies with the faketime process.
FAKETIME_ENV_NAMES = ("LD_PRELOAD", "FAKETIME", "FAKETIME_DONT_FAKE_MONOTONIC")


def faketime_env() -> dict[str, str]:
    if shutil.which("faketime") is None:
        pytest.fail("faketime is missing: run scripts/ensure-faketime (apt-get install faketime)")
    output = subprocess.run(
        [*FAKETIME, "env"], capture_output=True, text=True, check=True, timeout=30
    ).stdout
    env = dict(line.split("=", 1) for line in output.splitlines() if "=" in line)
    return {name: env[name] for name in FAKETIME_ENV_NAMES}


BUDGET = {
    "WORKER_BACKOFF_BASE_SECONDS": "0.05",
    "WORKER_BACKOFF_CAP_SECONDS": "0.2",
    "WORKER_MAX_ATTEMPTS": "3",
}
BREAKER = {
    "PROCESSOR_BREAKER_FAILURES": "3",
    "PROCESSOR_BREAKER_PAUSE_SECONDS": "2",
    "PROCESSOR_BREAKER_MAX_PAUSE_SECONDS": "4",
    "PROCESSOR_BREAKER_TRIAL_CALLS": "2",
    "PROCESSOR_CONNECT_TIMEOUT_SECONDS": "0.3",
}
MAX_PAUSE = float(BREAKER["PROCESSOR_BREAKER_MAX_PAUSE_SECONDS"])
OUTAGE_SECONDS = 16.0
PAUSE_MARGIN = 1.0  # a sample is taken between statements: a pause just set reads a bit under
CLOCK_MARGIN = 3.0  # how far a breaker time may be from the database's now when first seen
RECOVERY_SLACK = 5.0  # release, queue, receive and call after the trial closed the breaker


def sampler_database_url() -> str:
    database = settings.DATABASES["default"]
    return (
        f"postgresql://{database['USER']}@{database['HOST']}:{database['PORT']}/{database['NAME']}"
    )


@dataclass
class Samples:
    """What the sampler saw, every time on the database's clock."""

    max_open_remaining: float = 0.0  # open_until - now while open: never past the cap
    opened_at_offsets: list[float] = field(default_factory=list)  # now - opened_at, first sight
    transition_offsets: dict[int, float] = field(default_factory=dict)  # created_at - now
    first_not_pending: dict[str, datetime] = field(default_factory=dict)
    count: int = 0
    error: BaseException | None = None


class Sampler(threading.Thread):
    def __init__(self, payment_ids: list[str]) -> None:
        super().__init__(name="breaker-sampler", daemon=True)
        self.payment_ids = payment_ids
        self.samples = Samples()
        self._done = threading.Event()
        self._seen_opened_at: set[datetime] = set()

    def stop(self) -> Samples:
        self._done.set()
        self.join(10)
        if self.samples.error is not None:
            raise self.samples.error
        return self.samples

    def run(self) -> None:
        try:
            with psycopg.connect(sampler_database_url(), autocommit=True) as conn:
                while not self._done.is_set():
                    self._sample(conn)
                    self._done.wait(0.2)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test by stop()
            self.samples.error = exc

    def _sample(self, conn) -> None:
        s = self.samples
        breaker = conn.execute(
            "SELECT state, extract(epoch FROM open_until - statement_timestamp()), opened_at, "
            f"statement_timestamp() FROM {CircuitBreaker._meta.db_table} WHERE name = 'processor'"  # noqa: S608
        ).fetchone()
        if breaker is not None:
            state, remaining, opened_at, now = breaker
            if state == "open" and remaining is not None:
                s.max_open_remaining = max(s.max_open_remaining, float(remaining))
            if opened_at is not None and opened_at not in self._seen_opened_at:
                self._seen_opened_at.add(opened_at)
                s.opened_at_offsets.append((now - opened_at).total_seconds())
        for pk, offset in conn.execute(
            "SELECT id, extract(epoch FROM created_at - statement_timestamp()) "
            f"FROM {CircuitBreakerTransition._meta.db_table}"  # noqa: S608
        ):
            s.transition_offsets.setdefault(pk, float(offset))
        for pk, now in conn.execute(
            f"SELECT id::text, statement_timestamp() FROM {Payment._meta.db_table} "  # noqa: S608
            "WHERE id::text = ANY(%s) AND state <> 'pending'",
            (self.payment_ids,),
        ):
            s.first_not_pending.setdefault(pk, now)
        s.count += 1


@pytest.fixture
def stack(sqs_queues, live_server, module_settings, tmp_path):
    skew_env = faketime_env()
    sandbox = SandboxProcessor(
        callback_url=f"{live_server.url}/callbacks/processor/",
        faults=FaultConfig(timeout_seconds=0.8, settle_after_seconds=1.0),
        callback_backoff_seconds=0.2,
    ).start()
    module_settings.PROCESSOR_BASE_URL = sandbox.base_url
    module_settings.PROCESSOR_TIMEOUT_SECONDS = 0.3
    for name, value in {**BUDGET, **BREAKER}.items():
        setattr(module_settings, name, float(value))
    reset_client()
    workers: list[WorkerProcess] = []
    yield sandbox, workers, sqs_queues, tmp_path, skew_env
    for worker in workers:
        if worker.process.poll() is None:
            worker.signal(signal.SIGTERM)
            worker.wait(60)
    sandbox.stop()
    reset_client()


def start_worker(tmp_path, name: str, *, skew_env: dict[str, str] | None = None):
    return WorkerProcess(
        "--wait-time", "1", log_dir=tmp_path, name=name, **BUDGET, **BREAKER, **(skew_env or {})
    )


def test_faketime_shifts_the_wall_clock_of_a_child_but_not_its_monotonic_clock():
    """The premise of the skew test: a process under FAKETIME sees the wall clock 2 minutes
    ahead, and its monotonic clock (the worker's loop timers) is the machine's own."""
    probe = "import time; print(time.time(), time.monotonic())"
    env = worker_env(**faketime_env())
    before = time.time(), time.monotonic()
    output = subprocess.run(
        [sys.executable, "-c", probe],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    wall, monotonic = (float(value) for value in output.split())
    assert SKEW_SECONDS - 5 < wall - before[0] < SKEW_SECONDS + 5
    assert 0 <= monotonic - before[1] < 5


def states(payments) -> set[str]:
    return set(
        Payment.objects.filter(pk__in=[p.pk for p in payments]).values_list("state", flat=True)
    )


def db_now() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement_timestamp()")
        return cursor.fetchone()[0]


def transitions(kind: str) -> int:
    return CircuitBreakerTransition.objects.filter(kind=kind).count()


def test_a_worker_two_minutes_ahead_neither_stretches_the_pause_nor_delays_recovery(stack):
    sandbox, workers, queues, tmp_path, skew_env = stack
    began = time.monotonic()
    # Phase 1: the skewed worker alone, through a healthy stretch and the outage's start: it
    # submits, applies callbacks, opens the breaker, runs a trial and reopens it.
    skewed = start_worker(tmp_path, "skewed", skew_env=skew_env)
    workers.append(skewed)
    before = make_payments(4, "before")
    wait_for(
        lambda: states(before) == {PaymentState.CONFIRMED}, 60, "the early payments", watch=workers
    )

    during_ids: list[str] = []
    sampler = None
    sandbox.outage_start("503", OUTAGE_SECONDS)
    outage_ended = db_now() + timedelta(seconds=OUTAGE_SECONDS)
    created = make_payments(12, "during")
    during_ids = [str(p.id) for p in created]
    sampler = Sampler(during_ids)
    sampler.start()
    try:
        wait_for(
            lambda: transitions(BreakerTransitionKind.REOPENED) >= 1,
            OUTAGE_SECONDS,
            "the skewed worker to open the breaker, trial and reopen it",
            watch=workers,
        )
        # Until now the skewed worker ran alone: every attempt recorded so far is its own (an
        # attempt's times are the database's, so its clock cannot tell them apart).
        phase_two = db_now()
        skewed_attempts = ProcessorAttempt.objects.filter(recorded_at__lte=phase_two)
        assert not ProcessorAttempt.objects.filter(
            started_at__gt=phase_two + timedelta(seconds=CLOCK_MARGIN)
        ).exists(), "an attempt stamped by the skewed worker's clock"
        assert (
            skewed_attempts.filter(outcome=AttemptOutcome.RETRYABLE).count()
            >= int(BREAKER["PROCESSOR_BREAKER_FAILURES"]) + 1
        ), "the skewed worker's failed calls (and its failed trial) are not recorded"
        assert transitions(BreakerTransitionKind.OPENED) == 1
        assert "outcome=deferred" in skewed.output

        # Phase 2: the other worker joins for the rest of the outage and the recovery.
        workers.append(start_worker(tmp_path, "on-time"))
        wait_for(
            lambda: states(before + created) == {PaymentState.CONFIRMED},
            OUTAGE_SECONDS + 90,
            "every payment to be confirmed after the outage",
            watch=workers,
        )
    finally:
        samples = sampler.stop()
    for worker in workers:
        worker.signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait(60) == 0, worker.output
    everyone = before + created

    # No pause past its cap, though the skewed worker opened and reopened the breaker itself.
    assert samples.count > 20
    assert 0 < samples.max_open_remaining <= MAX_PAUSE + PAUSE_MARGIN, samples
    # The incident's start and every transition are stamped with the database's now, not 2
    # minutes ahead (the sampler sees each within a sample interval of its commit).
    assert samples.opened_at_offsets, "the sampler never saw the breaker open"
    assert all(-1.0 <= offset <= CLOCK_MARGIN for offset in samples.opened_at_offsets), samples
    assert transitions(BreakerTransitionKind.REOPENED) >= 2
    assert len(samples.transition_offsets) == CircuitBreakerTransition.objects.count()
    assert all(-CLOCK_MARGIN <= offset <= 1.0 for offset in samples.transition_offsets.values()), (
        samples.transition_offsets
    )

    # Recovery within one capped pause and a trial lease of the outage's end, for everyone.
    recovery_bound = MAX_PAUSE + trial_lease_seconds() + RECOVERY_SLACK
    recovered = {
        pk: (moment - outage_ended).total_seconds()
        for pk, moment in samples.first_not_pending.items()
    }
    assert set(recovered) == set(during_ids)
    assert max(recovered.values()) <= recovery_bound, recovered
    # Nothing submitted while the processor was down.
    assert min(recovered.values()) >= -0.5, recovered

    # The event log's order (by id, as the admin and the API read it) is right for every
    # payment, whichever worker's clock stamped which row.
    for payment in everyone:
        applied = applied_moves(payment)
        assert applied == [
            (PaymentState.PENDING, PaymentState.SUBMITTED),
            (PaymentState.SUBMITTED, PaymentState.CONFIRMED),
        ], (payment.id, applied)

    # Each charged once, nothing dead-lettered, no hold left for a person or still waiting.
    assert sandbox.stats()["charges_by_payment"] == {str(p.id): 1 for p in everyone}
    assert not QueueMessage.objects.filter(status="dead_lettered").exists()
    assert not PaymentHold.objects.filter(kind=HoldKind.TRIAGE).exists()
    assert not PaymentHold.objects.filter(released_at__isnull=True).exists()
    assert drain(queues.client, queues.dlq_url) == []
    assert all("outcome=" in worker.output for worker in workers)

    # The event log's times are the database's: whichever worker wrote which row, they read
    # in the order the rows were written.
    disagree = sum(
        1
        for payment in everyone
        if list(payment.events.order_by("id").values_list("created_at", flat=True))
        != sorted(payment.events.values_list("created_at", flat=True))
    )
    assert disagree == 0
    print(
        f"\nclock skew: {time.monotonic() - began:.1f} s; max open pause "
        f"{samples.max_open_remaining:.2f} s (cap {MAX_PAUSE:.0f} s); opened_at offsets "
        f"{[round(o, 2) for o in samples.opened_at_offsets]}; transitions "
        f"{sorted(round(o, 2) for o in samples.transition_offsets.values())}; recovery "
        f"{max(recovered.values()):.1f} s after the outage (bound {recovery_bound:.1f} s); "
        f"{len(skewed_attempts)} calls by the skewed worker; {disagree} payment(s) whose "
        f"created_at order disagrees with the log's"
    )


def make_payments(count: int, prefix: str) -> list[Payment]:
    return payments_created(count, prefix, merchant_id="merchant-skew", first_amount="10.00")
