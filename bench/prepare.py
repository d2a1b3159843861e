"""What a run prepares before it measures: the payments waiting for their event, written by
``COPY``, and fresh queues made by the product's own setup, filled as the endpoint fills them."""

import json
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import psycopg

from bench import events
from bench.stack import BenchError, queue_names

PAYMENT_COLUMNS = (
    "id, merchant_id, amount, currency, source_token, description, idempotency_key, state, "
    "processor_id, created_at, updated_at, state_changed_at"
)


def payments_reset(db_url: str, count: int, *, state: str = "submitted") -> list[str]:
    """Empty the payment and queue-layer tables and write ``count`` payments in ``state``:
    ``submitted`` (the default), each waiting for its ``settled`` event, or ``pending``, each
    waiting for its submission. Returns their ids in order."""
    ids = [str(uuid.uuid4()) for _ in range(count)]
    now = datetime.now(UTC)
    with psycopg.connect(db_url, autocommit=True) as conn:
        tables = [
            row[0]
            for row in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND "
                "(tablename LIKE 'payments\\_%%' OR tablename LIKE 'callbacks\\_%%' "
                "OR tablename LIKE 'triage\\_%%')"
            )
        ]
        # A reset of the bench's own database, past the history guard (payments.history):
        # maintenance, in a superuser session, as docs/explanation/history.md describes.
        conn.execute("SET session_replication_role = replica")
        conn.execute(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE")
        conn.execute("RESET session_replication_role")
        with conn.cursor() as cur:
            with cur.copy(f"COPY payments_payment ({PAYMENT_COLUMNS}) FROM STDIN") as copy:
                for n, payment_id in enumerate(ids):
                    copy.write_row(
                        (
                            payment_id,
                            f"merchant-{n % 50}",
                            events.AMOUNT,
                            "USD",
                            f"tok_bench_{n:08d}",
                            "",
                            str(uuid.uuid4()),
                            state,
                            f"proc_{n}" if state != "pending" else "",
                            now,
                            now,
                            now,
                        )
                    )
        for table in tables:
            conn.execute(f"VACUUM ANALYZE {table}")
    return ids


def queues_create(tag: str) -> tuple[str, str, str]:
    """A fresh main queue and DLQ made by the product's own setup (``queues_ensure``)."""
    from django.conf import settings

    from callbacks import conf as callbacks_conf
    from callbacks import sqs
    from callbacks.queues import queues_ensure

    name, dlq = queue_names(tag)
    settings.CALLBACKS = {**settings.CALLBACKS, "SQS_QUEUE_NAME": name, "SQS_DLQ_NAME": dlq}
    callbacks_conf.callbacks_settings.reload()
    sqs.reset()
    queues_ensure(visibility_timeout=30)
    return name, dlq, sqs.main_queue_url()


def queue_depth(url: str) -> tuple[int, int]:
    """(visible, in flight) messages of the queue."""
    from callbacks import sqs

    attributes = sqs.sqs_client().get_queue_attributes(
        QueueUrl=url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return (
        int(attributes["ApproximateNumberOfMessages"]),
        int(attributes["ApproximateNumberOfMessagesNotVisible"]),
    )


def queue_fill(url: str, payment_ids: list[str], run: str) -> None:
    """One ``settled`` event per payment, each in its own message group (the payment), with the
    body the callback endpoint would have published."""
    from callbacks import sqs
    from callbacks.schema import parse_processor_event, processor_event_message

    entries = []
    for callback in events.callbacks_for(payment_ids, run):
        event = parse_processor_event(json.loads(callback.body))
        entries.append(
            {
                "Id": str(len(entries) % 10),
                "MessageBody": json.dumps(processor_event_message(event), separators=(",", ":")),
                "MessageGroupId": callback.payment_id,
                "MessageDeduplicationId": callback.processor_event_id,
            }
        )
    client = sqs.sqs_client()

    def send(start: int) -> None:
        response = client.send_message_batch(QueueUrl=url, Entries=entries[start : start + 10])
        if response.get("Failed"):
            raise BenchError(f"filling the queue failed: {response['Failed'][:3]}")

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(send, range(0, len(entries), 10)))
    visible, _ = queue_depth(url)
    if visible != len(entries):
        raise BenchError(f"queue holds {visible} messages after sending {len(entries)}")
