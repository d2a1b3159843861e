"""The BAI2 statement's fields, class by class: digits are ASCII digits (``str.isdigit`` takes
full-width and Arabic-Indic ones, which ``int`` reads as money), every kept value fits its
column, and a statement the reader cannot take is refused whole naming the record and field
(never an exception that stops the round)."""

import pytest

from bank.books.bai2 import REFERENCE_WIDTH, TEXT_WIDTH, StatementFormatError, parse_bai2
from tests.bank.books.test_bai2 import prior_day, with_line

FULL_WIDTH_1 = "\uff11"  # "１"
ARABIC_INDIC_5 = "\u0665"


def refusal(content: bytes) -> StatementFormatError:
    with pytest.raises(StatementFormatError) as caught:
        parse_bai2(content)
    return caught.value


@pytest.mark.parametrize(
    ("line", "new", "reason"),
    [
        # A detail's amount, type code and funds-type amounts.
        (5, f"16,166,{FULL_WIDTH_1}4050,Z,B1,x,ACH", "16 166 amount is not an amount"),
        (5, f"16,166,1405{ARABIC_INDIC_5},Z,B1,x,ACH", "16 166 amount is not an amount"),
        (5, f"16,{FULL_WIDTH_1}66,14050,Z,B1,x,ACH", "16 type code is not a 3-digit"),
        (5, "16,166,+14050,Z,B1,x,ACH", None),  # a sign is the format's: read
        (5, "16,166,14050,S,1\uff10,0,0,B1,x,ACH", "funds availability (S) amount"),
        # "\u017f".upper() is "S": a funds type is ASCII or refused.
        (5, "16,166,14050,\u017f,14050,0,0,B1,x,ACH", "funds type is not one of"),
        # An account summary's amount and item count.
        (
            3,
            f"03,000123456789,USD,010,15{FULL_WIDTH_1}0000,,,015,1534201,,,040,,,,100,34201,2,/",
            "03 summary 010 amount",
        ),
        (
            3,
            f"03,000123456789,USD,010,1500000,{FULL_WIDTH_1},,015,1534201,,,040,,,,100,34201,2,/",
            "03 summary 010 item count",
        ),
        # Trailers: totals and counts.
        (10, f"49,3092651,{FULL_WIDTH_1}/", "49 number of records is not a number"),
        (11, f"98,3092651,{FULL_WIDTH_1},10/", "98 number of accounts is not a number"),
        (12, f"99,309265{FULL_WIDTH_1},1,12/", "99 file control total is not an amount"),
        # Dates and times.
        (
            2,
            f"02,ACMEPAY,021000021,1,26120{FULL_WIDTH_1},2400,USD,2/",
            "02 as-of date is not a date",
        ),
        (1, f"01,021000021,ACMEPAY,26120{FULL_WIDTH_1},0615,0001,80,,2/", "01 file creation date"),
        (1, f"01,021000021,ACMEPAY,261202,061{FULL_WIDTH_1},0001,80,,2/", "01 file creation time"),
        (1, "01,021000021,ACMEPAY,261202,615,0001,80,,2/", "01 file creation time"),
    ],
)
def test_digits_are_ascii_digits_in_every_numeric_field(line, new, reason):
    content = with_line(prior_day(), line, new)
    if reason is None:
        assert [tx.amount_cents for _, _, tx in parse_bai2(content).transactions()][0] == 14050
        return

    error = refusal(content)

    assert error.record_number == line and reason in error.reason


@pytest.mark.parametrize(
    ("line", "new", "reason"),
    [
        # Wider than the columns that keep them (currency: 3; an amount: 18 digits of cents).
        (2, "02,ACMEPAY,021000021,1,261201,2400,USDX,2/", "02 currency code is not 3 letters"),
        (2, "02,ACMEPAY,021000021,1,261201,2400,U$D,2/", "02 currency code is not 3 letters"),
        (
            3,
            "03,000123456789,EURO,010,1500000,,,015,1534201,,,040,,,,100,34201,2,/",
            "03 currency code",
        ),
        (5, "16,166,1234567890123456789,Z,B1,x,ACH", "16 166 amount is not an amount"),
        (10, "49,3092651,1234567890/", "49 number of records is not a number"),
        # An account number: letters, digits and dashes, 1-35 of them; never quoted back.
        (
            3,
            f"03,{'1' * 36},USD,010,1500000,,,015,1534201,,,040,,,,100,34201,2,/",
            "03 account number",
        ),
        (
            3,
            "03,0001234 56789,USD,010,1500000,,,015,1534201,,,040,,,,100,34201,2,/",
            "03 account number",
        ),
        (
            3,
            f"03,00012345678{FULL_WIDTH_1},USD,010,1500000,,,015,1534201,,,040,,,,100,34201,2,/",
            "03 account number",
        ),
        # References and text past their widths.
        (5, f"16,166,14050,Z,{'B' * (REFERENCE_WIDTH + 1)},x,ACH", "16 bank reference is longer"),
        (
            5,
            f"16,166,14050,Z,B1,{'x' * (REFERENCE_WIDTH + 1)},ACH",
            "16 customer reference is longer",
        ),
        (5, f"16,166,14050,Z,B1,x,{'T' * (TEXT_WIDTH + 1)}", "16 text is longer"),
    ],
)
def test_a_value_wider_than_its_column_or_outside_its_charset_is_refused(line, new, reason):
    error = refusal(with_line(prior_day(), line, new))

    assert error.record_number == line and reason in error.reason
    assert "000123456789" not in error.reason and "1" * 36 not in error.reason


def test_values_at_their_widths_are_read():
    content = with_line(
        prior_day(),
        5,
        f"16,166,14050,Z,{'B' * REFERENCE_WIDTH},{'x' * REFERENCE_WIDTH},ACH",
    )

    [first, *_] = [tx for _, _, tx in parse_bai2(content).transactions()]

    assert len(first.bank_reference) == len(first.customer_reference) == REFERENCE_WIDTH
