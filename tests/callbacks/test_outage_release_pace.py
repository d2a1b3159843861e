"""The paced release after an outage: the processor just back is not handed the whole backlog.

Real local SQS, the sandbox processor over HTTP, PostgreSQL; the worker through its command.
``OUTAGE_RELEASE_PER_SECOND`` caps the holds released in any second by all workers together,
and so the submissions (processor calls) they send.
"""

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from callbacks.models import HoldKind, PaymentHold
from callbacks.services import outage_holds_release
from payments.models import BreakerState, CircuitBreaker, Payment, PaymentState, ProcessorAttempt
from payments.processor.breaker import PROCESSOR
from tests.callbacks.worker_support import run_worker, send_body
from tests.factories import PaymentFactory, open_breaker

pytestmark = pytest.mark.django_db(transaction=True)

HELD = 12


def _held_payments(sqs_queues, count: int) -> list[Payment]:
    """``count`` payments whose submissions the open breaker parked behind outage holds; the
    breaker then closed, so the workers may release them."""
    payments = PaymentFactory.create_batch(count, state=PaymentState.PENDING)
    for payment in payments:
        body = {"kind": "submit_payment", "payment_id": str(payment.id)}
        send_body(sqs_queues.client, sqs_queues.url, payment.id, body)
    open_breaker()
    run_worker()
    assert PaymentHold.objects.filter(kind=HoldKind.OUTAGE, released_at__isnull=True).count() == (
        count
    )
    CircuitBreaker.objects.filter(name=PROCESSOR).update(
        state=BreakerState.CLOSED, opened_at=None, open_until=None
    )
    return payments


def _release_times() -> list[float]:
    return sorted(
        t.timestamp()
        for t in PaymentHold.objects.filter(kind=HoldKind.OUTAGE).values_list(
            "released_at", flat=True
        )
    )


def _call_times() -> list[float]:
    return sorted(
        t.timestamp() for t in ProcessorAttempt.objects.values_list("started_at", flat=True)
    )


def test_the_release_after_an_outage_keeps_to_its_cap_and_submits_every_payment_once(
    sqs_queues, sandbox, module_settings
):
    cap = 4
    module_settings.OUTAGE_RELEASE_PER_SECOND = cap
    _held_payments(sqs_queues, HELD)

    run_worker()  # --until-empty stays while the paced release is not done

    assert {p.state for p in Payment.objects.all()} == {PaymentState.SUBMITTED}
    assert sandbox.stats()["requests"]["debit_create"] == HELD
    assert not PaymentHold.objects.filter(released_at__isnull=True).exists()
    releases = _release_times()
    # No second holds more than the cap: any cap + 1 releases in a row span a second or more.
    spans = [releases[i + cap] - releases[i] for i in range(len(releases) - cap)]
    assert min(spans) >= 0.99, spans
    # The processor calls follow: 12 at 4 a second cannot all be made in under 2 seconds.
    calls = _call_times()
    assert len(calls) == HELD
    assert calls[-1] - calls[0] >= HELD / cap - 1 - 0.1


def test_without_a_tight_cap_the_same_backlog_is_released_in_one_go(
    sqs_queues, sandbox, module_settings
):
    module_settings.OUTAGE_RELEASE_PER_SECOND = 1000
    _held_payments(sqs_queues, HELD)

    run_worker()

    assert {p.state for p in Payment.objects.all()} == {PaymentState.SUBMITTED}
    releases = _release_times()
    assert releases[-1] - releases[0] < 1.0  # what the capped test's spans rule out


def test_holds_released_in_the_last_second_by_another_worker_count_against_the_cap(
    sqs_queues, module_settings
):
    held = PaymentFactory.create_batch(5, state=PaymentState.PENDING)
    for payment in held:
        PaymentHold.objects.create(payment_id=str(payment.id), kind=HoldKind.OUTAGE, reason="t")
    # Three holds another worker released just now, one over a second ago.
    for payment in PaymentFactory.create_batch(3, state=PaymentState.SUBMITTED):
        PaymentHold.objects.create(
            payment_id=str(payment.id), kind=HoldKind.OUTAGE, reason="t", released_at=timezone.now()
        )
    PaymentHold.objects.create(
        payment_id=str(PaymentFactory(state=PaymentState.SUBMITTED).id),
        kind=HoldKind.OUTAGE,
        reason="t",
        released_at=timezone.now() - timedelta(seconds=2),
    )

    outage_holds_release(limit=10, per_second=5)

    waiting = PaymentHold.objects.filter(kind=HoldKind.OUTAGE, released_at__isnull=True)
    assert waiting.count() == 3  # 5 a second, 3 of them taken: 2 released
    outage_holds_release(limit=10, per_second=5)
    assert waiting.count() == 3  # the second is full: nothing more
    time.sleep(1.05)
    outage_holds_release(limit=10, per_second=5)
    assert waiting.count() == 0


