"""The beat tasks, run in-process: thin wrappers over services, each doing its real work."""

import logging
from datetime import timedelta

import pytest
from django.utils import timezone

from callbacks import sqs
from callbacks import tasks as callback_tasks
from payments import tasks as payment_tasks
from payments.models import ApiIdempotencyKey, OutboxMessage
from tests.factories import PaymentFactory, UserFactory
from tests.triage.deadletters import worker_run
from triage import tasks as triage_tasks
from triage.models import Alert, AlertNotification, DeadLetter

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_message_the_worker_dead_letters_is_ingested_and_pages(sqs_queues, settings, mailoutbox):
    settings.ADMINS = [("Ops", "ops@example.com")]
    sqs.send_message_now(body={"kind": "no_such_kind"}, group_id="g-1", deduplication_id="d-1")
    worker_run()  # an unknown kind is dead-lettered at once

    assert triage_tasks.dead_letters_ingest() == 1
    dead_letter = DeadLetter.objects.get()
    alert = Alert.objects.get(key=f"dead_letter:{dead_letter.pk}")
    assert (alert.severity, alert.status, alert.notify_count) == ("high", "firing", 1)
    assert set(AlertNotification.objects.filter(alert=alert).values_list("sink", flat=True)) == {
        "log",
        "email",
    }
    assert len(mailoutbox) == 1

    # A second tick finds nothing new: ingestion is idempotent.
    assert triage_tasks.dead_letters_ingest() == 0
    result = triage_tasks.alerts_evaluate()
    assert result["fired"]["dead_letters.open"] == "fired"


def test_queue_metrics_sample_logs_one_line(sqs_queues, caplog):
    PaymentFactory(state="submitted")
    with caplog.at_level(logging.INFO, logger="triage.operations.monitoring"):
        data = triage_tasks.queue_metrics_sample()
    assert data["main_visible"] == 0
    assert data["payments_by_state"]["submitted"] == 1
    assert any(r.getMessage().startswith("queue metrics: main visible=0") for r in caplog.records)


def test_outbox_relay_task_publishes_rows_left_unpublished(sqs_queues):
    payment = PaymentFactory()
    row = OutboxMessage.objects.create(
        kind="submit_payment",
        group_id=str(payment.id),
        body={"kind": "submit_payment", "payment_id": str(payment.id)},
    )
    fresh = OutboxMessage.objects.create(kind="submit_payment", group_id="other", body={})
    OutboxMessage.objects.filter(pk=row.pk).update(created_at=timezone.now() - timedelta(minutes=2))
    assert callback_tasks.outbox_relay_publish() == 1  # the fresh row is left to on-commit
    fresh.refresh_from_db()
    assert fresh.published_at is None
    row.refresh_from_db()
    assert row.published_at is not None
    assert callback_tasks.outbox_relay_publish() == 0
    attributes = sqs_queues.client.get_queue_attributes(
        QueueUrl=sqs_queues.url, AttributeNames=["ApproximateNumberOfMessages"]
    )["Attributes"]
    assert attributes["ApproximateNumberOfMessages"] == "1"


def test_idempotency_keys_purge_task_removes_only_expired_keys(module_settings):
    user = UserFactory()
    old = ApiIdempotencyKey.objects.create(user=user, key="old", request_hash="h")
    ApiIdempotencyKey.objects.filter(pk=old.pk).update(
        created_at=timezone.now() - module_settings.API_IDEMPOTENCY_RETENTION - timedelta(minutes=1)
    )
    ApiIdempotencyKey.objects.create(user=user, key="fresh", request_hash="h")
    assert payment_tasks.idempotency_keys_purge() == 1
    assert list(ApiIdempotencyKey.objects.values_list("key", flat=True)) == ["fresh"]


def test_reconcile_task_with_nothing_stuck_asks_nobody(sqs_queues, module_settings):
    module_settings.PROCESSOR_BASE_URL = "http://127.0.0.1:9"  # would fail if it were called
    PaymentFactory(state="submitted")
    assert callback_tasks.payments_reconcile() == 0
