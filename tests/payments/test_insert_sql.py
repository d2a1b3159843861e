"""New rows of several tables in one statement (``payments.insert_sql``): the rows the ORM's
own saves would write, their database-filled fields set back on the instances, and nothing
written when one of them is refused; other databases save them one by one."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import DataError, transaction
from django.db.models.functions import Now
from django.db.models.sql.compiler import SQLInsertCompiler
from django.utils import timezone

from payments import insert_sql
from payments.insert_sql import rows_insert
from payments.models import (
    AccountBlock,
    AccountBlockScope,
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


def test_a_second_insert_of_a_shape_reuses_its_statement_with_its_own_values(monkeypatch):
    compiled = []
    as_sql = SQLInsertCompiler.as_sql
    monkeypatch.setattr(insert_sql, "_statements", {})
    monkeypatch.setattr(
        SQLInsertCompiler,
        "as_sql",
        lambda self: compiled.append(self.query.model) or as_sql(self),
    )
    first, second = _rows(), _rows()
    second[0].amount, second[0].metadata = Decimal("56.78"), {"order": "8"}
    second[2].payload = {"a": 2}

    rows_insert(list(first))
    rows_insert(list(second))

    assert compiled == [Payment, LedgerEntry, PaymentEvent, OutboxMessage]
    stored = Payment.objects.get(pk=second[0].id)
    assert (stored.amount, stored.metadata) == (Decimal("56.78"), {"order": "8"})
    assert stored.created_at == second[0].created_at != first[0].created_at
    assert PaymentEvent.objects.get(pk=second[2].pk).payload == {"a": 2}
    assert OutboxMessage.objects.get(pk=second[3].pk).group_id == str(second[0].id)


def test_a_database_default_a_value_and_an_expression_each_get_their_statement(monkeypatch):
    monkeypatch.setattr(insert_sql, "_statements", {})
    moment = timezone.now() - timedelta(days=3)
    given, defaulted, expressed = (
        AccountBlock(
            merchant_id="m-insert",
            account_token=f"tok_insert_000{n}",
            scope=AccountBlockScope.MERCHANT,
            reason="R10",
            **opened,
        )
        for n, opened in enumerate(({"opened_at": moment}, {}, {"opened_at": Now()}))
    )

    for row in (given, defaulted, expressed, given.__class__(**_fields_of(defaulted, 4))):
        rows_insert([row])

    opened = dict(AccountBlock.objects.values_list("account_token", "opened_at"))
    assert opened["tok_insert_0000"] == moment
    # The database's own moment (its default, its statement's time), never the value given.
    for token in ("tok_insert_0001", "tok_insert_0002", "tok_insert_0004"):
        assert timezone.now() - timedelta(minutes=5) < opened[token] <= timezone.now()
    # A value, a default: two statements kept; an expression is compiled per row.
    assert len(insert_sql._statements) == 2


def _fields_of(block: AccountBlock, n: int) -> dict:
    return {
        "merchant_id": block.merchant_id,
        "account_token": f"tok_insert_000{n}",
        "scope": block.scope,
        "reason": block.reason,
    }