def test_while_submissions_wait_out_an_outage_the_worker_long_polls_no_longer_than_a_tick(
    sqs_queues,
):
    from callbacks.worker.loop import Worker

    worker = Worker(wait_time=20, relay=False)
    worker._tick(force=True)
    assert worker._wait_seconds() == 20  # nothing waits: the full long poll
    payment = PaymentFactory(state=PaymentState.PENDING)
    PaymentHold.objects.create(payment_id=str(payment.id), kind=HoldKind.OUTAGE, reason="t")
    open_breaker()

    worker._tick(force=True)

    # The breaker's trial and the release come on time, not after a 20 s poll of an empty queue.
    assert worker._wait_seconds() == 1
    CircuitBreaker.objects.filter(name=PROCESSOR).update(
        state=BreakerState.CLOSED, opened_at=None, open_until=None
    )
    worker._tick(force=True)  # releases the hold (it has nothing parked)
    assert not PaymentHold.objects.filter(released_at__isnull=True).exists()
    assert worker._wait_seconds() == 20


def test_the_release_sends_no_more_than_the_workers_take_from_the_queue(
    sqs_queues, sandbox, module_settings
):
    """Copies on the queue that no worker took yet hold the next release back: a pause or a
    reopening would park every one of them again, to be sent once more."""
    from callbacks.services.republish import RELEASE_ROOM_FLOOR

    module_settings.OUTAGE_RELEASE_PER_SECOND = 1000
    held = RELEASE_ROOM_FLOOR + 10
    _held_payments(sqs_queues, held)
    waiting = PaymentHold.objects.filter(kind=HoldKind.OUTAGE, released_at__isnull=True)

    # Nothing taken yet: the release has its floor's room.
    assert outage_holds_release(limit=1000, per_second=1000) == RELEASE_ROOM_FLOOR
    # Those copies are still on the queue: no room.
    assert outage_holds_release(limit=1000, per_second=1000) == 0
    assert waiting.count() == 10

    run_worker(max_messages=RELEASE_ROOM_FLOOR)  # the workers take them

    assert Payment.objects.filter(state=PaymentState.SUBMITTED).count() == RELEASE_ROOM_FLOOR
    assert outage_holds_release(limit=1000, per_second=1000) == 10
    run_worker()
    assert {p.state for p in Payment.objects.all()} == {PaymentState.SUBMITTED}
    assert sandbox.stats()["requests"]["debit_create"] == held


def test_releases_further_apart_than_a_second_still_grow_with_what_the_workers_took(
    sqs_queues, sandbox, module_settings
):
    """A worker ticks after its batch, so two releases come more than a second apart under a
    drain (1.4 s measured). The copies the workers took since the last release still count:
    counted over one second, none did, and every release was held to its floor."""
    from callbacks.services.republish import RELEASE_ROOM_FLOOR

    module_settings.OUTAGE_RELEASE_PER_SECOND = 1000
    _held_payments(sqs_queues, 3 * RELEASE_ROOM_FLOOR)

    assert outage_holds_release(limit=1000, per_second=1000) == RELEASE_ROOM_FLOOR
    run_worker(max_messages=RELEASE_ROOM_FLOOR)  # the workers take them
    time.sleep(1.5)  # the gap between two ticks of a busy worker

    assert outage_holds_release(limit=1000, per_second=1000) == 2 * RELEASE_ROOM_FLOOR
    run_worker()
    assert {p.state for p in Payment.objects.all()} == {PaymentState.SUBMITTED}
    assert sandbox.stats()["requests"]["debit_create"] == 3 * RELEASE_ROOM_FLOOR


def test_copies_no_worker_took_within_the_horizon_no_longer_hold_the_release_back(
    sqs_queues, module_settings
):
    from callbacks.services.republish import (
        RELEASE_COPY_HORIZON,
        RELEASE_ROOM_FLOOR,
        release_copies_room,
    )

    _held_payments(sqs_queues, 3)
    outage_holds_release(limit=10, per_second=1000)
    assert release_copies_room() == RELEASE_ROOM_FLOOR - 3  # three copies on the queue, none taken

    later = timezone.now() + RELEASE_COPY_HORIZON + timedelta(seconds=1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(timezone, "now", lambda: later)
        assert release_copies_room() == RELEASE_ROOM_FLOOR
