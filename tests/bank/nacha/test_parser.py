"""The parser reads the files of the formats we meet (PPD, CCD, WEB debits; returns with the
dishonored and contested layouts; NOCs), in the shapes other implementations write them, and
refuses a malformed file whole, naming the record and the reason."""

import pytest

from bank.nacha.parser import MAX_FILE_BYTES, NachaFormatError, parse_nacha
from tests.bank.nacha.conftest import join, read_file, records


def test_a_ppd_file_with_trimmed_records_and_no_last_line_end_is_read():
    parsed = parse_nacha(read_file("ppd-debit.ach"))
    entries = list(parsed.entries())
    assert [e.trace_number for e in entries] == ["021000020000001", "021000020000002"]
    assert [e.amount_cents for e in entries] == [12550, 990]
    assert [e.is_debit for e in entries] == [True, True]
    assert entries[0].addenda[0]["payment_related_information"].strip() == (
        "INVOICE 2026-11 MONTHLY PLAN"
    )
    assert entries[0].batch.sec_code == "PPD"
    assert entries[0].batch.effective_entry_date.isoformat() == "2026-12-01"
    assert parsed.record_count == 10


def test_a_ccd_file_with_crlf_line_ends_is_read():
    entries = list(parse_nacha(read_file("ccd-debit.ach")).entries())
    assert [(e.batch.sec_code, e.amount_cents) for e in entries] == [("CCD", 450000), ("CCD", 125)]


def test_a_web_file_of_records_back_to_back_is_read():
    parsed = parse_nacha(read_file("web-debit.ach"))
    assert [b.header.integer("batch_number") for b in parsed.batches] == [1, 2]
    assert [e.record.text("discretionary_data") for e in parsed.entries()] == ["R", "S"]


def test_returns_are_read_with_their_own_layouts():
    entries = list(parse_nacha(read_file("returns.ach")).entries())
    codes = [e.return_addenda.text("return_reason_code") for e in entries]
    assert codes == ["R01", "R10", "R68", "R71"]
    assert entries[0].return_addenda["original_entry_trace_number"] == "021000020000001"
    dishonored = entries[2].return_addenda
    assert dishonored.layout.name == "addenda 99 (dishonored)"
    assert dishonored["return_trace_number"] == "011000011000009"
    assert dishonored["original_return_reason_code"] == "01"
    contested = entries[3].return_addenda
    assert contested.layout.name == "addenda 99 (contested)"
    assert contested["dishonored_return_trace_number"] == "021000020000099"
    assert contested["dishonored_return_reason_code"] == "68"


def test_nocs_are_read_with_their_corrected_data():
    entries = list(parse_nacha(read_file("noc.ach")).entries())
    assert [e.return_addenda.text("change_code") for e in entries] == ["C01", "C03", "C05"]
    assert entries[2].return_addenda.text("corrected_data") == "32"


def test_text_is_refused_as_the_parser_reads_bytes():
    with pytest.raises(TypeError):
        parse_nacha(read_file("ppd-debit.ach").decode())


def _refusal(lines: list[str]) -> NachaFormatError:
    with pytest.raises(NachaFormatError) as caught:
        parse_nacha(join(lines))
    return caught.value


def _set(line: str, start: int, value: str) -> str:
    return line[: start - 1] + value + line[start - 1 + len(value) :]


