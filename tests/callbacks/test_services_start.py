"""The one start statement: both starts (one message, a batch's group heads) write the model's
own columns, taken from ``QueueMessage._meta``, so a column added to the model cannot break
only one of them."""

import re
import uuid

import pytest
from django.db import connection, models, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from callbacks.models import QueueMessage, sequence_key
from callbacks.schema import PROCESSOR_EVENT
from callbacks.services import (
    ReceivedMessage,
    StartAction,
    queue_message_start,
    queue_messages_start_batch,
    starts,
)

pytestmark = pytest.mark.django_db


def received(*, sequence: int = 1) -> ReceivedMessage:
    return ReceivedMessage(
        message_id=str(uuid.uuid4()),
        receipt_handle="handle",
        raw_body="{}",
        body={"kind": PROCESSOR_EVENT, "event": {}},
        group_id=str(uuid.uuid4()),
        deduplication_id=str(uuid.uuid4()),
        sequence_number=sequence_key(sequence),
        enqueued_at=timezone.now(),
        receive_count=1,
    )


def model_columns() -> list[str]:
    return [
        f.column for f in QueueMessage._meta.concrete_fields if not isinstance(f, models.AutoField)
    ]


def inserted_columns(queries: CaptureQueriesContext) -> list[list[str]]:
    """The column list of every INSERT into the queue-message table the queries made."""
    table = connection.ops.quote_name(QueueMessage._meta.db_table)
    found = []
    for query in queries.captured_queries:
        match = re.match(rf"INSERT INTO {re.escape(table)} \(([^)]*)\)", query["sql"])
        if match:
            found.append([c.strip().strip('"') for c in match.group(1).split(",")])
    return found


def test_both_starts_write_exactly_the_models_concrete_columns():
    with CaptureQueriesContext(connection) as one:
        decision = queue_message_start(message=received())
    with CaptureQueriesContext(connection) as batch:
        started = queue_messages_start_batch(messages=[received(), received()])

    assert decision.action == StartAction.PROCESS and len(started) == 2
    assert inserted_columns(one) == [model_columns()]
    assert inserted_columns(batch) == [model_columns()]


def test_a_start_gives_every_column_the_database_requires_a_value():
    """A NOT NULL column gets a value from the start's record (``queue_message_new``) or from
    its field's default; one added without either fails here, by name, and in both starts."""
    row = starts.queue_message_new(received(), timezone.now(), attempts=1)
    missing = [
        f.column
        for f in starts.start_fields()
        if not f.null and f.get_db_prep_save(f.pre_save(row, add=True), connection) is None
    ]

    assert missing == []


@pytest.fixture
def added_column():
    """A NOT NULL column with a model default and none in the database (as a migration adds
    one), on QueueMessage for the test; the test's transaction rolls the table back."""
    field = models.CharField(max_length=8, default="added")
    QueueMessage.add_to_class("added", field)
    starts._start_sql.cache_clear()
    try:
        with connection.schema_editor() as editor:
            editor.add_field(QueueMessage, field)
        yield field
    finally:
        QueueMessage._meta.local_fields.remove(field)
        QueueMessage._meta._expire_cache()
        delattr(QueueMessage, field.attname)
        starts._start_sql.cache_clear()


def test_a_column_added_to_the_model_is_written_by_both_starts(added_column):
    one = queue_message_start(message=received()).queue_message
    batch = list(queue_messages_start_batch(messages=[received(), received()]).values())

    table = connection.ops.quote_name(QueueMessage._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT message_id, added FROM {table}")  # noqa: S608
        written = dict(cursor.fetchall())
    assert written == {qm.message_id: "added" for qm in [one, *batch]}


def synchronous_commit() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        return cursor.fetchone()[0]


@pytest.fixture
def flushed_commits():
    """This session's commits wait for the WAL flush, as a production database's do (the test
    database's do not: ``tests/conftest.py``), and go back to what they were afterwards."""
    before = synchronous_commit()
    with connection.cursor() as cursor:
        cursor.execute("SET synchronous_commit = on")
    yield
    with connection.cursor() as cursor:
        cursor.execute(f"SET synchronous_commit = {before}")


@pytest.mark.django_db(transaction=True)
def test_a_start_that_is_its_own_transaction_commits_without_waiting_for_the_flush(
    flushed_commits,
):
    """Autocommitted, the start turns ``synchronous_commit`` off for its own transaction (one
    fsync per batch less) and for nothing after it: the session, and so the batch's work and
    its done marks after it, still commit only once flushed."""
    with CaptureQueriesContext(connection) as queries:
        started = queue_messages_start_batch(messages=[received(), received()])
    [statement] = [query["sql"] for query in queries.captured_queries]

    assert len(started) == 2
    assert synchronous_commit() == "on"
    # The same statement seen from inside a transaction: it is the statement that turns it off.
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(statement)
        assert synchronous_commit() == "off"
        transaction.set_rollback(True)
    assert synchronous_commit() == "on"


def test_a_start_inside_a_callers_transaction_leaves_its_commit_synchronous(flushed_commits):
    """Inside a caller's transaction (a test's, here) the setting would last for the whole of
    it, the caller's own writes included: the start leaves it alone there."""
    with CaptureQueriesContext(connection) as queries:
        started = queue_messages_start_batch(messages=[received()])
        decision = queue_message_start(message=received())

    assert len(started) == 1 and decision.action == StartAction.PROCESS
    assert not any("synchronous_commit" in query["sql"] for query in queries.captured_queries)
    assert synchronous_commit() == "on"
