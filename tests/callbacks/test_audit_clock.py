"""The audit trail's times are the database's, whichever host's clock is wrong.

A ``run_sqs_worker`` process under libfaketime, its wall clock two minutes fast, submits
payments to the sandbox processor over HTTP and fails a bad event until it dead-letters it;
this process (on time) then applies the payments' settlements through the local SQS queue; a
third process, fast again, ingests the dead letter and resolves it. Every audit row (event log,
attempts, dedup records, ledger, error records, dead letter, triage action) must read in the
order it was written and never in the future: a payment confirmed after it was submitted says
so. Before the times came from the database, the fast worker stamped the submission two minutes
after the confirmation that followed it.
"""

import subprocess
import sys
from datetime import datetime, timedelta

import pytest
from django.db import connection

from callbacks.models import PaymentHold, ProcessingError, QueueMessage, QueueMessageStatus
from payments.models import (
    LedgerEntry,
    Payment,
    PaymentEvent,
    PaymentState,
    ProcessedEvent,
    ProcessorAttempt,
)
from tests.callbacks.test_clock_skew import SKEW_SECONDS, faketime_env
from tests.callbacks.worker_support import (
    ROOT,
    WorkerProcess,
    payments_created,
    run_worker,
    send_event,
    worker_env,
)
from tests.factories import PaymentFactory
from tests.triage.deadletters import operator
from triage.models import DeadLetter, DeadLetterStatus, TriageAction

pytestmark = [pytest.mark.subprocess, pytest.mark.django_db(transaction=True)]

BUDGET = {
    "WORKER_BACKOFF_BASE_SECONDS": "0.05",
    "WORKER_BACKOFF_CAP_SECONDS": "0.1",
    "WORKER_MAX_ATTEMPTS": "2",
}
# How far a row's time may trail the database's now read right after its phase: the phase's
# own length, far under the skew.
PHASE_MARGIN = timedelta(seconds=30)


def db_now() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement_timestamp()")
        return cursor.fetchone()[0]


def run_fast(tmp_path, name: str, until, skew_env: dict[str, str]) -> None:
    """The fast worker, ``--until-empty``, again until ``until()`` (a retry hidden by its
    backoff may come back after a run has ended)."""
    for round_number in range(10):
        worker = WorkerProcess(
            "--until-empty",
            "--wait-time",
            "1",
            log_dir=tmp_path,
            name=f"{name}-{round_number}",
            **BUDGET,
            **skew_env,
        )
        assert worker.wait(120) == 0, worker.output
        if until():
            return
    pytest.fail(f"the fast worker did not get there: {worker.output}")


