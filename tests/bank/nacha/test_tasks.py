"""The bank path's rounds as beat tasks: scheduled when the host asks for them, each doing
what its command does."""

import os
import time
from datetime import datetime

import pytest

from bank import tasks as bank_tasks
from bank.nacha.models import NachaFile, NachaInboundFile
from bank.nacha.parser import parse_nacha
from bank.nacha.services import nacha_entry_add, nacha_file_cut
from bank.nacha.windows import EASTERN
from sandbox.bank_writer import BankAnswer, nacha_answer_file_write
from tests.bank.nacha.test_file_cut import resolve
from tests.factories import PaymentFactory
from triage.beat import beat_schedule

EVENING = datetime(2026, 12, 1, 20, 0, tzinfo=EASTERN)


def test_the_bank_rounds_are_scheduled_only_when_asked_for():
    plain = {entry["task"] for entry in beat_schedule(dlq_ingest_interval=60).values()}
    bank = beat_schedule(dlq_ingest_interval=60, bank_direct=True)
    assert "bank.tasks.nacha_send" not in plain
    assert bank["nacha-send"] == {
        "task": "bank.tasks.nacha_send",
        "schedule": 300.0,
        "options": {"expires": 300.0},
    }
    assert bank["nacha-collect"]["task"] == "bank.tasks.nacha_collect"


@pytest.fixture
def directory(nacha_settings, tmp_path):
    nacha_settings.NACHA_TRANSPORT = {
        "kind": "directory",
        "outbound": str(tmp_path / "out"),
        "inbound": str(tmp_path / "in"),
    }
    return tmp_path


@pytest.mark.django_db(transaction=True)
def test_the_send_task_delivers_a_file_waiting_for_delivery(directory):
    nacha_entry_add(payment_id=PaymentFactory().pk)
    cut = nacha_file_cut(now=EVENING, resolve_account=resolve).file
    assert bank_tasks.nacha_send() == 1
    assert NachaFile.objects.get(pk=cut.pk).delivered_at is not None
    assert os.listdir(directory / "out") == [cut.name]
    assert bank_tasks.nacha_send() == 0


@pytest.mark.django_db(transaction=True)
def test_the_collect_task_stores_files_older_than_a_minute_and_queues_their_events(
    directory, sqs_queues
):
    nacha_entry_add(payment_id=PaymentFactory().pk)
    cut = nacha_file_cut(now=EVENING, resolve_account=resolve).file
    [entry] = parse_nacha(cut.content_bytes()).entries()
    content = nacha_answer_file_write(
        answers=[BankAnswer(entry, "R01")],
        bank_routing_number="011000015",
        bank_name="RDFI",
        odfi_routing_number="021000021",
        odfi_name="ODFI",
        created_at=EVENING,
    )
    (directory / "in").mkdir()
    old, fresh = directory / "in" / "old.ach", directory / "in" / "fresh.ach"
    old.write_bytes(content)
    fresh.write_bytes(content)
    an_hour_ago = time.time() - 3600
    os.utime(old, (an_hour_ago, an_hour_ago))
    assert bank_tasks.nacha_collect() == 1
    assert list(NachaInboundFile.objects.values_list("name", flat=True)) == ["old.ach"]
    assert fresh.exists()  # still being written, for all we know
