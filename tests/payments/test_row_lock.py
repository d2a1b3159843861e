"""The payment's row lock every service takes (``payments.services.writes.payment_lock``): on
the event path the ORM's own statement, compiled once (``payments.event_sql``). The races in
test_services.py show it waits on a held lock; these show it returns exactly what the ORM would
and refuses an unknown payment with one exception, whichever way the row is read."""

import uuid

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from payments import event_sql
from payments.exceptions import PaymentNotFound
from payments.models import Payment
from payments.services import payment_lock, payments_lock, writes
from tests.factories import PaymentFactory, refund_held

pytestmark = pytest.mark.django_db


def test_the_precompiled_row_lock_returns_what_the_orm_returns():
    payment = PaymentFactory(state="submitted", description="naïve ✓")

    with transaction.atomic():
        with CaptureQueriesContext(connection) as statements:
            locked = payment_lock(payment.pk)
        orm = Payment.objects.select_for_update(no_key=True).get(pk=payment.pk)

    assert event_sql._lock_template(connection.vendor) is not None  # PostgreSQL's fast path
    assert len(statements) == 1
    # FOR NO KEY UPDATE: rows referring to the payment are still inserted under the lock.
    assert statements[0]["sql"].endswith("FOR NO KEY UPDATE")
    for field in Payment._meta.concrete_fields:
        mine, theirs = getattr(locked, field.attname), getattr(orm, field.attname)
        assert (mine, type(mine)) == (theirs, type(theirs)), field.name
    assert (locked._state.adding, locked._state.db) == (False, orm._state.db)


@pytest.mark.parametrize("compiled", [True, False])
def test_the_row_lock_names_a_missing_payment(compiled, monkeypatch):
    if not compiled:
        monkeypatch.setattr(event_sql, "_lock_template", lambda vendor: None)
    missing = uuid.uuid4()
    with transaction.atomic(), pytest.raises(PaymentNotFound, match=f"payment {missing} does"):
        payment_lock(missing)


@pytest.mark.parametrize("compiled", [True, False])
def test_the_row_lock_refuses_a_malformed_id_as_not_found(compiled, monkeypatch):
    if not compiled:
        monkeypatch.setattr(event_sql, "_lock_template", lambda vendor: None)
    with transaction.atomic(), pytest.raises(PaymentNotFound, match="not a valid UUID"):
        payment_lock("not-a-uuid")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("compiled", [True, False])
def test_the_row_lock_refuses_to_run_outside_a_transaction(compiled):
    """Outside a transaction the lock would end with its own statement: refused, as the ORM
    refuses it, whether or not the statement was compiled before."""
    payment = PaymentFactory()
    if compiled:
        with transaction.atomic():
            payment_lock(payment.pk)
    else:
        event_sql._lock_template.cache_clear()
    with pytest.raises(transaction.TransactionManagementError, match="needs a transaction"):
        payment_lock(payment.pk)


@pytest.mark.parametrize("count", [1, 3])
def test_the_precompiled_batch_lock_runs_the_orms_statement_and_returns_its_rows(count):
    """``payments_lock`` (a worker's batch takes it) runs the ORM's own statement, compiled
    once per number of ids with its ids put in: the same text the ORM sends, the same rows,
    in the one lock order, with the same values."""
    debits = [PaymentFactory(state="confirmed", amount="40.00") for _ in range(count)]
    refund = refund_held(debits[0], "10.00", "submitted")
    ids = [debit.pk for debit in debits]

    for _ in range(2):  # compiled on the first call, reused on the second
        with transaction.atomic():
            with CaptureQueriesContext(connection) as mine:
                locked = payments_lock(payment_ids=[*map(str, ids), "not-a-uuid"])
            with CaptureQueriesContext(connection) as orm_statements:
                orm = list(writes._payments_lock_query(sorted(ids)))

        assert [query["sql"] for query in mine] == [query["sql"] for query in orm_statements]
        assert [row.pk for row in locked] == [*sorted(ids), refund.pk]
        for mine_row, orm_row in zip(locked, orm, strict=True):
            for field in Payment._meta.concrete_fields:
                value, expected = getattr(mine_row, field.attname), getattr(orm_row, field.attname)
                assert (value, type(value)) == (expected, type(expected)), field.name
            assert (mine_row._state.adding, mine_row._state.db) == (False, orm_row._state.db)


@pytest.mark.django_db(transaction=True)
def test_the_precompiled_batch_lock_refuses_to_run_outside_a_transaction():
    payment = PaymentFactory()
    with pytest.raises(transaction.TransactionManagementError, match="needs a transaction"):
        payments_lock(payment_ids=[payment.pk])
