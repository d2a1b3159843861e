"""Retention purges of the payments core: only rows past retention and done with go, batch by
batch, each batch its own short DELETE."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from payments import retention, tasks
from payments.models import (
    ApiIdempotencyKey,
    CircuitBreaker,
    CircuitBreakerTransition,
    OutboxMessage,
    ProcessedEvent,
)
from payments.retention import idempotency_keys_purge, processed_events_purge
from payments.services import payment_apply_event
from tests.factories import (
    ApiIdempotencyKeyFactory,
    CircuitBreakerTransitionFactory,
    OutboxMessageFactory,
    PaymentFactory,
    UserFactory,
    processor_event,
)
from tests.history import history_rewritten

pytestmark = pytest.mark.django_db


def _deletes(queries: CaptureQueriesContext) -> list[str]:
    return [q["sql"] for q in queries.captured_queries if q["sql"].startswith("DELETE")]


def _outbox(published_days_ago: float | None) -> OutboxMessage:
    row = OutboxMessageFactory()
    if published_days_ago is not None:
        published_at = timezone.now() - timedelta(days=published_days_ago)
        OutboxMessage.objects.filter(pk=row.pk).update(
            created_at=published_at - timedelta(seconds=1), published_at=published_at
        )
    return row


def test_outbox_purge_deletes_only_published_rows_past_retention_in_batches(module_settings):
    module_settings.OUTBOX_RETENTION = timedelta(days=7)
    old = [_outbox(published_days_ago=8) for _ in range(5)]
    recent = _outbox(published_days_ago=1)
    unpublished = _outbox(published_days_ago=None)
    OutboxMessage.objects.filter(pk=unpublished.pk).update(
        created_at=timezone.now() - timedelta(days=60)
    )

    with CaptureQueriesContext(connection) as queries:
        assert retention.outbox_messages_purge(batch_size=2) == len(old)

    assert set(OutboxMessage.objects.values_list("pk", flat=True)) == {recent.pk, unpublished.pk}
    assert len(_deletes(queries)) == 3  # 2 + 2 + 1


def test_outbox_purge_task_reads_the_retention_setting(module_settings):
    _outbox(published_days_ago=3)
    module_settings.OUTBOX_RETENTION = timedelta(days=7)
    assert tasks.outbox_messages_purge() == 0
    module_settings.OUTBOX_RETENTION = timedelta(days=2)
    assert tasks.outbox_messages_purge() == 1


def test_breaker_transition_purge_keeps_recent_history_and_the_breaker(module_settings):
    module_settings.BREAKER_TRANSITION_RETENTION = timedelta(days=90)
    breaker = CircuitBreaker.objects.create(name="processor")
    old = CircuitBreakerTransitionFactory.create_batch(3, breaker=breaker, kind="open")
    CircuitBreakerTransition.objects.filter(pk__in=[t.pk for t in old]).update(
        created_at=timezone.now() - timedelta(days=91)
    )
    recent = CircuitBreakerTransitionFactory(breaker=breaker, kind="close")

    with CaptureQueriesContext(connection) as queries:
        assert tasks.breaker_transitions_purge() == 3

    assert list(CircuitBreakerTransition.objects.values_list("pk", flat=True)) == [recent.pk]
    assert CircuitBreaker.objects.filter(name="processor").exists()
    assert len(_deletes(queries)) == 1


def test_processed_event_purge_goes_in_batches_and_keeps_recent_records():
    payment = PaymentFactory(state="submitted")
    names = [f"old-{i}" for i in range(5)]
    for name in [*names, "new"]:
        payment_apply_event(event=processor_event(payment, "settled", processor_event_id=name))
    with history_rewritten():  # records a month old
        ProcessedEvent.objects.filter(pk__in=names).update(
            processed_at=timezone.now() - timedelta(days=31)
        )

    with CaptureQueriesContext(connection) as queries:
        assert processed_events_purge(batch_size=2) == 5

    assert list(ProcessedEvent.objects.values_list("pk", flat=True)) == ["new"]
    assert len(_deletes(queries)) == 3


def test_redelivery_after_its_dedup_record_is_purged_is_stale_not_applied_twice():
    payment = PaymentFactory(state="submitted")
    event = processor_event(payment, "settled")
    assert payment_apply_event(event=event).outcome == "applied"
    assert processed_events_purge(older_than=timedelta(seconds=-1)) == 1

    again = payment_apply_event(event=event)

    assert again.outcome == "stale"
    assert payment.ledger_entries.count() == 1


def test_idempotency_key_purge_goes_in_batches(module_settings):
    module_settings.API_IDEMPOTENCY_RETENTION = timedelta(hours=24)
    user = UserFactory()
    for i in range(3):
        ApiIdempotencyKeyFactory(user=user, key=f"old-{i}")
    ApiIdempotencyKey.objects.update(created_at=timezone.now() - timedelta(hours=25))
    ApiIdempotencyKeyFactory(user=user, key="new")

    with CaptureQueriesContext(connection) as queries:
        assert idempotency_keys_purge(batch_size=2) == 3

    assert list(ApiIdempotencyKey.objects.values_list("key", flat=True)) == ["new"]
    assert len(_deletes(queries)) == 2


def test_id_bound_is_the_first_id_written_at_or_after_the_cutoff():
    assert retention.id_bound(OutboxMessage, "created_at", timezone.now()) is None
    rows = [_outbox(published_days_ago=None) for _ in range(9)]
    for days, row in zip(range(9, 0, -1), rows, strict=True):  # oldest first, as written
        OutboxMessage.objects.filter(pk=row.pk).update(
            created_at=timezone.now() - timedelta(days=days)
        )

    cutoff = timezone.now() - timedelta(days=3, hours=12)
    assert retention.id_bound(OutboxMessage, "created_at", cutoff) == rows[6].pk
    assert retention.id_bound(OutboxMessage, "created_at", timezone.now()) == rows[-1].pk + 1
    assert retention.id_bound(OutboxMessage, "created_at", cutoff - timedelta(days=30)) == (
        rows[0].pk
    )
