"""A bad file is in front of a human: a delivery conflict (other bytes at the bank under our
file's name) and a refused bank file each raise one high alert through ``alert_raise``, keyed
by the file's name, never carrying an account number; the same file met again raises nothing
more."""

import json
import os
from datetime import datetime

import pytest

from bank.collect import nacha_files_collect
from bank.nacha.inbound import nacha_inbound_store
from bank.nacha.models import NachaFile, NachaInboundFile
from bank.nacha.services import (
    nacha_entry_add,
    nacha_file_cut,
    nacha_file_deliver,
    nacha_send_due,
)
from bank.nacha.transports import DeliveryConflict, DirectoryTransport
from bank.nacha.windows import EASTERN
from payments.signals import alert_raised
from tests.bank.nacha.conftest import join, read_file, records
from tests.bank.nacha.test_file_cut import resolve
from tests.factories import PaymentFactory
from triage.models import Alert

# Triage stores an alert after the caller's commit: real transactions.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("sealing_key")]
EVENING = datetime(2026, 12, 1, 20, 0, tzinfo=EASTERN)


@pytest.fixture
def raised():
    """Every alert_raise of the test, as its receivers get it."""
    calls = []

    def receiver(sender, **kwargs):
        calls.append(kwargs)

    alert_raised.connect(receiver, dispatch_uid="test_nacha_alerts")
    yield calls
    alert_raised.disconnect(dispatch_uid="test_nacha_alerts")


@pytest.fixture
def directory(tmp_path):
    transport = DirectoryTransport(outbound=str(tmp_path / "out"), inbound=str(tmp_path / "in"))
    os.makedirs(transport.inbound)
    os.makedirs(transport.outbound)
    return transport


def _cut() -> NachaFile:
    for _ in range(2):
        nacha_entry_add(payment_id=PaymentFactory().pk)
    return nacha_file_cut(now=EVENING, resolve_account=resolve).file


# --- Delivery conflicts -----------------------------------------------------------------------


def test_a_delivery_conflict_raises_one_high_alert_naming_the_file(
    nacha_settings, directory, raised
):
    cut = _cut()
    other = cut.content_bytes().replace(b"55500", b"55599")  # another file under the name
    (directory.outbound / cut.name).write_bytes(other)

    for _ in range(3):  # three rounds meet the same conflict
        with pytest.raises(DeliveryConflict):
            nacha_file_deliver(file_id=cut.pk, transport=directory)

    assert [(r["key"], r["severity"]) for r in raised] == [
        (f"nacha.delivery_conflict:{cut.name}", "high")
    ]
    [alert] = Alert.objects.filter(key=f"nacha.delivery_conflict:{cut.name}")
    assert alert.severity == "high" and alert.status == "firing"
    assert cut.name in alert.summary and "2 entries wait" in alert.summary
    assert alert.details == {
        "file": cut.name,
        "file_id": str(cut.pk),
        "sha256": cut.sha256,
        "entries": 2,
        "window": cut.window_name,
        "occurrences": 1,  # triage's count of firings
    }
    stored = NachaFile.objects.get(pk=cut.pk)
    assert stored.delivery_conflict_at is not None and stored.delivered_at is None
    # The bank's copy is left as it was, and no account number reaches the alert.
    assert (directory.outbound / cut.name).read_bytes() == other
    text = alert.summary + json.dumps(alert.details)
    assert "55500" not in text and "55599" not in text and "011000015" not in text


def test_the_conflict_alert_is_resolved_once_the_file_is_delivered(
    nacha_settings, directory, raised
):
    cut = _cut()
    (directory.outbound / cut.name).write_bytes(b"someone else's file")
    with pytest.raises(DeliveryConflict):
        nacha_file_deliver(file_id=cut.pk, transport=directory)
    (directory.outbound / cut.name).unlink()  # a human cleared the bank's drop

    delivered = nacha_file_deliver(file_id=cut.pk, transport=directory)

    assert delivered.delivered_at is not None
    alert = Alert.objects.get(key=f"nacha.delivery_conflict:{cut.name}")
    assert alert.status == "resolved" and alert.resolved_at is not None
    assert len(raised) == 1


