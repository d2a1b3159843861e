"""The pull of the processor's events, on the real stack: the sandbox over HTTP (callbacks
delivered to a live server's endpoint, some dropped on purpose), the local SQS server, the worker,
PostgreSQL; the puller killed for real.
"""

import json
import signal
import subprocess
import sys
import time
from decimal import Decimal

import pytest
from django.core.management import call_command

from callbacks.events_pull import PullOutcome, processor_events_pull
from callbacks.models import ProcessorEventsCursor
from payments import conf as payments_conf
from payments.models import LedgerEntry, Payment, PaymentEvent, PaymentState, ProcessedEvent
from payments.services import payment_create, payment_submit
from tests.callbacks.sandbox_support import sandbox_posting_callbacks
from tests.callbacks.worker_support import ROOT, queue_counts, run_worker, worker_env
from tests.factories import PaymentFactory
from tests.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def sandbox_with_callbacks(module_settings, live_server):
    """The sandbox posting signed callbacks to the live server's endpoint; a settled debit
    of a ``tok_nsf`` token comes back 3 s after its settlement."""
    with sandbox_posting_callbacks(
        module_settings, live_server, return_after_seconds=3.0
    ) as server:
        yield server


def applied(payment) -> list[tuple[str, str]]:
    return list(
        PaymentEvent.objects.filter(payment=payment, kind="processor_event", outcome="applied")
        .order_by("id")
        .values_list("event_type", "to_state")
    )


def made(sandbox, payment, event_type) -> dict:
    """The event of ``event_type`` the sandbox made for ``payment`` (waits for it)."""
    found = []

    def there() -> bool:
        found[:] = [
            e
            for e in sandbox.events_made()
            if e["payment_id"] == str(payment.id) and e["event_type"] == event_type
        ]
        return bool(found)

    wait_for(there, 10, f"the sandbox to make {event_type} for {payment.id}")
    return found[0]


