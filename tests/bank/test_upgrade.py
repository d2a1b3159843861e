"""An installation of 0.1.0, whose bank-path rows were the payments app's, upgrades to the bank
app without losing a row, a link or a permission: migrations ``payments.0029`` and ``bank.0001``
move only Django's state and the content types; the tables and every row stay where they are.

The database is taken back to 0.1.0's last migration, filled through the models as 0.1.0 had
them (``payments.NachaFile``...), then migrated to the newest schema and read back through the
bank app's models."""

from datetime import UTC, date, datetime
from decimal import Decimal

import pytest
from django.contrib.auth.models import Group, Permission
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from bank.books.models import BankStatement, BooksVariance, StatementDay
from bank.nacha.models import (
    NachaEntry,
    NachaFile,
    NachaInboundEvent,
    NachaInboundFile,
    NachaTraceCounter,
)
from bank.vault.models import VaultAccount
from payments.models import PaymentEvent
from tests import database_snapshots
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db(transaction=True)

RELEASED = [("payments", "0028_refund_hold"), ("bank", None)]
SEALED = {"key_version": "k1", "wrapped_key": b"\x01" * 40, "nonce": b"\x02" * 12}
MOVED = {
    "bankstatement",
    "booksvariance",
    "nachaentry",
    "nachafile",
    "nachainboundevent",
    "nachainboundfile",
    "nachatracecounter",
    "statementday",
    "statementline",
    "statementmatch",
    "varianceexplanation",
    "vaultaccount",
}
# The bank app's models made after 0.1.0: their content types are new, made once.
ADDED_SINCE = {"nachaprenote"}


def _migrate(targets):
    executor = MigrationExecutor(connection)
    executor.migrate(targets)
    return executor.loader.project_state([t for t in targets if t[1] is not None]).apps


@pytest.fixture(scope="module")
def release(django_db_setup, django_db_blocker):
    """The test database taken back to 0.1.0 once for the module, and copied there
    (``tests.database_snapshots``), beside a copy of it at the newest schema; 0.1.0's historical
    models."""
    with database_snapshots.taken_back(
        django_db_blocker, "released", lambda: _migrate(RELEASED)
    ) as taken:
        yield taken


@pytest.fixture
def released(release):
    """The historical models of 0.1.0, on a database at its schema without a row of its own;
    the newest schema again afterwards, whatever happened."""
    released, newest, apps = release
    database_snapshots.restore(released)
    try:
        yield apps
    finally:
        database_snapshots.restore(newest)


def _fill(apps) -> dict:
    """What a bank-direct installation of 0.1.0 holds: payments and their events, a vault
    account, a file cut with an entry, a return file imported into an event, a statement and a
    variance naming the file and the payment, and a person allowed to explain variances."""
    old = lambda name: apps.get_model("payments", name)  # noqa: E731 - a short alias
    # Through 0.1.0's own models: today's would write columns its schema does not have yet.
    payment = old_payment = old("Payment").objects.create(
        merchant_id="merchant-1",
        amount=Decimal("25.00"),
        currency="USD",
        source_token="tok_upgrade_0001",
        state="submitted",
    )
    old("PaymentEvent").objects.create(
        payment=old_payment, kind="processor_event", outcome="applied", event_type="submitted"
    )
    other = old_other = old("Payment").objects.create(
        merchant_id="merchant-2",
        amount=Decimal("125.00"),
        currency="USD",
        source_token="tok_upgrade_0002",
        state="confirmed",
    )

    vault = old("VaultAccount").objects.create(
        token="vtok_upgrade",
        merchant_id=payment.merchant_id,
        account_type="checking",
        sec_code="PPD",
        account_last4="6789",
        ciphertext=b"sealed account",
        **SEALED,
    )
    old("NachaTraceCounter").objects.create(odfi_identification="02100002", last_sequence=7)
    nacha_file = old("NachaFile").objects.create(
        window_name="next_day",
        bank_cutoff_at=datetime(2026, 12, 1, 6, 45, tzinfo=UTC),
        effective_entry_date=date(2026, 12, 2),
        creation_date=date(2026, 12, 1),
        file_id_modifier="A",
        name="20261201-A-next_day.ach",
        sha256="a" * 64,
        entry_count=1,
        total_debit_cents=2500,
        ciphertext=b"sealed file",
        **SEALED,
    )
    entry = old("NachaEntry").objects.create(
        payment=old_payment, trace_number="021000020000007", file=nacha_file, sec_code="PPD"
    )
    inbound = old("NachaInboundFile").objects.create(
        name="returns.ach",
        sha256="b" * 64,
        status="imported",
        entry_count=1,
        ciphertext=b"sealed return file",
        **SEALED,
    )
    event = old("NachaInboundEvent").objects.create(
        file=inbound,
        record_number=3,
        original_trace_number="021000020000007",
        code="R01",
        event_type="returned",
        payment=old_other,
        deduplication_id="ach.021000020000007.R01",
        event={"type": "returned", "return_code": "R01"},
    )
    statement = old("BankStatement").objects.create(
        name="statement.bai", sha256="c" * 64, status="imported", ciphertext=b"s", **SEALED
    )
    old("StatementDay").objects.create(
        statement=statement, account_last4="4321", currency="USD", as_of_date=date(2026, 12, 2)
    )
    variance = old("BooksVariance").objects.create(
        key="batch-amount:20261201-A-next_day.ach:PPD",
        day=date(2026, 12, 2),
        kind="short_amount",
        status="open",
        currency="USD",
        nacha_file=nacha_file,
        summary="the bank settled 24.00 for a batch of 25.00",
    )
    variance.payments.add(old_payment)

    explain = apps.get_model("auth", "Permission").objects.get(
        content_type__app_label="payments", codename="explain_variance"
    )
    group = apps.get_model("auth", "Group").objects.create(name="books")
    group.permissions.add(explain)
    person = UserFactory()
    person.groups.add(group.pk)
    return {
        "payment": payment.pk,
        "other": other.pk,
        "vault": vault.pk,
        "file": nacha_file.pk,
        "entry": entry.pk,
        "inbound": inbound.pk,
        "event": event.pk,
        "statement": statement.pk,
        "variance": variance.pk,
        "person": person,
    }


