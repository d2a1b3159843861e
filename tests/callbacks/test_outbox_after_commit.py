"""The publish after commit off the request (``callbacks.outbox_after_commit``): the rows of
many commits go out in one claim, from one thread per process, and whatever it cannot publish
stays for the relay.

The rows must be committed for the publisher's own connection to see them: these tests use
``transactional_db``, the local SQS server over HTTP and PostgreSQL.
"""

import threading
import time
import uuid

import pytest
from django.db import OperationalError

from callbacks import outbox_after_commit
from callbacks.outbox import CLAIM_SIZE, outbox_relay_publish, outbox_relay_publish_ids
from callbacks.outbox_after_commit import AfterCommitPublisher
from payments.models import OutboxMessage
from tests.callbacks.test_outbox import add_rows, create_payment, drain, published_count

pytestmark = pytest.mark.django_db(transaction=True)


class Recording:
    """The real publish, with the ids of each round it was given."""

    def __init__(self, *, fail_first: int = 0, error: Exception | None = None) -> None:
        self.rounds: list[list[int]] = []
        self.fail_first = fail_first
        self.error = error or OperationalError("the database went away")
        self.lock = threading.Lock()

    def __call__(self, ids: list[int]) -> int:
        with self.lock:
            self.rounds.append(list(ids))
            failing = len(self.rounds) <= self.fail_first
        if failing:
            raise self.error
        return outbox_relay_publish_ids(ids)


@pytest.fixture
def make_publisher():
    made: list[AfterCommitPublisher] = []

    def make(publish, *, linger: float, claim_size: int = CLAIM_SIZE) -> AfterCommitPublisher:
        publisher = AfterCommitPublisher(publish=publish, linger=linger, claim_size=claim_size)
        made.append(publisher)
        return publisher

    yield make
    for publisher in made:
        assert publisher.stop(10)


def committed_rows(count: int) -> list[OutboxMessage]:
    """``count`` unpublished outbox rows of as many payments, each committed on its own (no
    publish after commit: the publisher under test has them to publish)."""
    return add_rows([str(uuid.uuid4()) for _ in range(count)])


def test_the_rows_of_many_commits_go_out_in_one_claim(sqs_queues, make_publisher, sent_ids):
    rows = committed_rows(12)
    recording = Recording()
    publisher = make_publisher(recording, linger=0.5)
    before = published_count("on_commit")

    started = time.monotonic()
    for row in rows:  # twelve commits, a moment apart
        publisher.submit([row.id])
    assert publisher.wait_idle(10)

    assert recording.rounds == [[row.id for row in rows]]  # one round, one claim
    assert time.monotonic() - started >= 0.5  # the first waited for the others
    assert sent_ids == [row.id for row in rows]  # two batches, in commit order
    assert not OutboxMessage.objects.filter(published_at__isnull=True).exists()
    messages = drain(sqs_queues)
    assert [m["Attributes"]["MessageDeduplicationId"] for m in messages] == [
        f"outbox-{row.id}" for row in rows
    ]
    assert published_count("on_commit") == before + 12


def test_a_claims_worth_goes_out_without_waiting_for_the_linger(sqs_queues, make_publisher):
    rows = committed_rows(3)
    recording = Recording()
    publisher = make_publisher(recording, linger=30, claim_size=3)

    started = time.monotonic()
    publisher.submit([rows[0].id])
    publisher.submit([rows[1].id, rows[2].id])
    assert publisher.wait_idle(10)

    assert time.monotonic() - started < 10
    assert recording.rounds == [[r.id for r in rows]]
    assert not OutboxMessage.objects.filter(published_at__isnull=True).exists()


def test_one_commit_of_several_rows_wakes_the_thread(sqs_queues, make_publisher):
    first, *rows = committed_rows(3)
    recording = Recording()
    publisher = make_publisher(recording, linger=0.01)
    publisher.submit([first.id])
    assert publisher.wait_idle(10)  # the thread now waits for a first id

    publisher.submit([rows[0].id, rows[1].id])  # two at once
    assert publisher.wait_idle(10)

    assert recording.rounds == [[first.id], [r.id for r in rows]]
    assert not OutboxMessage.objects.filter(published_at__isnull=True).exists()