def work_until(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "the worker did not get there in time"
        run_worker(relay=True)
        time.sleep(0.1)


def state_of(payment) -> str:
    return Payment.objects.values_list("state", flat=True).get(pk=payment.pk)


def test_a_dropped_settled_callback_is_recovered_by_the_pull_and_applied_once_before_the_return(
    sqs_queues, sandbox_with_callbacks
):
    sandbox = sandbox_with_callbacks
    sandbox.drops.set(1.0, ["settled"])
    payment = payment_create(
        merchant_id="m-pull", amount=Decimal("40.00"), source_token="tok_nsf_pull_0001"
    )
    work_until(lambda: state_of(payment) == PaymentState.SUBMITTED)
    settled = made(sandbox, payment, "settled")
    wait_for(
        lambda: any(
            d["processor_event_id"] == settled["processor_event_id"]
            for d in sandbox.drops.dropped()
        ),
        10,
        "the settled callback to be dropped",
    )
    run_worker()
    assert state_of(payment) == PaymentState.SUBMITTED  # no callback will ever settle it

    result = processor_events_pull()
    assert result.outcome == PullOutcome.DONE
    assert result.new >= 1  # the settled event, which no callback delivered
    run_worker()
    assert state_of(payment) == PaymentState.CONFIRMED

    # The return, 3 s after settlement, still comes by callback; the pull sees it again.
    work_until(lambda: state_of(payment) == PaymentState.RETURNED)
    processor_events_pull()
    run_worker()

    assert applied(payment) == [("settled", "confirmed"), ("returned", "returned")]
    assert (
        PaymentEvent.objects.filter(processor_event_id=settled["processor_event_id"]).count() == 1
    )
    entries = sorted(LedgerEntry.objects.filter(payment=payment).values_list("kind", "amount"))
    assert entries == [("credit", Decimal("40.00")), ("reversal", Decimal("-40.00"))]
    assert queue_counts(sqs_queues.client, sqs_queues.url) == (0, 0)


def test_an_event_delivered_by_callback_is_pulled_as_a_duplicate_that_sqs_drops(
    sqs_queues, sandbox_with_callbacks
):
    sandbox = sandbox_with_callbacks
    payment = payment_create(
        merchant_id="m-pull", amount=Decimal("12.00"), source_token="tok_ok_pull_0002"
    )
    work_until(lambda: state_of(payment) == PaymentState.CONFIRMED)
    delivered = {d["processor_event_id"] for d in sandbox.callbacks_delivered()}
    assert {e["processor_event_id"] for e in sandbox.events_made()} == delivered

    result = processor_events_pull()

    assert (result.outcome, result.pulled, result.new, result.known) == ("done", 2, 0, 2)
    # Same group, same deduplication id as the callback's message: SQS dropped every one.
    assert queue_counts(sqs_queues.client, sqs_queues.url) == (0, 0)
    run_worker()
    assert applied(payment) == [("settled", "confirmed")]
    assert LedgerEntry.objects.filter(payment=payment).count() == 1
    assert ProcessedEvent.objects.filter(payment=payment).count() == 2


def test_a_pulled_event_already_applied_but_past_sqs_deduplication_is_a_duplicate_once_more(
    sqs_queues, sandbox
):
    """Past SQS's 5 minutes (a fresh queue stands for them) the processed-event record drops
    the pulled copy: the envelope and fingerprint are the callback's."""
    payment = PaymentFactory()
    assert payment_submit(payment_id=payment.id).outcome == "submitted"
    wait_for(lambda: len(sandbox.events_made()) == 2, 10, "the debit's two events")
    processor_events_pull()
    run_worker()
    assert state_of(payment) == PaymentState.CONFIRMED
    ProcessorEventsCursor.objects.update(cursor="")  # as if the cursor were lost

    result = processor_events_pull()
    assert (result.new, result.known) == (0, 2)
    run_worker()

    assert applied(payment) == [("settled", "confirmed")]
    assert LedgerEntry.objects.filter(payment=payment).count() == 1
    assert not PaymentEvent.objects.filter(payment=payment, outcome="conflict").exists()


class PullProcess:
    """``manage.py processor_events_pull`` as a real child process."""

    def __init__(self, *args: str, log_dir, name: str = "pull", **env: str) -> None:
        self.log_path = log_dir / f"{name}.log"
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in wait()
        self.process = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "processor_events_pull", *args],
            cwd=ROOT,
            env=worker_env(PROCESSOR_BACKEND=payments_conf.PROCESSOR_BACKEND, **env),
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    @property
    def output(self) -> str:
        return self.log_path.read_text()

    def wait(self, timeout: float = 60) -> int:
        try:
            return self.process.wait(timeout)
        finally:
            self._log.close()


def test_a_puller_killed_mid_page_resumes_from_the_stored_cursor_losing_and_doubling_nothing(
    sqs_queues, sandbox, tmp_path
):
    payments = [PaymentFactory() for _ in range(3)]
    for payment in payments:
        assert payment_submit(payment_id=payment.id).outcome == "submitted"
    wait_for(lambda: len(sandbox.events_made()) == 6, 10, "six events (no callback delivered)")
    first = processor_events_pull(page_size=2, max_pages=1)
    stored = ProcessorEventsCursor.objects.get().cursor
    assert (first.pages, stored) == (1, first.cursor)

    puller = PullProcess(
        "--page-size=2", log_dir=tmp_path, PROCESSOR_EVENTS_PULL_PAUSE_AT="page_queued"
    )
    wait_for(
        lambda: "paused at page_queued" in puller.output,
        60,
        "the puller to queue its first page",
        watch=[puller],
    )
    puller.process.send_signal(signal.SIGKILL)
    puller.wait()
    # Its page is on the queue; the cursor did not move.
    assert ProcessorEventsCursor.objects.get().cursor == stored
    assert [r["after"] for r in sandbox.events_requests] == [None, stored]

    resumed = processor_events_pull(page_size=2)
    assert resumed.outcome == PullOutcome.DONE
    assert [r["after"] for r in sandbox.events_requests][:3] == [None, stored, stored]
    run_worker()

    for payment in payments:
        assert applied(payment) == [("settled", "confirmed")]
        assert LedgerEntry.objects.filter(payment=payment).count() == 1
    assert ProcessedEvent.objects.count() == 6
    assert queue_counts(sqs_queues.client, sqs_queues.url) == (0, 0)