def test_every_row_and_link_of_0_1_0_is_read_by_the_bank_app_after_the_upgrade(released):
    rows = _fill(released)
    tables = {
        table: _count(table)
        for table in ("payments_nachafile", "payments_vaultaccount", "payments_booksvariance")
    }

    _migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())

    assert {table: _count(table) for table in tables} == tables
    assert VaultAccount.objects.get(pk=rows["vault"]).token == "vtok_upgrade"
    assert bytes(VaultAccount.objects.get(pk=rows["vault"]).ciphertext) == b"sealed account"
    assert NachaTraceCounter.objects.get(odfi_identification="02100002").last_sequence == 7
    nacha_file = NachaFile.objects.get(pk=rows["file"])
    assert (nacha_file.name, nacha_file.total_debit_cents) == ("20261201-A-next_day.ach", 2500)
    entry = NachaEntry.objects.select_related("payment", "file").get(pk=rows["entry"])
    assert (entry.payment.pk, entry.file.pk) == (rows["payment"], rows["file"])
    event = NachaInboundEvent.objects.get(pk=rows["event"])
    assert (event.file_id, event.payment_id) == (rows["inbound"], rows["other"])
    assert event.event == {"type": "returned", "return_code": "R01"}
    assert NachaInboundFile.objects.get(pk=rows["inbound"]).status == "imported"
    assert StatementDay.objects.get(statement_id=rows["statement"]).account_last4 == "4321"
    assert BankStatement.objects.count() == 1
    variance = BooksVariance.objects.get(pk=rows["variance"])
    assert variance.nacha_file_id == rows["file"]
    assert list(variance.payments.values_list("pk", flat=True)) == [rows["payment"]]
    assert PaymentEvent.objects.filter(payment_id=rows["payment"]).count() == 1


def test_permissions_granted_under_0_1_0_still_hold_and_name_the_bank_app(released):
    rows = _fill(released)

    _migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())

    person = type(rows["person"]).objects.get(pk=rows["person"].pk)
    assert person.has_perm("bank.explain_variance")
    assert Group.objects.get(name="books").permissions.get().content_type.app_label == "bank"
    # Every moved model's content type changed app; none was made twice.
    assert not ContentType.objects.filter(app_label="payments", model__in=MOVED).exists()
    assert (
        set(ContentType.objects.filter(app_label="bank").values_list("model", flat=True))
        == MOVED | ADDED_SINCE
    )
    assert Permission.objects.filter(codename="explain_variance").count() == 1


def test_the_upgrade_goes_back_to_0_1_0_with_its_rows(released):
    rows = _fill(released)
    _migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())

    apps = _migrate(RELEASED)

    old_file = apps.get_model("payments", "NachaFile").objects.get(pk=rows["file"])
    assert old_file.name == "20261201-A-next_day.ach"
    assert ContentType.objects.filter(app_label="payments", model="booksvariance").exists()


def _count(table: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {table}")  # noqa: S608 - a table name of ours
        return cursor.fetchone()[0]
