import io
import json
import os
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from pathlib import Path

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection

from callbacks import outbox, sqs
from callbacks.metrics import OUTBOX_PUBLISHED
from callbacks.outbox import outbox_relay_publish, outbox_relay_publish_ids
from payments.models import OutboxMessage
from payments.services import payment_create
from tests.factories import OutboxMessageFactory
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]


def create_payment():
    return payment_create(
        merchant_id="merchant-1", amount=Decimal("125.00"), source_token="tok_bank_abc"
    )


def drain(queues) -> list[dict]:
    """Every message on the main queue, in the order FIFO hands them out."""
    messages = []
    while True:
        got = queues.client.receive_message(
            QueueUrl=queues.url, MaxNumberOfMessages=10, WaitTimeSeconds=0, AttributeNames=["All"]
        ).get("Messages", [])
        if not got:
            return messages
        messages.extend(got)
        queues.client.delete_message_batch(
            QueueUrl=queues.url,
            Entries=[
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got)
            ],
        )


def published_count(path: str) -> float:
    return OUTBOX_PUBLISHED.labels(path=path)._value.get()


def add_rows(groups: list[str]) -> list[OutboxMessage]:
    """Outbox rows written directly (no on-commit publish), one per entry of ``groups``."""
    return [OutboxMessageFactory(payment_id=g) for g in groups]


@pytest.mark.django_db
def test_payment_is_on_the_queue_right_after_commit(sqs_queues, django_capture_on_commit_callbacks):
    before = published_count("on_commit")
    with django_capture_on_commit_callbacks(execute=True):
        payment = create_payment()

    row = OutboxMessage.objects.get(group_id=str(payment.id))
    assert row.published_at is not None
    [message] = drain(sqs_queues)
    assert message["Attributes"]["MessageGroupId"] == str(payment.id)
    assert message["Attributes"]["MessageDeduplicationId"] == f"outbox-{row.id}"
    body = json.loads(message["Body"])
    assert body["kind"] == "submit_payment"
    assert body["payment_id"] == str(payment.id)
    assert body["outbox_id"] == row.id
    assert body["enqueued_at"] == row.created_at.isoformat()
    assert published_count("on_commit") == before + 1