def test_the_pull_page_size_is_what_the_sandbox_answers_and_every_event_is_pulled_once(
    sqs_queues, sandbox
):
    payments = [PaymentFactory() for _ in range(4)]
    for payment in payments:
        payment_submit(payment_id=payment.id)
    wait_for(lambda: len(sandbox.events_made()) == 8, 10, "eight events")

    result = processor_events_pull(page_size=3)

    assert [r["limit"] for r in sandbox.events_requests] == [3, 3, 3]
    assert (result.pages, result.pulled, result.new) == (3, 8, 8)
    row = ProcessorEventsCursor.objects.get()
    assert (row.events_pulled, row.events_new, row.events_known) == (8, 8, 0)
    assert row.pulled_at is not None
    assert processor_events_pull(page_size=3).pulled == 0  # nothing new after the cursor


def test_the_command_runs_one_pass_and_reports_it(sqs_queues, sandbox, capsys):
    payment = PaymentFactory()
    payment_submit(payment_id=payment.id)
    wait_for(lambda: len(sandbox.events_made()) == 2, 10, "two events")

    call_command("processor_events_pull")

    assert "done: 1 page(s), 2 event(s) pulled: 2 new" in capsys.readouterr().out
    run_worker()
    assert state_of(payment) == PaymentState.CONFIRMED


def test_the_beat_task_runs_the_same_pass(sqs_queues, sandbox):
    from callbacks.tasks import processor_events_pull as task

    payment = PaymentFactory()
    payment_submit(payment_id=payment.id)
    wait_for(lambda: len(sandbox.events_made()) == 2, 10, "two events")

    assert task.apply().get() == 2
    run_worker()
    assert state_of(payment) == PaymentState.CONFIRMED


def test_a_callback_share_dropped_by_the_sandbox_is_all_recovered(
    sqs_queues, sandbox_with_callbacks
):
    sandbox = sandbox_with_callbacks
    sandbox.drops.set(0.5, None)
    created = [
        payment_create(merchant_id="m-pull", amount=Decimal("5.00"), source_token=f"tok_ok_{i}")
        for i in range(6)
    ]
    work_until(lambda: len(sandbox.events_made()) == 12)
    wait_for(lambda: sandbox.callbacks.pending == 0, 10, "every callback sent or dropped")
    dropped = {d["processor_event_id"] for d in sandbox.drops.dropped()}
    assert dropped  # 12 draws at one half

    processor_events_pull()
    # Every payment confirmed is not enough: a pulled `submitted` whose `settled` came first by
    # callback is applied (as stale) after the payment is confirmed, so wait for the events.
    work_until(
        lambda: (
            Payment.objects.filter(state=PaymentState.CONFIRMED).count() == len(created)
            and set(ProcessedEvent.objects.values_list("processor_event_id", flat=True)) >= dropped
        )
    )

    assert set(ProcessedEvent.objects.values_list("processor_event_id", flat=True)) >= dropped
    for payment in created:
        assert applied(payment) == [("settled", "confirmed")]
    assert json.loads(json.dumps(sandbox.stats()))["callbacks_dropped"] == len(dropped)


def test_the_cursor_is_shown_in_the_admin_and_cannot_be_edited_there(admin_client):
    from django.urls import reverse

    row = ProcessorEventsCursor.objects.create(
        source=payments_conf.PROCESSOR_BACKEND, cursor="c1.abc.7", events_pulled=7
    )
    changelist = admin_client.get(reverse("admin:callbacks_processoreventscursor_changelist"))
    change_url = reverse("admin:callbacks_processoreventscursor_change", args=[row.pk])
    posted = admin_client.post(change_url, {"cursor": "c1.abc.0"})

    assert changelist.status_code == 200
    assert "c1.abc.7" in changelist.content.decode()
    assert reverse("admin:callbacks_processoreventscursor_add") not in changelist.content.decode()
    assert posted.status_code == 403
    assert ProcessorEventsCursor.objects.get().cursor == "c1.abc.7"
