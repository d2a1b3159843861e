"""The writer's files, read back by the parser, hold what was written and keep the format's
invariants: blocking to ten, entry hash, totals, one trace number per entry."""

from datetime import date, datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bank.nacha import layouts as L
from bank.nacha.originator import parse_originator
from bank.nacha.parser import parse_nacha
from bank.nacha.routing import check_digit
from bank.nacha.windows import EASTERN
from bank.nacha.writer import (
    EntryRefused,
    FileEntry,
    clean_text,
    format_record,
    nacha_file_write,
)
from tests.bank.nacha.conftest import ORIGINATOR_SETTING

ORIGINATOR = parse_originator(ORIGINATOR_SETTING)
CREATED = datetime(2026, 12, 1, 15, 30, tzinfo=EASTERN)
EFFECTIVE = date(2026, 12, 2)


def _entry(n: int, **fields) -> FileEntry:
    values = {
        "trace_number": f"02100002{n:07d}",
        "sec_code": "PPD",
        "account_type": "checking",
        "routing_number": "011000015",
        "account_number": f"98765{n:04d}",
        "amount_cents": 1000 + n,
        "identification": f"pay-{n}",
        "receiver_name": f"Customer {n}",
    } | fields
    return FileEntry(**values)


def _write(entries, **kwargs) -> bytes:
    return nacha_file_write(
        originator=ORIGINATOR,
        entries=entries,
        effective_entry_date=EFFECTIVE,
        created_at=CREATED,
        file_id_modifier="A",
        **kwargs,
    )


def test_a_written_file_reads_back_with_every_field_it_was_given():
    entries = [
        _entry(1),
        _entry(2, sec_code="CCD", account_type="savings", receiver_name="Acme Supply LLC"),
        _entry(3, sec_code="WEB", recurring=True),
        _entry(4, sec_code="WEB"),
    ]
    parsed = parse_nacha(_write(entries))
    header = parsed.header
    assert header["immediate_destination"] == " 021000021"
    assert header.text("immediate_destination_name") == "FIRST ODFI BANK"
    assert (header["file_creation_date"], header["file_creation_time"]) == ("261201", "1530")
    assert [b.header.text("standard_entry_class_code") for b in parsed.batches] == [
        "PPD",
        "CCD",
        "WEB",
    ]
    read = {e.trace_number: e for e in parsed.entries()}
    assert set(read) == {e.trace_number for e in entries}
    for written in entries:
        entry = read[written.trace_number]
        assert entry.amount_cents == written.amount_cents
        assert entry.receiving_routing_number == written.routing_number
        assert entry.record.text("dfi_account_number") == written.account_number
        assert entry.transaction_code == (37 if written.account_type == "savings" else 27)
        assert entry.batch.effective_entry_date == EFFECTIVE
        assert entry.batch.sec_code == written.sec_code
    assert read["021000020000003"].record["discretionary_data"] == "R "
    assert read["021000020000004"].record["discretionary_data"] == "S "
    assert read["021000020000002"].record.text("receiver_name") == "ACME SUPPLY LLC"


entry_lists = st.lists(
    st.builds(
        lambda n, sec, kind, routing8, cents, name, direction, description: _entry(
            n,
            sec_code=sec,
            account_type=kind,
            routing_number=routing8 + str(check_digit(routing8)),
            amount_cents=cents,
            receiver_name=name,
            direction=direction,
            description=description,
        ),
        n=st.integers(0, 9_999_999),
        sec=st.sampled_from(["PPD", "CCD", "WEB"]),
        kind=st.sampled_from(["checking", "savings"]),
        routing8=st.sampled_from(["01100001", "02100002", "12104288", "23138010", "32227458"]),
        cents=st.integers(1, 10**10 - 1),
        name=st.text(max_size=40),
        direction=st.sampled_from(["debit", "credit"]),
        description=st.sampled_from(["", "REFUND", "PAYOUT"]),
    ),
    min_size=1,
    max_size=40,
    unique_by=lambda e: e.trace_number,
)


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(entries=entry_lists)
def test_any_written_file_keeps_the_invariants_when_read_back(entries):
    data = _write(entries)
    parsed = parse_nacha(data)  # the parser checks counts, hashes, totals and blocking itself
    lines = data.decode("ascii").splitlines()
    assert len(lines) % 10 == 0 and all(len(line) == 94 for line in lines)
    assert parsed.control.integer("block_count") == len(lines) // 10
    read = list(parsed.entries())
    assert sorted(e.trace_number for e in read) == sorted(e.trace_number for e in entries)
    assert parsed.control.integer("total_debit_amount") == sum(
        e.amount_cents for e in entries if e.direction == "debit"
    )
    assert parsed.control.integer("total_credit_amount") == sum(
        e.amount_cents for e in entries if e.direction == "credit"
    )
    expected_hash = sum(int(e.routing_number[:8]) for e in entries) % 10**10
    assert parsed.control.integer("entry_hash") == expected_hash
    assert len(parsed.batches) == len({(e.sec_code, e.description) for e in entries})
    for batch in parsed.batches:
        directions = {"debit" if e.is_debit else "credit" for e in batch.entries}
        expected_class = {"debit": "225", "credit": "220"}.get(directions.pop(), "200")
        assert batch.header["service_class_code"] == (expected_class if not directions else "200")