# (what is broken, how: a function of the PPD fixture's records, record named, words of reason)
CASES = [
    ("no file header", lambda r: r[1:], 1, "first record must be a file header"),
    ("record size", lambda r: [_set(r[0], 35, "095")] + r[1:], 1, "record_size (column 35)"),
    ("modifier", lambda r: [_set(r[0], 34, "a")] + r[1:], 1, "file ID modifier"),
    ("creation date", lambda r: [_set(r[0], 24, "26-130")] + r[1:], 1, "file_creation_date"),
    ("service class", lambda r: r[:1] + [_set(r[1], 2, "280")] + r[2:], 2, "service class"),
    ("iat", lambda r: r[:1] + [_set(r[1], 51, "IAT")] + r[2:], 2, "IAT"),
    ("sec code", lambda r: r[:1] + [_set(r[1], 51, "pp1")] + r[2:], 2, "SEC code"),
    ("tx code", lambda r: r[:2] + [_set(r[2], 2, "25")] + r[3:], 3, "transaction code"),
    ("credit in 225", lambda r: r[:2] + [_set(r[2], 2, "22")] + r[3:], 3, "credit entry"),
    ("check digit", lambda r: r[:2] + [_set(r[2], 12, "6")] + r[3:], 3, "check digit"),
    ("amount", lambda r: r[:2] + [_set(r[2], 30, "00000125.0")] + r[3:], 3, "amount (columns"),
    ("indicator", lambda r: r[:2] + [_set(r[2], 79, "2")] + r[3:], 3, "indicator (column 79)"),
    ("missing addenda", lambda r: r[:3] + r[4:], 3, "no addenda follows"),
    ("stray addenda", lambda r: r[:5] + [r[3]] + r[5:], 6, "indicator is 0"),
    ("addenda type", lambda r: r[:3] + [_set(r[3], 2, "17")] + r[4:], 4, "addenda type code"),
    ("noc outside cor", lambda r: r[:3] + [_set(r[3], 2, "98C01")] + r[4:], 4, "COR batch"),
    ("return code", lambda r: r[:3] + [_set(r[3], 2, "99X01")] + r[4:], 4, "R and 2 digits"),
    (
        "addenda of another entry",
        lambda r: r[:3] + [_set(r[3], 88, "0000002")] + r[4:],
        4,
        "last 7 digits of its entry's trace number (record 3)",
    ),
    ("addenda sequence 0", lambda r: r[:3] + [_set(r[3], 84, "0000")] + r[4:], 4, "must be 0001"),
    ("addenda sequence 2", lambda r: r[:3] + [_set(r[3], 84, "0002")] + r[4:], 4, "must be 0001"),
    (
        "second addenda 0001",
        lambda r: r[:4] + [r[3]] + r[4:5] + [_set(r[5], 5, "000004")] + r[6:],
        5,
        "must be 0002",
    ),
    ("no batch control", lambda r: r[:5] + r[6:], 6, "no batch control"),
    ("batch count", lambda r: r[:5] + [_set(r[5], 5, "000004")] + r[6:], 6, "says 4"),
    ("batch hash", lambda r: r[:5] + [_set(r[5], 11, "0000000001")] + r[6:], 6, "entry hash"),
    ("batch debit", lambda r: r[:5] + [_set(r[5], 21, "000000000001")] + r[6:], 6, "debit"),
    ("batch credit", lambda r: r[:5] + [_set(r[5], 33, "000000000001")] + r[6:], 6, "credit"),
    ("batch number", lambda r: r[:5] + [_set(r[5], 88, "0000002")] + r[6:], 6, "batch_number"),
    ("company", lambda r: r[:5] + [_set(r[5], 45, "9999999999")] + r[6:], 6, "company_ident"),
    ("no file control", lambda r: r[:6], 7, "file control (9) is expected"),
    ("batches", lambda r: r[:6] + [_set(r[6], 2, "000002")] + r[7:], 7, "batch count"),
    ("blocks", lambda r: r[:6] + [_set(r[6], 8, "000002")] + r[7:], 7, "block count says 2"),
    ("a block of nines too many", lambda r: r + ["9" * 94] * 10, 7, "the file has 2 blocks"),
    ("entries", lambda r: r[:6] + [_set(r[6], 14, "00000009")] + r[7:], 7, "entry/addenda"),
    ("file hash", lambda r: r[:6] + [_set(r[6], 22, "0000000001")] + r[7:], 7, "entry hash"),
    ("file debit", lambda r: r[:6] + [_set(r[6], 32, "000000000001")] + r[7:], 7, "debit"),
    ("file credit", lambda r: r[:6] + [_set(r[6], 44, "000000000001")] + r[7:], 7, "credit"),
    ("not blocked", lambda r: r[:9], 9, "multiple of 10"),
    ("bad filler", lambda r: r[:9] + ["9" * 93 + "8"], 10, "9-filled"),
    ("record after", lambda r: r[:7] + [r[1]] + r[8:], 8, "9-filled"),
    ("long record", lambda r: r[:2] + [r[2] + "X"] + r[3:], 3, "95 characters long"),
    ("empty record", lambda r: r[:2] + [""] + r[2:], 3, "record is empty"),
    ("non-ascii", lambda r: r[:2] + [_set(r[2], 60, "é")] + r[3:], 3, "column 60"),
    ("nul", lambda r: r[:2] + [_set(r[2], 13, "\x00")] + r[3:], 3, "column 13"),
    ("bare cr", lambda r: r[:2] + [_set(r[2], 20, "\r")] + r[3:], 3, "carriage return"),
]


@pytest.mark.parametrize(("name", "mutate", "record", "reason"), CASES, ids=[c[0] for c in CASES])
def test_a_malformed_file_is_refused_naming_the_record_and_reason(
    ppd_records, name, mutate, record, reason
):
    refusal = _refusal(mutate(list(ppd_records)))
    assert refusal.record_number == record
    assert reason in refusal.reason
    assert str(refusal).startswith(f"record {record}: ")


def test_a_refusal_never_repeats_the_account_number(ppd_records):
    lines = list(ppd_records)
    lines[2] = _set(lines[2], 30, "12345678XY")
    refusal = _refusal(lines)
    assert "12345678901" not in str(refusal) and "12345678XY" not in str(refusal)


def test_an_empty_file_is_refused_at_record_1():
    for data in (b"", b"\n\n"):
        with pytest.raises(NachaFormatError, match="^record 1: "):
            parse_nacha(data)


def test_a_file_over_the_size_limit_is_refused_before_it_is_read(monkeypatch):
    monkeypatch.setattr("bank.nacha.parser.MAX_FILE_BYTES", 100)
    with pytest.raises(NachaFormatError, match=r"^record 1: the file is over 100 bytes"):
        parse_nacha(read_file("ppd-debit.ach"))
    assert MAX_FILE_BYTES > 100


def test_a_return_files_right_justified_company_id_in_its_control_is_accepted():
    lines = records("returns.ach")
    assert lines[1][40:50] == "123456789 " and lines[6][44:54] == " 123456789"
    assert len(list(parse_nacha(join(lines)).entries())) == 4
