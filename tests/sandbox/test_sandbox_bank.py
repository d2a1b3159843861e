"""The sandbox as a bank: the files we deliver are answered by its rules, each once."""

from datetime import datetime
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from bank.nacha.originator import parse_originator
from bank.nacha.parser import parse_nacha
from bank.nacha.windows import EASTERN
from bank.nacha.writer import FileEntry, nacha_file_write
from sandbox.bank import bank_answer_files
from tests.bank.nacha.conftest import ORIGINATOR_SETTING

NAMES = [
    "NSF Pat",
    "Unauth Lee",
    "Closed Kim",
    "NOC Sam",
    "NOCSAVINGS Ana",
    "Paying Joe",
    "Questionable Max",
]


def _our_file() -> bytes:
    entries = [
        FileEntry(
            trace_number=f"02100002{n:07d}",
            sec_code="PPD",
            account_type="checking",
            routing_number="011000015",
            account_number=f"4455{n:04d}",
            amount_cents=1000 + n,
            identification=f"p{n}",
            receiver_name=name,
        )
        for n, name in enumerate(NAMES, start=1)
    ]
    return nacha_file_write(
        originator=parse_originator(ORIGINATOR_SETTING),
        entries=entries,
        effective_entry_date=datetime(2026, 12, 2).date(),
        created_at=datetime(2026, 12, 1, 20, tzinfo=EASTERN),
        file_id_modifier="A",
    )


def test_each_rule_answers_its_code_and_a_paying_customer_gets_no_answer(tmp_path):
    out, inbound = tmp_path / "out", tmp_path / "in"
    out.mkdir()
    (out / "20261201-A-next_day.ach").write_bytes(_our_file())
    [name] = bank_answer_files(outbound=str(out), inbound=str(inbound))
    answers = list(parse_nacha((inbound / name).read_bytes()).entries())
    codes = {
        a.return_addenda["original_entry_trace_number"]: a.return_addenda.text(
            "change_code" if a.return_addenda["addenda_type_code"] == "98" else "return_reason_code"
        )
        for a in answers
    }
    assert codes == {
        "021000020000001": "R01",
        "021000020000002": "R10",
        "021000020000003": "R02",
        "021000020000004": "C01",
        "021000020000005": "C05",
        "021000020000007": "R17",
    }
    [questionable] = [
        a for a in answers if a.return_addenda["original_entry_trace_number"] == "021000020000007"
    ]
    # The word the module reads to block the account for every merchant.
    assert questionable.return_addenda.text("addenda_information") == "QUESTIONABLE"
    [noc] = [
        a for a in answers if a.return_addenda["original_entry_trace_number"] == "021000020000004"
    ]
    assert noc.return_addenda.text("corrected_data") == "44550004"[::-1]
    assert sorted(p.name for p in out.iterdir()) == ["answered"]
    assert bank_answer_files(outbound=str(out), inbound=str(inbound)) == []


def test_the_command_needs_a_directory_transport(module_settings, tmp_path):
    module_settings.NACHA_TRANSPORT = None
    with pytest.raises(CommandError, match="directory"):
        call_command("sandbox_bank")
    module_settings.NACHA_TRANSPORT = {
        "kind": "directory",
        "outbound": str(tmp_path / "o"),
        "inbound": str(tmp_path / "i"),
    }
    out = StringIO()
    call_command("sandbox_bank", stdout=out)
    assert "wrote 0 answer files" in out.getvalue()


def test_only_the_files_named_are_answered_at_the_banks_clock(tmp_path):
    out, inbound = tmp_path / "out", tmp_path / "in"
    out.mkdir()
    for name in ("20261201-A-next_day.ach", "20261201-B-next_day.ach"):
        (out / name).write_bytes(_our_file())
    morning = datetime(2026, 12, 3, 9, 0, tzinfo=EASTERN)

    [name] = bank_answer_files(
        outbound=str(out), inbound=str(inbound), now=morning, only={"20261201-B-next_day.ach"}
    )

    assert name == "answers-20261201-B-next_day.ach"
    header = parse_nacha((inbound / name).read_bytes()).header
    assert (header["file_creation_date"], header["file_creation_time"]) == ("261203", "0900")
    assert sorted(p.name for p in out.iterdir()) == ["20261201-A-next_day.ach", "answered"]


def test_a_credit_to_an_account_it_cannot_find_is_returned_r03_as_a_credits_return(tmp_path):
    credits = [
        FileEntry(
            trace_number=f"02100002{n:07d}",
            sec_code="PPD",
            account_type=kind,
            routing_number="011000015",
            account_number=f"7788{n:04d}",
            amount_cents=500 + n,
            identification=f"r{n}",
            receiver_name=name,
            direction="credit",
            description="REFUND",
        )
        for n, (name, kind) in enumerate(
            [
                ("NOACCOUNT Max", "checking"),
                ("NOACCOUNT Eve", "savings"),
                ("Paid Back", "checking"),
            ],
            start=1,
        )
    ]
    out, inbound = tmp_path / "out", tmp_path / "in"
    out.mkdir()
    (out / "20261201-A-next_day.ach").write_bytes(
        nacha_file_write(
            originator=parse_originator(ORIGINATOR_SETTING),
            entries=credits,
            effective_entry_date=datetime(2026, 12, 2).date(),
            created_at=datetime(2026, 12, 1, 20, tzinfo=EASTERN),
            file_id_modifier="A",
        )
    )

    [name] = bank_answer_files(outbound=str(out), inbound=str(inbound))

    parsed = parse_nacha((inbound / name).read_bytes())
    assert [
        (
            a.return_addenda["original_entry_trace_number"],
            a.return_addenda.text("return_reason_code"),
            a.transaction_code,
            a.amount_cents,
        )
        for a in parsed.entries()
    ] == [("021000020000001", "R03", 21, 501), ("021000020000002", "R03", 31, 502)]
    assert parsed.control.integer("total_credit_amount") == 1003
    assert parsed.control.integer("total_debit_amount") == 0
