"""New rows of several tables in one statement (``payments.insert_sql``): the rows the ORM's
own saves would write, their database-filled fields set back on the instances, and nothing
written when one of them is refused; other databases save them one by one."""

from decimal import Decimal

import pytest
from django.db import DataError, transaction

from payments import insert_sql
from payments.insert_sql import rows_insert
from payments.models import (
    LedgerEntry,
    LedgerEntryKind,
    OutboxMessage,
    Payment,
    PaymentDirection,
    PaymentEvent,
    PaymentPurpose,
)

pytestmark = pytest.mark.django_db


@pytest.fixture(params=["one statement", "row by row"])
def path(request, monkeypatch):
    if request.param == "row by row":
        monkeypatch.setattr(insert_sql, "_one_statement", lambda: False)
    return request.param


def _rows(kind: str = "submit_payment"):
    payment = Payment(
        merchant_id="m-insert",
        amount=Decimal("12.34"),
        source_token="tok_insert_0001",
        direction=PaymentDirection.CREDIT,
        purpose=PaymentPurpose.PAYOUT,
        metadata={"order": "7"},
    )
    ledger = LedgerEntry(
        payment=payment,
        merchant_id="m-insert",
        kind=LedgerEntryKind.PAYOUT,
        amount=Decimal("-12.34"),
        currency="USD",
    )
    event = PaymentEvent(payment=payment, kind="created", to_state="pending", payload={"a": 1})
    message = OutboxMessage(kind=kind, group_id=str(payment.id), body={"b": 2}, carried={})
    return payment, ledger, event, message


def test_the_rows_are_written_as_their_saves_would_and_their_database_fields_set(path):
    payment, ledger, event, message = _rows()

    rows_insert([payment, ledger, event, message])

    stored = Payment.objects.get(pk=payment.id)
    # A field with a database default keeps the value given, not the default.
    assert (stored.direction, stored.purpose, stored.metadata, stored.amount) == (
        PaymentDirection.CREDIT,
        PaymentPurpose.PAYOUT,
        {"order": "7"},
        Decimal("12.34"),
    )
    assert stored.created_at == payment.created_at
    assert LedgerEntry.objects.get(pk=ledger.pk).created_at == ledger.created_at is not None
    assert PaymentEvent.objects.get(pk=event.pk).payload == {"a": 1}
    assert OutboxMessage.objects.get(pk=message.pk).body == {"b": 2}
    assert not any(row._state.adding for row in (payment, ledger, event, message))


def test_a_row_the_database_refuses_writes_none_of_them(path):
    rows = _rows(kind="x" * 33)  # longer than its column

    with pytest.raises(DataError), transaction.atomic():  # the caller's, as a create's
        rows_insert(list(rows))

    assert not Payment.objects.filter(pk=rows[0].id).exists()
    assert not LedgerEntry.objects.filter(merchant_id="m-insert").exists()