def fast_python(code: str, skew_env: dict[str, str]) -> str:
    """Django code in a process whose wall clock is fast."""
    completed = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "shell", "-c", code],
        cwd=ROOT,
        env=worker_env(**BUDGET, **skew_env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr
    return completed.stdout


def test_a_worker_two_minutes_fast_writes_the_audit_trail_in_order_on_the_databases_clock(
    sandbox, sqs_queues, module_settings, tmp_path
):
    for name, value in BUDGET.items():
        setattr(module_settings, name, float(value))
    skew_env = faketime_env()
    submitted = payments_created(2, "audit", merchant_id="merchant-audit")
    stuck = PaymentFactory(state=PaymentState.PENDING, merchant_id="merchant-audit")
    send_event(sqs_queues.client, sqs_queues.url, stuck, "settled")  # no valid transition
    # Settled by the fast worker: the event's rows in one statement (``payments.event_sql``).
    settled_fast = PaymentFactory(state=PaymentState.SUBMITTED, merchant_id="merchant-audit")
    send_event(sqs_queues.client, sqs_queues.url, settled_fast, "settled")

    # Phase 1, fast: submit both payments; fail the bad event until it is dead-lettered.
    started = db_now()
    run_fast(
        tmp_path,
        "fast-worker",
        lambda: (
            set(Payment.objects.filter(pk__in=[p.pk for p in submitted]).values_list("state"))
            == {(PaymentState.SUBMITTED,)}
            and QueueMessage.objects.filter(
                payment_id=str(stuck.pk), status=QueueMessageStatus.DEAD_LETTERED
            ).exists()
            and Payment.objects.get(pk=settled_fast.pk).state == PaymentState.CONFIRMED
        ),
        skew_env,
    )
    phase_one = db_now()
    # The premise: the worker's own clock was fast (a record that keeps the worker's time).
    fast_start = QueueMessage.objects.filter(payment_id=str(stuck.pk)).get().first_started_at
    assert fast_start > phase_one + timedelta(seconds=SKEW_SECONDS - 30), (fast_start, phase_one)

    # Phase 2, on time: the processor settles both; this process applies the settlements.
    for payment in submitted:
        send_event(sqs_queues.client, sqs_queues.url, payment, "settled")
    run_worker()
    assert set(
        Payment.objects.filter(pk__in=[p.pk for p in submitted]).values_list("state", flat=True)
    ) == {PaymentState.CONFIRMED}
    phase_two = db_now()

    # Phase 3, fast: the dead letter is ingested and resolved by an operator.
    user = operator()
    fast_python(
        "from triage.ingestion import dead_letters_ingest\n"
        "from triage.models import DeadLetter\n"
        "from triage.services import dead_letter_resolve\n"
        "from django.contrib.auth import get_user_model\n"
        "assert dead_letters_ingest(max_messages=10) == 1\n"
        "dead_letter_resolve(dead_letter=DeadLetter.objects.get(), "
        f"user=get_user_model().objects.get(pk={user.pk}), note='fixed at the processor')\n",
        skew_env,
    )
    phase_three = db_now()

    # Each phase's rows lie within that phase, on the database's clock: none in the future,
    # and each payment's log in the order it was written. Every table is checked before the
    # test fails, so a failure names each one stamped by a host's clock.
    problems: list[str] = []

    def within(what: str, times, low, high) -> None:
        times = list(times)
        if not times:
            problems.append(f"{what}: no rows")
        elif not all(low - PHASE_MARGIN <= t <= high for t in times):
            problems.append(f"{what}: {[t.isoformat() for t in times]} not within {low} .. {high}")

    for payment in submitted:
        log = list(
            PaymentEvent.objects.filter(payment=payment)
            .order_by("id")
            .values_list("to_state", "created_at")
        )
        assert [state for state, _ in log] == ["pending", "submitted", "confirmed"]
        times = [at for _, at in log]
        if times != sorted(times):  # confirmed after submitted, as it happened
            problems.append(f"event log out of order: {log}")
        within("event log: submitted", times[1:2], started, phase_one)
        within("event log: confirmed", times[2:], phase_one, phase_two)
        attempt = ProcessorAttempt.objects.get(payment=payment)
        within("attempt started_at", [attempt.started_at], started, phase_one)
        within("attempt recorded_at", [attempt.recorded_at], started, phase_one)
        if not attempt.started_at <= attempt.recorded_at <= times[1]:
            problems.append(f"attempt after its outcome: {attempt.started_at} {times[1]}")
        processed = ProcessedEvent.objects.filter(payment=payment)
        within(
            "dedup record", processed.values_list("processed_at", flat=True), phase_one, phase_two
        )
        ledger = LedgerEntry.objects.filter(payment=payment)
        within("ledger", ledger.values_list("created_at", flat=True), phase_one, phase_two)

    rows = {
        "event log: settled by the fast worker": PaymentEvent.objects.filter(
            payment=settled_fast
        ).values_list("created_at", flat=True),
        "dedup record of the fast worker": ProcessedEvent.objects.filter(
            payment=settled_fast
        ).values_list("processed_at", flat=True),
        "ledger of the fast worker": LedgerEntry.objects.filter(payment=settled_fast).values_list(
            "created_at", flat=True
        ),
        "hold of the dead-lettered payment": PaymentHold.objects.filter(
            payment_id=str(stuck.pk)
        ).values_list("created_at", flat=True),
    }
    for what, times in rows.items():
        within(what, times, started, phase_one)
    errors = ProcessingError.objects.filter(payment_id=str(stuck.pk)).order_by("id")
    within("error records", errors.values_list("created_at", flat=True), started, phase_one)
    dead_letter = DeadLetter.objects.get()
    assert dead_letter.status == DeadLetterStatus.RESOLVED
    within("dead letter ingested_at", [dead_letter.ingested_at], phase_two, phase_three)
    within("dead letter status_changed_at", [dead_letter.status_changed_at], phase_two, phase_three)
    actions = TriageAction.objects.values_list("created_at", flat=True)
    within("triage action", actions, phase_two, phase_three)
    assert problems == []
    # The dead letter's history is its error records' times.
    assert dead_letter.first_failed_at == errors.first().created_at