def test_a_failed_round_leaves_its_rows_to_the_relay_and_the_thread_goes_on(
    sqs_queues, make_publisher, caplog
):
    first, second = committed_rows(2)
    recording = Recording(fail_first=1)
    publisher = make_publisher(recording, linger=0.01)

    publisher.submit([first.id])
    assert publisher.wait_idle(10)
    first.refresh_from_db()
    assert first.published_at is None  # left for the relay, not lost
    [record] = [r for r in caplog.records if "left for the relay" in r.getMessage()]
    assert str(first.id) in record.getMessage()
    assert not record.exc_info  # the database's error, named without a traceback

    publisher.submit([second.id])  # the thread survived the error
    assert publisher.wait_idle(10)
    second.refresh_from_db()
    assert second.published_at is not None

    assert outbox_relay_publish() == 1  # the relay keeps the first row's promise
    first.refresh_from_db()
    assert first.published_at is not None
    assert len(drain(sqs_queues)) == 2


def test_an_unexpected_error_is_logged_with_its_traceback_and_the_thread_goes_on(
    sqs_queues, make_publisher, caplog
):
    first, second = committed_rows(2)
    publisher = make_publisher(Recording(fail_first=1, error=RuntimeError("a bug")), linger=0.01)

    publisher.submit([first.id])
    assert publisher.wait_idle(10)
    [record] = [r for r in caplog.records if "left for the relay" in r.getMessage()]
    assert str(first.id) in record.getMessage() and "a bug" in record.getMessage()
    assert record.exc_info and record.exc_info[0] is RuntimeError
    first.refresh_from_db()
    assert first.published_at is None

    publisher.submit([second.id])
    assert publisher.wait_idle(10)
    second.refresh_from_db()
    assert second.published_at is not None
    assert outbox_relay_publish() == 1


def test_a_queue_failure_is_recorded_on_the_rows_and_the_relay_publishes_them(
    sqs_queues, make_publisher, queue_down
):
    [row] = committed_rows(1)
    publisher = make_publisher(Recording(), linger=0.01)

    publisher.submit([row.id])
    assert publisher.wait_idle(30)
    row.refresh_from_db()
    assert row.published_at is None
    assert row.publish_attempts == 1 and row.last_error

    queue_down()  # the queue is back
    assert outbox_relay_publish() == 1
    row.refresh_from_db()
    assert row.published_at is not None
    assert len(drain(sqs_queues)) == 1


def test_stopping_publishes_what_waits_at_once(sqs_queues, make_publisher):
    rows = committed_rows(2)
    publisher = make_publisher(Recording(), linger=60)
    publisher.submit([r.id for r in rows])

    started = time.monotonic()
    assert publisher.stop(10)
    assert time.monotonic() - started < 10
    assert not OutboxMessage.objects.filter(published_at__isnull=True).exists()


def test_a_row_published_meanwhile_by_the_relay_is_not_sent_again(
    sqs_queues, make_publisher, sent_ids
):
    rows = committed_rows(3)
    publisher = make_publisher(Recording(), linger=0.3)
    publisher.submit([r.id for r in rows])
    assert outbox_relay_publish() == 3  # the relay got there first
    assert publisher.wait_idle(10)

    assert sent_ids == [r.id for r in rows]  # each sent once
    assert len(drain(sqs_queues)) == 3


def test_a_create_through_the_receiver_goes_to_the_process_publisher(
    sqs_queues, module_settings, sent_ids
):
    module_settings.OUTBOX_PUBLISH_LINGER_SECONDS = 0.2
    try:
        payments = [create_payment() for _ in range(3)]
        publisher = outbox_after_commit.publisher()
        # The creates returned before their rows went out: the thread publishes them together.
        assert publisher.wait_idle(10)
        rows = OutboxMessage.objects.filter(group_id__in=[str(p.id) for p in payments])
        assert all(row.published_at is not None for row in rows)
        assert sorted(sent_ids) == sorted(row.id for row in rows)
        assert len(drain(sqs_queues)) == 3
    finally:
        assert outbox_after_commit.publisher().stop(10)


def test_each_process_and_each_linger_has_its_own_publisher(module_settings, monkeypatch):
    module_settings.OUTBOX_PUBLISH_LINGER_SECONDS = 0.2
    first = outbox_after_commit.publisher()
    assert outbox_after_commit.publisher() is first
    module_settings.OUTBOX_PUBLISH_LINGER_SECONDS = 0.3
    second = outbox_after_commit.publisher()
    assert second is not first
    real_pid = outbox_after_commit.os.getpid()
    monkeypatch.setattr(outbox_after_commit.os, "getpid", lambda: real_pid + 1)
    assert outbox_after_commit.publisher() is not second  # a forked child builds its own
