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
from payments.services import payment_lock
from tests.factories import PaymentFactory

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
