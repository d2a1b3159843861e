"""The database keeps history: posted ledger entries, the payment event log, the processed-event
records and the audit rows (payments, triage, bank) are refused every UPDATE, DELETE and
TRUNCATE, through the ORM and through raw SQL alike, by PostgreSQL's triggers
(``payments.history``). Allowed: a pending entry's status to posted or archived, and the
retention purge's delete of processed-event records through its one path."""

from datetime import date, timedelta
from decimal import Decimal

import pytest
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from bank.books.models import BooksVariance, VarianceExplanation, VarianceKind
from payments.history import RETENTION_SETTING, retention_delete
from payments.models import (
    ExposureLimitChange,
    LedgerEntry,
    LedgerEntryStatus,
    NocAction,
    NotificationOfChange,
    OriginatorProfile,
    OriginatorProfileChange,
    PaymentEvent,
    PaymentState,
    ProcessedEvent,
)
from payments.retention import processed_events_purge
from payments.services import payment_apply_event
from tests.factories import (
    LedgerEntryFactory,
    PaymentFactory,
    TriageActionFactory,
    UserFactory,
    processor_event,
)
from triage.models import TriageAction

pytestmark = pytest.mark.django_db

REFUSED = "keeps history, which is never rewritten"


def _settled_payment():
    payment = PaymentFactory(state=PaymentState.SUBMITTED, amount=Decimal("20.00"))
    payment_apply_event(event=processor_event(payment, "settled"))
    return payment


def _posted_entry():
    return LedgerEntry.objects.get(payment=_settled_payment(), kind="credit")


def _event_row():
    return PaymentEvent.objects.filter(payment=_settled_payment(), outcome="applied").first()


def _processed_event():
    return ProcessedEvent.objects.get(payment=_settled_payment())


def _noc_action():
    payment = PaymentFactory(state=PaymentState.CONFIRMED)
    payment_apply_event(
        event=processor_event(
            payment,
            "notification_of_change",
            change_code="C02",
            corrected_data={"routing_number_last4": "0021"},
        )
    )
    noc = NotificationOfChange.objects.get(payment=payment)
    return NocAction.objects.create(
        noc=noc, user=UserFactory(), note="applied", status_before="open", status_after="applied"
    )


def _triage_action():
    return TriageActionFactory()


def _explanation():
    variance = BooksVariance.objects.create(
        key="missing_settlement:history",
        day=date(2026, 12, 1),
        kind=VarianceKind.MISSING_SETTLEMENT,
        currency="USD",
        expected_amount="10.00",
        summary="batch not settled",
    )
    return VarianceExplanation.objects.create(
        variance=variance, explained_by=UserFactory(), note="bank fee"
    )


def _limit_change():
    return ExposureLimitChange.objects.create(
        merchant_id="acme",
        direction="debit",
        currency="USD",
        changed_by=UserFactory(),
        old={},
        new={"daily": "100.00"},
        note="set after onboarding",
    )


def _profile_change():
    profile = OriginatorProfile.objects.create(
        merchant_id="acme",
        company_name="ACME WIDGETS",
        company_identification="A000000001",
        allowed_sec_codes=["PPD"],
    )
    return OriginatorProfileChange.objects.create(
        profile=profile,
        merchant_id="acme",
        user=UserFactory(),
        changes={"company_name": [None, "ACME WIDGETS"]},
    )


# The row, and a field an update might change (through the ORM).
GUARDED = {
    "posted ledger entry": (_posted_entry, {"amount": Decimal("999.00")}),
    "payment event log": (_event_row, {"to_state": "failed"}),
    "processed-event record": (_processed_event, {"processed_at": timezone.now()}),
    "NOC audit row": (_noc_action, {"note": "rewritten"}),
    "triage audit row": (_triage_action, {"note": "rewritten"}),
    "books audit row": (_explanation, {"note": "rewritten"}),
    "exposure limit audit row": (_limit_change, {"note": "rewritten"}),
    "originator profile audit row": (_profile_change, {"changes": {"rewritten": [1, 2]}}),
}


def _refused(write) -> str:
    with pytest.raises(DatabaseError) as caught:
        with transaction.atomic():
            write()
    return str(caught.value)


def _table(row) -> str:
    return connection.ops.quote_name(row._meta.db_table)


@pytest.mark.parametrize("name", GUARDED)
def test_an_update_through_the_orm_is_refused(name):
    make, change = GUARDED[name]
    row = make()
    model = type(row)

    assert REFUSED in _refused(lambda: model.objects.filter(pk=row.pk).update(**change))
    for field, value in change.items():
        setattr(row, field, value)
    assert REFUSED in _refused(row.save)
    row.refresh_from_db()
    assert all(getattr(row, field) != value for field, value in change.items())