def test_a_delivery_without_a_conflict_raises_nothing(nacha_settings, directory, raised):
    cut = _cut()
    nacha_file_deliver(file_id=cut.pk, transport=directory)
    nacha_file_deliver(file_id=cut.pk, transport=directory)
    assert raised == [] and not Alert.objects.filter(key__startswith="nacha.").exists()
    assert NachaFile.objects.get(pk=cut.pk).delivery_conflict_at is None


def test_the_send_round_raises_the_conflict_alert_once_across_rounds(
    nacha_settings, directory, raised
):
    cut = _cut()
    (directory.outbound / cut.name).write_bytes(b"x")
    for _ in range(2):
        with pytest.raises(DeliveryConflict):
            nacha_send_due(now=EVENING, transport=directory, resolve_account=resolve, lead=None)
    assert [r["key"] for r in raised] == [f"nacha.delivery_conflict:{cut.name}"]


# --- Refused bank files -----------------------------------------------------------------------


def _broken() -> bytes:
    """The PPD fixture (account numbers in its entries) with a batch control that miscounts."""
    lines = records("ppd-debit.ach")
    lines[5] = lines[5][:4] + "000009" + lines[5][10:]  # the batch control's entry count
    return join(lines)


def test_a_refused_bank_file_raises_one_high_alert_naming_the_file_and_record(raised):
    broken = _broken()
    first = nacha_inbound_store(name="returns-0301.ach", content=broken)
    again = nacha_inbound_store(name="returns-0301.ach", content=broken)

    assert first.created and not again.created and again.file.pk == first.file.pk
    sha = first.file.sha256
    key = f"nacha.inbound_refused:returns-0301.ach:{sha[:12]}"
    assert [(r["key"], r["severity"]) for r in raised] == [(key, "high")]
    alert = Alert.objects.get(key=key)
    assert alert.summary.startswith(
        "bank file returns-0301.ach refused whole at record 6: batch control entry/addenda "
        "count says 9, the batch holds 3."
    )
    assert alert.details == {
        "file": "returns-0301.ach",
        "inbound_file_id": first.file.pk,
        "sha256": sha,
        "record": 6,
        "reason": "batch control entry/addenda count says 9, the batch holds 3",
        "occurrences": 1,
    }
    text = alert.summary + json.dumps(alert.details)
    assert "12345678901" in broken.decode() and "12345678901" not in text


def test_a_refusal_of_a_bad_account_field_carries_no_account_number(raised):
    lines = records("ppd-debit.ach")
    lines[2] = lines[2][:29] + "12345678XY" + lines[2][39:]  # the amount, with letters
    nacha_inbound_store(name="bad-amount.ach", content=join(lines))
    [call] = raised
    text = call["summary"] + json.dumps(call["details"])
    assert "at record 3: " in text
    assert "entry detail amount (columns 30-39) must be digits" in text
    assert "12345678" not in text


def test_another_refused_file_under_the_same_name_is_another_alert(raised):
    nacha_inbound_store(name="returns.ach", content=_broken())
    lines = records("ppd-debit.ach")
    lines[0] = lines[0][:33] + "a" + lines[0][34:]
    nacha_inbound_store(name="returns.ach", content=join(lines))
    keys = [r["key"] for r in raised]
    assert len(keys) == 2 and len(set(keys)) == 2
    assert all(k.startswith("nacha.inbound_refused:returns.ach:") for k in keys)
    assert Alert.objects.filter(key__startswith="nacha.inbound_refused:").count() == 2


def test_a_good_bank_file_raises_nothing(raised):
    result = nacha_inbound_store(name="returns.ach", content=read_file("returns.ach"))
    assert result.file.status == "imported"
    assert raised == []


def test_collecting_the_same_refused_file_again_raises_nothing_more(directory, raised):
    broken = _broken()
    (directory.inbound / "junk.ach").write_bytes(broken)
    first = nacha_files_collect(transport=directory, min_age_seconds=0)
    (directory.inbound / "junk.ach").write_bytes(broken)  # the bank puts it back
    second = nacha_files_collect(transport=directory, min_age_seconds=0)

    assert first.refused == ["junk.ach"] and second.seen_before == ["junk.ach"]
    assert [r["key"] for r in raised] == [
        f"nacha.inbound_refused:junk.ach:{NachaInboundFile.objects.get().sha256[:12]}"
    ]
