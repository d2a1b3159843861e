"""The history preload (bench/preload.py) and the storage report (bench/storage.py): the rows
are what the models read, consistent across tables, and the report adds up. None of these tests
measures speed."""

from datetime import timedelta

import psycopg
import pytest
from django.db import connection

from bench import preload, storage
from callbacks.models import QueueMessage
from callbacks.services import queue_messages_purge
from payments.models import LedgerEntry, Payment, PaymentEvent, ProcessedEvent
from payments.services import payment_apply_event, processed_events_purge
from tests.factories import processor_event


def _url() -> str:
    s = connection.settings_dict
    return f"postgres://{s['USER']}@{s['HOST']}:{s['PORT']}/{s['NAME']}"


@pytest.mark.django_db(transaction=True)
def test_history_preload_writes_a_consistent_settled_history_the_models_can_read():
    report = preload.history_preload(_url(), 70, timedelta(days=36))

    assert report["tables"]["callbacks_queuemessage"]["rows"] == 140
    assert Payment.objects.filter(state="confirmed").count() == 70
    payments = set(Payment.objects.values_list("id", flat=True))
    for model in (PaymentEvent, ProcessedEvent, LedgerEntry):
        assert set(model.objects.values_list("payment_id", flat=True)) == payments
    assert PaymentEvent.objects.count() == 3 * 70
    assert QueueMessage.objects.filter(status="done").count() == 140
    assert len(set(QueueMessage.objects.values_list("message_id", flat=True))) == 140
    # A sixth of the span lies past the 30-day retentions: the purges find work.
    assert 0 < processed_events_purge() < 70
    assert 0 < queue_messages_purge() < 140


@pytest.mark.django_db(transaction=True)
def test_history_payments_are_added_beside_the_history_and_take_their_event():
    preload.history_preload(_url(), 20, timedelta(days=36))
    ids = preload.history_payments_add(_url(), 3)

    assert Payment.objects.count() == 23
    payment = Payment.objects.get(pk=ids[0])
    assert payment_apply_event(event=processor_event(payment, "settled")).outcome == "applied"


@pytest.mark.django_db(transaction=True)
def test_storage_report_counts_every_table_with_rows_per_event():
    preload.history_preload(_url(), 40, timedelta(days=36))

    report = storage.storage_report(_url(), 40)

    tables = report["tables"]
    assert set(tables) == {t for t, _, _ in preload.HISTORY_TABLES}
    assert tables["callbacks_queuemessage"]["rows_per_event"] == 2.0
    assert tables["callbacks_queuemessage"]["retention_days"] == 30
    assert tables["payments_ledgerentry"]["retention_days"] is None
    assert report["total_bytes_per_event"] == pytest.approx(
        sum(t["bytes_per_event"] for t in tables.values()), abs=1
    )
    with psycopg.connect(_url()) as conn:
        size = conn.execute("SELECT pg_total_relation_size('payments_paymentevent')").fetchone()[0]
    assert tables["payments_paymentevent"]["bytes_per_event"] == round(size / 40, 1)
    assert "| **total** |" in storage.storage_markdown(report)