@pytest.mark.parametrize("name", GUARDED)
def test_a_delete_through_the_orm_is_refused(name):
    row = GUARDED[name][0]()
    model = type(row)

    assert REFUSED in _refused(lambda: model.objects.filter(pk=row.pk).delete())
    assert REFUSED in _refused(row.delete)
    assert model.objects.filter(pk=row.pk).exists()


@pytest.mark.parametrize("name", GUARDED)
@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE {table} SET {pk} = {pk} WHERE {pk} = %s",  # even a write that changes nothing
        "DELETE FROM {table} WHERE {pk} = %s",
        "TRUNCATE {table} CASCADE",
    ],
)
def test_a_write_in_raw_sql_is_refused(name, statement):
    row = GUARDED[name][0]()
    pk = connection.ops.quote_name(row._meta.pk.column)
    sql = statement.format(table=_table(row), pk=pk)

    def write():
        with connection.cursor() as cursor:
            # The foreign keys' checks of the rows just written, now: a TRUNCATE waits for
            # none pending (as in a console session, where those rows are long committed).
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
            cursor.execute(sql, [row.pk] if "%s" in sql else None)

    message = _refused(write)
    assert REFUSED in message and row._meta.db_table in message
    assert type(row).objects.filter(pk=row.pk).exists()


@pytest.mark.parametrize("status", [LedgerEntryStatus.POSTED, LedgerEntryStatus.ARCHIVED])
def test_a_pending_entry_moves_to_posted_or_archived_and_then_stays(status):
    entry = LedgerEntryFactory(status=LedgerEntryStatus.PENDING, kind="refund", amount=-5)
    posted_at = timezone.now() if status == LedgerEntryStatus.POSTED else None

    LedgerEntry.objects.filter(pk=entry.pk).update(status=status, posted_at=posted_at)

    entry.refresh_from_db()
    assert entry.status == status
    # Once moved, it is history: no status back, no other move, no delete.
    for other in LedgerEntryStatus.values:
        assert REFUSED in _refused(
            lambda other=other: LedgerEntry.objects.filter(pk=entry.pk).update(status=other)
        )
    assert REFUSED in _refused(lambda: LedgerEntry.objects.filter(pk=entry.pk).delete())


@pytest.mark.parametrize(
    "change",
    [
        {"amount": Decimal("-6.00")},
        {"merchant_id": "another-merchant"},
        {"kind": "payout"},
        {"currency": "EUR"},
        {"status": LedgerEntryStatus.PENDING, "amount": Decimal("-6.00")},
    ],
)
def test_a_pending_entry_is_refused_every_other_change(change):
    entry = LedgerEntryFactory(status=LedgerEntryStatus.PENDING, kind="refund", amount=-5)

    with_status = {"status": LedgerEntryStatus.POSTED, **change}
    assert REFUSED in _refused(
        lambda: LedgerEntry.objects.filter(pk=entry.pk).update(**with_status)
    )
    assert REFUSED in _refused(lambda: LedgerEntry.objects.filter(pk=entry.pk).delete())


def test_the_retention_purge_deletes_old_processed_events_through_its_one_path():
    old, new = _processed_event(), _processed_event()
    with connection.cursor() as cursor:  # a month old, as only maintenance can make it
        cursor.execute("SET LOCAL session_replication_role = replica")
        ProcessedEvent.objects.filter(pk=old.pk).update(
            processed_at=timezone.now() - timedelta(days=31)
        )
        cursor.execute("SET LOCAL session_replication_role = DEFAULT")

    assert processed_events_purge() == 1

    assert list(ProcessedEvent.objects.values_list("pk", flat=True)) == [new.pk]


def test_the_retention_path_opens_no_other_history_and_closes_behind_it():
    record, entry, event = _processed_event(), _posted_entry(), _event_row()

    with transaction.atomic(), retention_delete():
        assert REFUSED in _refused(lambda: LedgerEntry.objects.filter(pk=entry.pk).delete())
        assert REFUSED in _refused(lambda: PaymentEvent.objects.filter(pk=event.pk).delete())
        assert REFUSED in _refused(
            lambda: ProcessedEvent.objects.filter(pk=record.pk).update(outcome="stale")
        )
        ProcessedEvent.objects.filter(pk=record.pk).delete()
    assert not ProcessedEvent.objects.filter(pk=record.pk).exists()
    # After the block, the same transaction deletes nothing more.
    other = _processed_event()
    with transaction.atomic():
        with retention_delete():
            pass
        assert REFUSED in _refused(lambda: ProcessedEvent.objects.filter(pk=other.pk).delete())
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting(%s, true)", [RETENTION_SETTING])
        assert cursor.fetchone()[0] in (None, "", "off")


def test_triage_audit_rows_are_only_ever_added():
    first = _triage_action()
    TriageActionFactory(dead_letter=first.dead_letter)

    assert TriageAction.objects.filter(dead_letter=first.dead_letter).count() == 2
    assert REFUSED in _refused(lambda: TriageAction.objects.all().delete())