def test_credits_are_written_in_batches_of_their_own_description_with_credit_codes_and_totals():
    entries = [
        _entry(1, amount_cents=5000),
        _entry(2, direction="credit", description="REFUND", amount_cents=1500),
        _entry(3, direction="credit", description="REFUND", account_type="savings"),
        _entry(4, direction="credit", description="PAYOUT", amount_cents=250_00),
        _entry(5, sec_code="CCD", direction="credit", description="PAYOUT", amount_cents=7),
    ]

    parsed = parse_nacha(_write(entries))

    assert [
        (
            b.header.text("standard_entry_class_code"),
            b.header.text("company_entry_description"),
            b.header["service_class_code"],
            b.control["service_class_code"],
            b.control.integer("total_debit_amount"),
            b.control.integer("total_credit_amount"),
        )
        for b in parsed.batches
    ] == [
        ("PPD", "PAYMENT", "225", "225", 5000, 0),
        ("PPD", "PAYOUT", "220", "220", 0, 25000),
        ("PPD", "REFUND", "220", "220", 0, 1500 + 1003),
        ("CCD", "PAYOUT", "220", "220", 0, 7),
    ]
    assert {e.trace_number: e.transaction_code for e in parsed.entries()} == {
        "021000020000001": 27,
        "021000020000002": 22,
        "021000020000003": 32,
        "021000020000004": 22,
        "021000020000005": 22,
    }
    assert parsed.control.integer("total_debit_amount") == 5000
    assert parsed.control.integer("total_credit_amount") == 1500 + 1003 + 25000 + 7
    assert parsed.control.integer("entry_hash") == 5 * 1100001
    assert [e.is_debit for e in parsed.entries()] == [True, False, False, False, False]


def test_a_batch_of_debits_and_credits_under_one_description_is_mixed_200():
    entries = [_entry(1), _entry(2, direction="credit", amount_cents=300)]

    [batch] = parse_nacha(_write(entries)).batches

    assert (batch.header["service_class_code"], batch.control["service_class_code"]) == (
        "200",
        "200",
    )
    assert batch.control.integer("total_debit_amount") == 1001
    assert batch.control.integer("total_credit_amount") == 300


def test_nine_records_are_blocked_to_ten_ten_stay_ten_and_eleven_become_twenty():
    # header, batch header, n entries, batch control, file control: n=6 fills exactly ten.
    nine, ten, eleven = (_write([_entry(n) for n in range(k)]) for k in (5, 6, 7))
    assert len(nine.splitlines()) == 10 and nine.splitlines()[-1] == b"9" * 94
    assert len(ten.splitlines()) == 10 and ten.splitlines()[-1].startswith(b"9000001")
    assert len(eleven.splitlines()) == 20


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"trace_number": "091000010000001"}, "ODFI's 8 digits"),
        ({"sec_code": "IAT"}, "SEC code"),
        ({"account_type": "brokerage"}, "checking or savings"),
        ({"routing_number": "011000016"}, "check digit"),
        ({"account_number": "123"}, "4-17"),
        ({"account_number": "1234-5678"}, "4-17"),
        ({"amount_cents": 0}, "0.01"),
        ({"amount_cents": 10**10}, "99,999,999.99"),
        ({"direction": "reversal"}, "debit or credit"),
    ],
    ids=["trace", "sec", "type", "routing", "short-account", "dash", "zero", "too-big", "dir"],
)
def test_an_entry_that_cannot_be_written_is_refused_naming_its_trace_not_its_numbers(
    fields, problem
):
    with pytest.raises(EntryRefused, match=problem) as caught:
        _write([_entry(1, **fields)])
    message = str(caught.value)
    assert "987650001" not in message and "011000015" not in message


def test_a_trace_number_twice_is_refused():
    with pytest.raises(EntryRefused, match="twice"):
        _write([_entry(1), _entry(1)])


def test_names_become_printable_capitals_cut_to_their_field():
    assert clean_text("José Ünal-Smith\x00\u2028 and a very long tail", 22) == (
        "JOSE UNAL-SMITH AND A"
    )


def test_format_record_refuses_a_value_over_its_field_instead_of_cutting_it():
    with pytest.raises(ValueError, match="batch_number: over 7 characters"):
        format_record(L.BATCH_CONTROL, {"batch_number": 12345678})
    with pytest.raises(ValueError, match="amount: digits only"):
        format_record(L.ENTRY_DETAIL, {"amount": "12.50"})
    with pytest.raises(ValueError, match="receiver_name: printable ASCII only"):
        format_record(L.ENTRY_DETAIL, {"receiver_name": "Zoë"})


@pytest.mark.parametrize(
    ("direction", "account_type", "code"),
    [("debit", "checking", 28), ("debit", "savings", 38), ("credit", "checking", 23)]
    + [("credit", "savings", 33)],
)
def test_a_prenote_is_written_with_its_prenote_code_and_no_amount(direction, account_type, code):
    prenote = _entry(
        1, amount_cents=0, prenote=True, direction=direction, account_type=account_type
    )

    parsed = parse_nacha(_write([prenote]))

    (entry,) = parsed.entries()
    assert (entry.transaction_code, entry.amount_cents) == (code, 0)
    assert parsed.control.integer("total_debit_amount") == 0
    assert parsed.control.integer("total_credit_amount") == 0


@pytest.mark.parametrize(("prenote", "cents"), [(True, 1), (False, 0)])
def test_a_prenote_with_an_amount_and_a_live_entry_without_one_are_refused(prenote, cents):
    with pytest.raises(EntryRefused) as refused:
        _write([_entry(1, amount_cents=cents, prenote=prenote)])
    assert "02100002" in str(refused.value) and "amount" in str(refused.value)
