"""Migration 0020 seals the NACHA files stored in the clear before it drops the clear columns,
refuses to run without a vault key, and goes back by opening them again."""

import hashlib
from datetime import UTC, date, datetime

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from bank.nacha.models import NachaFile, NachaInboundFile
from tests import database_snapshots

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("payments", "0019_nacha_file_delivery_conflict_at")]
SEALED = [("payments", "0020_nacha_file_content_sealed")]
NUMBER = "987654321098"
OUTBOUND = f"101 021000021 1234567890 entry of account {NUMBER}\n"
INBOUND = f"a return naming the DFI account {NUMBER}\n".encode()


def _migrate(targets):
    executor = MigrationExecutor(connection)
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


@pytest.fixture(scope="module")
def before_sealing(django_db_setup, django_db_blocker):
    """The test database taken back to 0019 once for the module, and copied there
    (``tests.database_snapshots``), beside a copy of it at the newest schema; the historical
    models of 0019."""
    with database_snapshots.taken_back(
        django_db_blocker, "before_sealing", lambda: _migrate(BEFORE)
    ) as taken:
        yield taken


@pytest.fixture
def clear_files(before_sealing):
    """Files stored as they were before 0020 (the schema of 0019, without a row of its own), the
    database put back to the newest schema after, whatever state a test left."""
    before, newest, apps = before_sealing
    database_snapshots.restore(before)
    try:
        outbound = apps.get_model("payments", "NachaFile").objects.create(
            window_name="next_day",
            bank_cutoff_at=datetime(2026, 12, 1, 1, 0, tzinfo=UTC),
            effective_entry_date=date(2026, 12, 2),
            creation_date=date(2026, 12, 1),
            file_id_modifier="A",
            name="20261201-A-next_day.ach",
            content=OUTBOUND,
            sha256=hashlib.sha256(OUTBOUND.encode()).hexdigest(),
            entry_count=1,
            total_debit_cents=2500,
        )
        inbound = apps.get_model("payments", "NachaInboundFile").objects.create(
            name="returns.ach",
            sha256=hashlib.sha256(INBOUND).hexdigest(),
            content=INBOUND,
            status="imported",
        )
        yield outbound.pk, inbound.pk
    finally:
        database_snapshots.restore(newest)


def _raw(table: str) -> bytes:
    """Every value of every row, text and binary alike, as bytes."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT * FROM {table}")  # noqa: S608 - a table name of ours
        rows = cursor.fetchall()
    return b"|".join(
        bytes(value) if isinstance(value, memoryview | bytes) else str(value).encode()
        for row in rows
        for value in row
    )


def test_existing_files_are_sealed_and_open_to_their_bytes(clear_files, nacha_settings):
    outbound_pk, inbound_pk = clear_files

    _migrate(SEALED)

    assert NachaFile.objects.get(pk=outbound_pk).content_bytes() == OUTBOUND.encode()
    assert NachaInboundFile.objects.get(pk=inbound_pk).content_bytes() == INBOUND
    for table in ("payments_nachafile", "payments_nachainboundfile"):
        assert NUMBER.encode() not in _raw(table)


def test_going_back_opens_the_files_into_their_clear_columns(clear_files, nacha_settings):
    outbound_pk, inbound_pk = clear_files
    _migrate(SEALED)

    apps = _migrate(BEFORE)

    assert apps.get_model("payments", "NachaFile").objects.get(pk=outbound_pk).content == OUTBOUND
    inbound = apps.get_model("payments", "NachaInboundFile").objects.get(pk=inbound_pk)
    assert bytes(inbound.content) == INBOUND


def test_files_and_no_vault_key_refuse_the_migration_and_change_nothing(
    clear_files, module_settings
):
    module_settings.VAULT_ACTIVE_KEY = ""

    with pytest.raises(ImproperlyConfigured, match=r"BANK\['VAULT_ACTIVE_KEY'\]"):
        _migrate(SEALED)

    with connection.cursor() as cursor:
        cursor.execute("SELECT content FROM payments_nachafile")
        assert cursor.fetchall() == [(OUTBOUND,)]