@pytest.mark.django_db
def test_nothing_is_published_before_commit(sqs_queues, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        create_payment()
    assert len(callbacks) == 1
    assert drain(sqs_queues) == []
    assert OutboxMessage.objects.get().published_at is None


@pytest.mark.django_db
def test_failure_after_commit_is_recorded_on_the_row(
    sqs_queues, queue_down, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        payment = create_payment()
    row = OutboxMessage.objects.get(group_id=str(payment.id))
    assert row.published_at is None
    assert row.publish_attempts == 1
    assert "Could not connect" in row.last_error


@pytest.mark.django_db
def test_payments_created_while_the_queue_is_down_are_published_once_it_is_back(
    sqs_queues, queue_down, sent_ids, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        payments = [create_payment() for _ in range(12)]
    assert outbox_relay_publish() == 0  # still down: nothing sent, the failure counted again
    rows = list(OutboxMessage.objects.order_by("id"))
    assert all(r.published_at is None and r.last_error for r in rows)
    assert rows[0].publish_attempts == 2  # its own on-commit try, then the relay's first batch

    queue_down()  # the queue is back
    before = published_count("relay")
    assert outbox_relay_publish() == 12

    assert OutboxMessage.objects.filter(published_at__isnull=True).count() == 0
    assert sorted(sent_ids) == [r.id for r in rows]  # each row sent once
    messages = drain(sqs_queues)
    assert sorted(m["Attributes"]["MessageDeduplicationId"] for m in messages) == sorted(
        f"outbox-{r.id}" for r in rows
    )
    assert {m["Attributes"]["MessageGroupId"] for m in messages} == {str(p.id) for p in payments}
    assert published_count("relay") == before + 12
    assert outbox_relay_publish() == 0


@pytest.mark.django_db
def test_relay_publishes_in_batches_up_to_its_limit(sqs_queues):
    add_rows([f"group-{n}" for n in range(25)])
    assert outbox_relay_publish(limit=7) == 7
    assert OutboxMessage.objects.filter(published_at__isnull=True).count() == 18
    assert outbox_relay_publish() == 18
    assert len(drain(sqs_queues)) == 25


@pytest.mark.django_db
def test_the_single_transaction_claim_publishes_in_order(sqs_queues, monkeypatch):
    """The path of a database without advisory locks (SQLite, the quick start): the send runs
    inside the claim's transaction on purpose, and the SQS guard must let it (it refused every
    publish there once)."""
    monkeypatch.setattr(outbox, "_uses_advisory_locks", lambda: False)
    rows = add_rows(["a", "b", "a", "c", "a"])
    assert outbox_relay_publish() == len(rows)
    assert not OutboxMessage.objects.filter(published_at__isnull=True).exists()
    bodies = [json.loads(m["Body"]) for m in drain(sqs_queues)]
    assert sorted(b["outbox_id"] for b in bodies) == [r.id for r in rows]
    assert [b["outbox_id"] for b in bodies if b["payment_id"] == "a"] == [
        r.id for r in rows if r.group_id == "a"
    ]


@pytest.mark.django_db
def test_relay_keeps_each_groups_id_order(sqs_queues):
    rows = add_rows(["a", "b", "a", "c", "a", "b"] * 4)
    assert outbox_relay_publish() == len(rows)
    by_group: dict[str, list[int]] = {}
    for message in drain(sqs_queues):
        body = json.loads(message["Body"])
        by_group.setdefault(message["Attributes"]["MessageGroupId"], []).append(body["outbox_id"])
    for group, ids in by_group.items():
        assert ids == [r.id for r in rows if r.group_id == group]


@pytest.mark.django_db
def test_publish_ids_leaves_a_row_behind_an_earlier_unpublished_row_of_its_group(sqs_queues):
    first, second = add_rows(["g", "g"])
    assert outbox_relay_publish_ids([second.id]) == 0
    second.refresh_from_db()
    assert second.published_at is None
    assert drain(sqs_queues) == []
    assert outbox_relay_publish() == 2
    ids = [json.loads(m["Body"])["outbox_id"] for m in drain(sqs_queues)]
    assert ids == [first.id, second.id]


@pytest.mark.django_db
def test_publish_ids_skips_rows_already_published(sqs_queues, sent_ids):
    [row] = add_rows(["g"])
    assert outbox_relay_publish_ids([row.id]) == 1
    assert outbox_relay_publish_ids([row.id]) == 0
    assert sent_ids == [row.id]


def test_relay_limit_must_be_positive():
    with pytest.raises(ValueError, match="limit"):
        outbox_relay_publish(limit=0)


@pytest.mark.django_db
def test_failed_batch_stops_the_round_and_counts_only_the_attempted_rows(sqs_queues, queue_down):
    rows = add_rows([f"group-{n}" for n in range(15)])
    assert outbox_relay_publish() == 0
    attempts = dict(OutboxMessage.objects.values_list("id", "publish_attempts"))
    assert [attempts[r.id] for r in rows] == [1] * 10 + [0] * 5


def _test_database_url() -> str:
    settings_dict = connection.settings_dict
    return (
        f"postgres://{settings_dict['USER']}@{settings_dict['HOST']}:{settings_dict['PORT']}"
        f"/{settings_dict['NAME']}"
    )


@pytest.mark.django_db(transaction=True)
def test_concurrent_relays_publish_each_row_once_in_group_order(sqs_queues, sent_ids):
    rows = add_rows([f"group-{n % 7}" for n in range(120)])
    start = threading.Barrier(4)

    def relay() -> None:
        try:
            start.wait()
            while OutboxMessage.objects.filter(published_at__isnull=True).exists():
                outbox_relay_publish(limit=20)
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = [pool.submit(relay) for _ in range(4)]
        for future in futures:
            future.result(timeout=60)  # re-raises anything a relay raised

    assert sorted(sent_ids) == [r.id for r in rows]  # no row sent twice, none missed
    by_group: dict[str, list[int]] = {}
    for message in drain(sqs_queues):
        by_group.setdefault(message["Attributes"]["MessageGroupId"], []).append(
            json.loads(message["Body"])["outbox_id"]
        )
    assert sum(len(ids) for ids in by_group.values()) == 120
    for group, ids in by_group.items():
        assert ids == [r.id for r in rows if r.group_id == group]


@pytest.mark.django_db(transaction=True)
def test_a_group_held_by_another_publisher_is_skipped_and_others_go_on(sqs_queues):
    held, free = add_rows(["held", "free"])
    with psycopg.connect(_test_database_url(), autocommit=True) as other:
        other.execute(
            "SELECT pg_advisory_lock(%s, hashtext(%s))", [outbox.ADVISORY_NAMESPACE, "held"]
        )
        assert outbox_relay_publish() == 1
        held.refresh_from_db()
        free.refresh_from_db()
        assert held.published_at is None
        assert free.published_at is not None
        other.execute(
            "SELECT pg_advisory_unlock(%s, hashtext(%s))", [outbox.ADVISORY_NAMESPACE, "held"]
        )
        assert outbox_relay_publish() == 1  # released: the group goes out


@pytest.mark.django_db(transaction=True)
def test_relay_returns_its_group_locks(sqs_queues):
    add_rows(["g1", "g2"])
    assert outbox_relay_publish() == 2
    with psycopg.connect(_test_database_url(), autocommit=True) as other:
        held = other.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = %s "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            [outbox.ADVISORY_NAMESPACE],
        ).fetchone()[0]
    assert held == 0


@pytest.mark.django_db
def test_run_outbox_relay_once_publishes_and_reports(sqs_queues):
    add_rows(["g1", "g2", "g1"])
    out = io.StringIO()
    call_command("run_outbox_relay", "--once", stdout=out)
    assert out.getvalue().strip() == "published 3 outbox rows"
    assert len(drain(sqs_queues)) == 3


@pytest.mark.subprocess
@pytest.mark.django_db(transaction=True)
def test_run_outbox_relay_publishes_until_sigterm_then_exits_0(sqs_queues, module_settings):
    add_rows(["g1", "g2"])
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings.test",
        "DATABASE_URL": _test_database_url(),
        "SQS_ENDPOINT_URL": module_settings.SQS_ENDPOINT_URL,
        "SQS_QUEUE_NAME": module_settings.SQS_QUEUE_NAME,
        "SQS_DLQ_NAME": module_settings.SQS_DLQ_NAME,
    }
    process = subprocess.Popen(
        [sys.executable, "manage.py", "run_outbox_relay", "--interval", "0.1"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # Generous timeouts: the machine may be busy.
        unpublished = OutboxMessage.objects.filter(published_at__isnull=True)
        wait_for(lambda: not unpublished.exists(), 60, "the relay to publish", watch=[process])
        add_rows(["g3"])  # written while it runs: picked up by a later round
        wait_for(lambda: not unpublished.exists(), 60, "the late row", watch=[process])
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, err
    assert "published 3 outbox rows" in out
    assert len(drain(sqs_queues)) == 3


@pytest.mark.django_db
def test_outage_in_the_middle_of_a_round_keeps_what_was_sent(sqs_queues, monkeypatch):
    rows = add_rows([f"group-{n}" for n in range(25)])
    real = sqs.send_messages_now
    calls = []

    def second_batch_fails(messages, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise sqs.QueueUnavailable("connection reset by peer")
        return real(messages, **kwargs)

    monkeypatch.setattr(sqs, "send_messages_now", second_batch_fails)
    assert outbox_relay_publish() == 10

    state = {
        r.id: (r.published_at is not None, r.publish_attempts, r.last_error)
        for r in OutboxMessage.objects.all()
    }
    assert [state[r.id][0] for r in rows] == [True] * 10 + [False] * 15
    assert [state[r.id][1] for r in rows] == [0] * 10 + [1] * 10 + [0] * 5
    assert state[rows[10].id][2] == "connection reset by peer"
    assert outbox_relay_publish() == 15
    assert len(drain(sqs_queues)) == 25


@pytest.mark.django_db
def test_run_outbox_relay_survives_a_database_error_and_stops_on_sigterm(monkeypatch):
    from django.db import OperationalError

    from callbacks.management.commands import run_outbox_relay

    rounds = []
    handler_before = signal.getsignal(signal.SIGTERM)

    def flaky_publish(*, limit):
        rounds.append(limit)
        if len(rounds) == 1:
            raise OperationalError("server closed the connection unexpectedly")
        if len(rounds) == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return 2

    monkeypatch.setattr(run_outbox_relay, "outbox_relay_publish", flaky_publish)
    out = io.StringIO()
    call_command("run_outbox_relay", "--interval", "0.01", stdout=out)

    assert len(rounds) == 3  # the failed round was followed by more rounds
    assert "published 4 outbox rows" in out.getvalue()
    assert signal.getsignal(signal.SIGTERM) is handler_before  # handlers given back


def test_run_outbox_relay_rejects_a_non_positive_interval():
    from django.core.management import CommandError

    with pytest.raises(CommandError, match="more than 0"):
        call_command("run_outbox_relay", "--interval", "0")


def test_database_error_after_commit_is_logged_and_left_for_the_relay(monkeypatch, caplog):
    from django.db import OperationalError

    from callbacks import receivers

    def broken(ids):
        raise OperationalError("could not connect to server")

    monkeypatch.setattr(receivers, "outbox_relay_publish_ids", broken)
    receivers.publish_committed_outbox(sender=OutboxMessage, message_ids=[41, 42])
    [record] = [r for r in caplog.records if r.name == "callbacks.receivers"]
    assert record.levelname == "WARNING"
    assert "[41, 42]" in record.getMessage() and "left for the relay" in record.getMessage()


@pytest.mark.django_db
def test_an_sqs_batch_never_holds_two_rows_of_one_group(sqs_queues, monkeypatch):
    rows = add_rows(["a", "a", "b", "c", "a", "b"] + [f"g{n}" for n in range(12)])
    real = sqs.send_messages_now
    batches: list[list[int]] = []

    def recording(messages, **kwargs):
        messages = list(messages)
        batches.append([m.body["outbox_id"] for m in messages])
        return real(messages, **kwargs)

    monkeypatch.setattr(sqs, "send_messages_now", recording)
    assert outbox_relay_publish() == len(rows)

    group_of = {r.id: r.group_id for r in rows}
    for batch in batches:
        assert len(batch) <= 10
        assert len({group_of[i] for i in batch}) == len(batch)
    assert [i for batch in batches for i in batch] == [r.id for r in rows]  # id order kept


@pytest.mark.django_db
def test_relay_sweep_leaves_rows_younger_than_its_threshold(sqs_queues):
    from datetime import timedelta

    from django.utils import timezone

    from callbacks.outbox import outbox_relay_publish
    from payments.models import OutboxMessage
    from payments.services import payment_create

    old = payment_create(merchant_id="m", amount=Decimal("5.00"), source_token="tok_abcdef12")
    payment_create(merchant_id="m", amount=Decimal("6.00"), source_token="tok_abcdef12")
    OutboxMessage.objects.filter(group_id=str(old.id)).update(
        created_at=timezone.now() - timedelta(minutes=2)
    )

    assert outbox_relay_publish(older_than=timedelta(minutes=1)) == 1
    assert list(
        OutboxMessage.objects.filter(published_at__isnull=False).values_list("group_id", flat=True)
    ) == [str(old.id)]


@pytest.mark.django_db(transaction=True)
def test_the_publish_after_commit_racing_the_relay_sends_each_row_once_in_group_order(
    sqs_queues, sent_ids
):
    """The fast path (each row's ids, as a request announces them) and the relay loop, each on
    its own connection, over the same groups: whoever holds a group's lock is its only
    publisher, and a row is never sent before an earlier unpublished row of its group."""
    rows = add_rows([f"group-{n % 5}" for n in range(150)])
    on_commit_before, relay_before = published_count("on_commit"), published_count("relay")
    # Each path publishes once while the other waits, then both race for the rest: on a loaded
    # machine one thread could otherwise publish every row before the other ran at all.
    first_published, relay_published = threading.Event(), threading.Event()

    def publish_after_commit() -> None:
        try:
            outbox_relay_publish_ids([rows[0].id])
            first_published.set()
            assert relay_published.wait(timeout=60)
            for row in rows[1:]:
                outbox_relay_publish_ids([row.id])
        finally:
            first_published.set()
            connection.close()

    def relay() -> None:
        try:
            assert first_published.wait(timeout=60)
            outbox_relay_publish(limit=3)
            relay_published.set()
            while OutboxMessage.objects.filter(published_at__isnull=True).exists():
                outbox_relay_publish(limit=3)
        finally:
            relay_published.set()
            connection.close()

    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = [pool.submit(publish_after_commit), pool.submit(relay)]
        for future in futures:
            future.result(timeout=120)  # re-raises anything either path raised

    assert sorted(sent_ids) == [r.id for r in rows]  # no row sent twice, none missed
    assert published_count("on_commit") > on_commit_before  # both paths took part
    assert published_count("relay") > relay_before
    by_group: dict[str, list[int]] = {}
    for message in drain(sqs_queues):
        by_group.setdefault(message["Attributes"]["MessageGroupId"], []).append(
            json.loads(message["Body"])["outbox_id"]
        )
    for group, ids in by_group.items():
        assert ids == [r.id for r in rows if r.group_id == group]
    assert sum(len(ids) for ids in by_group.values()) == len(rows)
