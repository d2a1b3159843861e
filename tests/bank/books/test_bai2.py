"""BAI2 statements read whole or refused whole, naming the record and the reason: real-shaped
files (01/02/03/16/88/49/98/99, continuations, funds types), and hostile ones."""

from datetime import date, datetime
from pathlib import Path

import pytest
from bai2 import bai2 as other_reader

from bank.books.bai2 import MAX_STATEMENT_BYTES, StatementFormatError, parse_bai2
from bank.books.bai2_writer import Line, bai2_statement_write

FILES = Path(__file__).parent / "files"


def prior_day() -> bytes:
    return (FILES / "prior-day.bai").read_bytes()


def refusal(content: bytes) -> StatementFormatError:
    with pytest.raises(StatementFormatError) as caught:
        parse_bai2(content)
    return caught.value


def with_line(content: bytes, number: int, new: str) -> bytes:
    lines = content.decode().split("\n")
    lines[number - 1] = new
    return "\n".join(lines).encode()


def test_a_real_shaped_prior_day_statement_is_read_line_by_line():
    statement = parse_bai2(prior_day())

    [group] = statement.groups
    [account] = group.accounts
    assert statement.created_at == datetime(2026, 12, 2, 6, 15)
    assert group.as_of_date == date(2026, 12, 1) and account.currency == "USD"
    assert account.summaries[:2] == [("010", 1500000), ("015", 1534201)]
    assert ("400", 0) in account.summaries  # the 03 continued in an 88
    settle, web, ret, check = account.transactions
    # A text continued in an 88 is one text; the references are not split.
    assert settle.text == "ACH SETTLEMENT PPD CO ID 12345678 90 BATCH 0000001"
    assert (settle.type_code, settle.amount_cents, settle.direction) == ("166", 14050, "credit")
    assert settle.customer_reference == "out-20261130-A.ach"
    # Distributed (S) and value-dated (V) funds types carry fields of their own.
    assert (web.funds_type, web.bank_reference, web.amount_cents) == ("S", "B0000002", 3175)
    assert (check.funds_type, check.bank_reference, check.direction) == ("V", "CHK0001", "debit")
    # The text is the last field and keeps its commas.
    assert (
        ret.text == "ACH RETURN R01, WITH, COMMAS" and ret.customer_reference == "021000020000005"
    )


def test_crlf_cr_and_trailing_blanks_read_the_same():
    lf = parse_bai2(prior_day())
    crlf = parse_bai2(prior_day().replace(b"\n", b"\r\n"))
    padded = parse_bai2(b"\n".join(line.ljust(80) for line in prior_day().split(b"\n")))

    assert crlf == lf and padded == lf


def test_the_bai2_package_reads_what_the_writer_writes_and_we_read_its_amounts_alike():
    content = bai2_statement_write(
        sender="011000015",
        receiver="US",
        account_number="000123456789",
        as_of_date=date(2026, 12, 1),
        created_at=datetime(2026, 12, 2, 6, 0),
        file_id="1",
        lines=[
            Line("166", 123456, "B1", "out-1.ach", "ACH SETTLEMENT PPD " + "LONG TEXT " * 20),
            Line("555", 4200, "", "021000020000001", "ACH RETURN R01"),
        ],
    )

    theirs = other_reader.parse_from_string(content.decode())
    their_amounts = [t.amount for g in theirs.children for a in g.children for t in a.children]
    ours = [tx.amount_cents for _, _, tx in parse_bai2(content).transactions()]
    assert their_amounts == ours == [123456, 4200]


@pytest.mark.parametrize(
    ("line", "new", "record", "reason"),
    [
        (10, "49,3092650,8/", 10, "49 account control total 3092650"),
        (10, "49,3092651,9/", 10, "49 number of records 9"),
        (11, "98,3092651,2,10/", 11, "98 number of accounts 2"),
        (12, "99,3092651,1,11/", 12, "99 number of records 11"),
        (12, "99,3092652,1,12/", 12, "99 file control total"),
        (5, "16,166,14O50,Z,B1,x,ACH", 5, "16 166 amount is not an amount"),
        (5, "16,16,14050,Z,B1,x,ACH", 5, "16 type code is not a 3-digit type code"),
        (5, "16,166,14050,Q,B1,x,ACH", 5, "unknown funds type 'Q'"),
        (2, "02,ACMEPAY,021000021,1,261341,2400,USD,2/", 2, "02 as-of date is not a date"),
        (1, "01,021000021,ACMEPAY,261202,0615,0001,80,,3/", 1, "version is not 2"),
        (5, "17,166,14050,Z,B1,x,ACH", 5, "unknown record type '17'"),
    ],
)
def test_a_wrong_total_count_or_field_is_refused_naming_its_record(line, new, record, reason):
    error = refusal(with_line(prior_day(), line, new))

    assert error.record_number == record and reason in error.reason


def test_a_truncated_statement_is_refused_as_truncated_naming_its_last_record():
    lines = prior_day().split(b"\n")

    error = refusal(b"\n".join(lines[:9]) + b"\n")

    assert error.record_number == 9 and "truncated" in error.reason


def test_a_record_after_the_file_trailer_is_refused():
    error = refusal(prior_day() + b"16,166,1,Z,,,LATE/\n")

    assert error.record_number == 13 and "after the file trailer" in error.reason


def test_a_nul_byte_is_refused_naming_the_line_and_column_never_dropped():
    error = refusal(prior_day().replace(b"CHECK PAID", b"CHECK\0PAID"))

    assert error.record_number == 9 and "NUL" in error.reason and "column" in error.reason


@pytest.mark.parametrize(
    ("content", "record"),
    [
        # Latin-1 text from a bank's mainframe: not UTF-8, refused, never guessed at.
        (prior_day().replace(b"CHECK PAID", "CH\u00c8QUE".encode("latin-1")), 9),
        # UTF-16: every other byte a NUL.
        (prior_day().decode().encode("utf-16-le"), 1),
        # EBCDIC: no file header a reader can see.
        (prior_day().decode().encode("cp500"), 1),
    ],
)
def test_a_statement_in_another_encoding_is_refused_at_its_first_bad_record(content, record):
    error = refusal(content)

    assert error.record_number == record


def test_a_statement_larger_than_the_limit_is_refused_before_it_is_read():
    error = refusal(b"01," + b"9" * MAX_STATEMENT_BYTES)

    assert error.record_number == 1 and "larger than" in error.reason


@pytest.mark.parametrize("content", [b"", b"   \n\n", b"99,0,0,2/\n"])
def test_an_empty_statement_or_one_without_a_header_is_refused(content):
    error = refusal(content)

    assert error.record_number == 1 and "file header" in error.reason


def test_a_continuation_that_continues_nothing_is_refused():
    error = refusal(with_line(prior_day(), 3, "88,ORPHAN/"))

    assert error.record_number == 3 and "continuation" in error.reason


def test_a_utf8_byte_order_mark_is_no_data():
    assert parse_bai2(b"\xef\xbb\xbf" + prior_day()) == parse_bai2(prior_day())


def test_the_as_of_date_modifier_says_whether_the_report_is_final():
    [final] = parse_bai2(prior_day()).groups
    interim = with_line(prior_day(), 2, "02,ACMEPAY,021000021,1,261201,2400,USD,3/")

    assert final.final and not parse_bai2(interim).groups[0].final
    error = refusal(with_line(prior_day(), 2, "02,ACMEPAY,021000021,1,261201,2400,USD,7/"))
    assert error.record_number == 2 and "modifier" in error.reason
