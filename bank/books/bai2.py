"""Read a bank's BAI2 statement whole, or refuse it whole naming the record and the reason.

BAI2 (the Bank Administration Institute's cash management balance reporting format, version 2)
is what US banks send as the prior-day statement: a file header (01), groups (02) of accounts
(03, with summary amounts) and their transaction details (16), each closed by a trailer that
carries a control total and a record count (49 an account, 98 a group, 99 the file). A record
too long for the bank's line goes on in continuation records (88) glued to it.

A statement moves money in the books, so nothing of one that breaks the format is used: the
first problem stops the reader with a ``StatementFormatError`` carrying the physical record's
number (1-based, as a human counts lines) and a reason that names the record type and field,
never an account number. Every control total and record count is checked, a file that ends
before its 99 is refused as truncated, and a byte that is not printable text (a NUL, another
control character, bytes that are not UTF-8) is refused naming its line, never dropped.

Why not the ``bai2`` package (PyPI, 0.15.0, tried first and kept in the tests as an
independent reader): its errors name no record ("Invalid account control total for
Account"), a truncated file is reported as "Expected account_identifier, got account_trailer",
and a NUL inside a text field is read into the text without a word.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import date, datetime

MAX_STATEMENT_BYTES = 64 * 1024 * 1024
# Where the format has digits it has ASCII digits: ``str.isdigit`` (and ``int``) also take
# full-width, Arabic-Indic and other scripts' digits, which would be read as money.
AMOUNT = re.compile(r"[+-]?[0-9]{1,18}")
COUNT = re.compile(r"[0-9]{1,9}")
TYPE_CODE = re.compile(r"[0-9]{3}")
YYMMDD = re.compile(r"[0-9]{6}")
HHMM = re.compile(r"[0-9]{4}")
CURRENCY = re.compile(r"[A-Z]{3}")
# An account number as banks write it in an 03 record: letters, digits and dashes. Only its
# last 4 characters are kept.
ACCOUNT_NUMBER = re.compile(r"[0-9A-Za-z-]{1,35}")
# Widths of what is kept of a detail (16): a bank or customer reference, and the text with its
# continuations. A bank line that needs more is not one this module can read.
REFERENCE_WIDTH = 76
TEXT_WIDTH = 4000
# Any control character but the tab (a line end has been split off already).
CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # far above a bank account's daily detail

# Detail type codes (BAI2's table): 100-399 credits, 400-699 debits; others (loans 700-799,
# 890 non-monetary, 900-999 the bank's own) carry no direction this module can book.
CREDIT, DEBIT, OTHER = "credit", "debit", "other"


def direction_of(type_code: str) -> str:
    number = int(type_code)
    if 100 <= number <= 399:
        return CREDIT
    if 400 <= number <= 699:
        return DEBIT
    return OTHER


class StatementFormatError(ValueError):
    """The statement breaks the format at ``record_number``; nothing of it may be used."""

    def __init__(self, record_number: int, reason: str) -> None:
        super().__init__(f"record {record_number}: {reason}")
        self.record_number = record_number
        self.reason = reason


@dataclass(frozen=True)
class Transaction:
    record_number: int
    type_code: str
    amount_cents: int
    funds_type: str
    bank_reference: str
    customer_reference: str
    text: str

    @property
    def direction(self) -> str:
        return direction_of(self.type_code)


@dataclass
class Account:
    record_number: int
    number: str
    currency: str
    summaries: list[tuple[str, int | None]] = field(default_factory=list)
    transactions: list[Transaction] = field(default_factory=list)


@dataclass
class Group:
    record_number: int
    ultimate_receiver: str
    originator: str
    status: str
    as_of_date: date
    currency: str
    # 1 interim previous-day, 2 final previous-day, 3 interim same-day, 4 final same-day; blank
    # is taken as final, as most prior-day statements leave it.
    as_of_modifier: str = ""
    accounts: list[Account] = field(default_factory=list)

    @property
    def final(self) -> bool:
        return self.as_of_modifier not in ("1", "3")


@dataclass
class Statement:
    sender: str
    receiver: str
    created_at: datetime
    file_id: str
    groups: list[Group] = field(default_factory=list)

    def transactions(self):
        for group in self.groups:
            for account in group.accounts:
                for tx in account.transactions:
                    yield group, account, tx


@dataclass
class _Logical:
    number: int  # of its first physical record
    code: str
    fields: list[str]
    text: str  # the raw content after the code, continuations joined


def _decode(content: bytes) -> list[str]:
    if len(content) > MAX_STATEMENT_BYTES:
        raise StatementFormatError(1, f"statement larger than {MAX_STATEMENT_BYTES} bytes")
    if not content.strip():
        raise StatementFormatError(1, "empty statement: no file header (01)")
    content = content.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 byte order mark is no data
    lines = content.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    decoded = []
    for number, raw in enumerate(lines, start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise StatementFormatError(
                number, f"bytes that are not UTF-8 text at column {exc.start + 1}"
            ) from None
        if bad := CONTROL.search(line):
            char = bad.group()
            what = "a NUL byte" if char == "\0" else f"control character {ord(char):#04x}"
            raise StatementFormatError(number, f"{what} at column {bad.start() + 1}")
        decoded.append(line.rstrip(" "))
    return decoded


def _logical_records(lines: list[str]) -> list[_Logical]:
    records: list[_Logical] = []
    for number, line in enumerate(lines, start=1):
        if not line:
            continue  # a blank line carries nothing; some banks end with one
        code, _, rest = line.partition(",")
        if code == "88":
            if not records or records[-1].code not in {"03", "16", "88"}:
                raise StatementFormatError(number, "continuation (88) follows no 03 or 16 record")
            last = records[-1]
            # A continuation starts a new field unless the record it continues ended with a
            # field still open (no terminating slash): glue text, separate fields.
            if last.text.rstrip().endswith("/") or last.code != "16":
                last.text = f"{last.text.rstrip().removesuffix('/')},{rest}"
            else:
                last.text = f"{last.text} {rest}"
            continue
        if code not in {"01", "02", "03", "16", "49", "98", "99"}:
            raise StatementFormatError(number, f"unknown record type {code[:2]!r}")
        records.append(_Logical(number, code, [], rest))
    return records


def _fields(text: str) -> list[str]:
    return text.rstrip().removesuffix("/").split(",")


def _amount(value: str, number: int, what: str, *, blank: bool = False) -> int | None:
    value = value.strip()
    if value == "" and blank:
        return None
    if not AMOUNT.fullmatch(value):
        raise StatementFormatError(number, f"{what} is not an amount in cents (1-18 digits 0-9)")
    return int(value)


def _trailer_check(record, parts: list[str], name: str, *fields: tuple[str, bool, int, str]):
    """A trailer's totals, each read (an amount or a count) and then held to what the records
    before it add up to: ``fields`` are (label, is an amount, the sum, how the sum is named)."""
    if len(parts) < len(fields):
        raise StatementFormatError(record.number, f"{name} cut short")
    read = [
        (_amount if is_amount else _count)(part, record.number, f"{record.code} {label}")
        for part, (label, is_amount, _, _) in zip(parts, fields, strict=False)
    ]
    for value, (label, _, expected, named) in zip(read, fields, strict=True):
        if value != expected:
            raise StatementFormatError(
                record.number, f"{record.code} {label} {value} is not {named}{expected}"
            )


def _count(value: str, number: int, what: str) -> int:
    value = value.strip()
    if not COUNT.fullmatch(value):
        raise StatementFormatError(number, f"{what} is not a number (1-9 digits 0-9)")
    return int(value)


def _type_code(value: str, number: int, what: str) -> str:
    value = value.strip()
    if not TYPE_CODE.fullmatch(value):
        raise StatementFormatError(number, f"{what} is not a 3-digit type code")
    return value


def _date(value: str, number: int, what: str) -> date:
    value = value.strip()
    try:
        if not YYMMDD.fullmatch(value):
            raise ValueError(value)
        return datetime.strptime(value, "%y%m%d").date()
    except ValueError:
        raise StatementFormatError(number, f"{what} is not a date YYMMDD") from None


def _skip_funds_type(parts: list[str], at: int, number: int) -> tuple[str, int]:
    """The funds type at ``parts[at]`` and the index after its own fields."""
    funds = parts[at].strip() if at < len(parts) else ""
    # ASCII first: "\u017f".upper() is "S".
    if not funds.isascii():
        raise StatementFormatError(number, "funds type is not one of Z 0 1 2 S V D")
    funds = funds.upper()
    at += 1
    if funds in ("", "Z", "0", "1", "2"):
        return funds, at
    if funds == "S":
        # immediate, one-day and two-or-more-day amounts
        for value in parts[at : at + 3]:
            _amount(value, number, "funds availability (S) amount", blank=True)
        return funds, at + 3
    if funds == "V":
        return funds, at + 2  # value date and time
    if funds == "D":
        if at >= len(parts):
            raise StatementFormatError(number, "distributed funds (D) without a count")
        pairs = _count(parts[at], number, "distributed funds count")
        return funds, at + 1 + 2 * pairs
    raise StatementFormatError(number, f"unknown funds type {funds[:1]!r}")


def _account(record: _Logical) -> tuple[Account, int]:
    parts = _fields(record.text)
    if len(parts) < 2 or not parts[0].strip():
        raise StatementFormatError(record.number, "account identifier (03) without its number")
    number = parts[0].strip()
    if not ACCOUNT_NUMBER.fullmatch(number):
        raise StatementFormatError(
            record.number, "03 account number is not 1-35 characters of A-Z, a-z, 0-9 and -"
        )
    account = Account(record.number, number, _currency(parts[1], record.number, "03 currency code"))
    total = 0
    at = 2
    while at < len(parts):
        if not parts[at].strip() and at == len(parts) - 1:
            break
        code = _type_code(parts[at], record.number, "03 summary type code")
        amount = _amount(
            parts[at + 1] if at + 1 < len(parts) else "",
            record.number,
            f"03 summary {code} amount",
            blank=True,
        )
        if at + 2 < len(parts) and parts[at + 2].strip():
            _count(parts[at + 2], record.number, f"03 summary {code} item count")
        _, at = _skip_funds_type(parts, at + 3, record.number)
        account.summaries.append((code, amount))
        total += amount or 0
    return account, total


def _currency(value: str, number: int, what: str) -> str:
    """A currency code (three letters A-Z) or blank (the group's, or USD)."""
    value = value.strip()
    if value and not CURRENCY.fullmatch(value):
        raise StatementFormatError(number, f"{what} is not 3 letters A-Z")
    return value


def _width(value: str, width: int, number: int, what: str) -> str:
    if len(value) > width:
        raise StatementFormatError(number, f"{what} is longer than {width} characters")
    return value


def _transaction(record: _Logical) -> Transaction:
    # The text is the last field and may hold commas: split only what comes before it.
    head = record.text.split(",", 3)
    if len(head) < 3:
        raise StatementFormatError(record.number, "transaction detail (16) cut short")
    code = _type_code(head[0], record.number, "16 type code")
    amount = _amount(head[1], record.number, f"16 {code} amount")
    if amount is None or amount < 0:
        raise StatementFormatError(record.number, f"16 {code} amount is negative")
    parts = record.text.split(",")
    funds, at = _skip_funds_type(parts, 2, record.number)
    if at + 2 > len(parts):
        raise StatementFormatError(
            record.number, "transaction detail (16) without its bank and customer references"
        )
    text = ",".join(parts[at + 2 :]).strip()
    if text.endswith("/"):
        text = text[:-1].rstrip()
    return Transaction(
        record_number=record.number,
        type_code=code,
        amount_cents=amount,
        funds_type=funds,
        bank_reference=_width(
            parts[at].strip().removesuffix("/"), REFERENCE_WIDTH, record.number, "16 bank reference"
        ),
        customer_reference=_width(
            parts[at + 1].strip().removesuffix("/"),
            REFERENCE_WIDTH,
            record.number,
            "16 customer reference",
        ),
        text=_width(text, TEXT_WIDTH, record.number, "16 text"),
    )


def parse_bai2(content: bytes) -> Statement:
    """The statement in ``content``, every total and count checked; ``StatementFormatError``
    naming the first record at fault otherwise."""
    lines = _decode(content)
    records = _logical_records(lines)
    if not records or records[0].code != "01":
        raise StatementFormatError(records[0].number if records else 1, "no file header (01)")
    header = _fields(records[0].text)
    if len(header) < 8:
        raise StatementFormatError(1, "file header (01) cut short")
    if header[7].strip() not in ("2", ""):
        raise StatementFormatError(records[0].number, "file header (01) version is not 2")
    created_day = _date(header[2], records[0].number, "01 file creation date")
    hhmm = header[3].strip() or "0000"
    if not HHMM.fullmatch(hhmm):
        raise StatementFormatError(records[0].number, "01 file creation time is not HHMM")
    if hhmm == "2400":
        hhmm = "2359"
    try:
        created_at = datetime.combine(created_day, datetime.strptime(hhmm, "%H%M").time())
    except ValueError:
        raise StatementFormatError(records[0].number, "01 file creation time is not HHMM") from None
    statement = Statement(header[0].strip(), header[1].strip(), created_at, header[4].strip())

    physical_count = 0  # records counted by the trailers: physical ones, continuations included
    line_of = [r.number for r in records] + [len(lines) + 1]

    def physical(i: int) -> int:
        return sum(1 for line in lines[line_of[i] - 1 : line_of[i + 1] - 1] if line)

    group: Group | None = None
    account: Account | None = None
    group_total = file_total = 0
    account_total = 0
    group_records = account_records = 0
    group_accounts = 0
    file_groups = 0
    physical_count = physical(0)
    ended = False
    for i, record in enumerate(records[1:], start=1):
        n = physical(i)
        physical_count += n
        if ended:
            raise StatementFormatError(record.number, "record after the file trailer (99)")
        if group is not None:
            group_records += n
        if account is not None:
            account_records += n
        parts = _fields(record.text)
        if record.code == "02":
            if group is not None:
                raise StatementFormatError(record.number, "group header (02) inside a group")
            if len(parts) < 6:
                raise StatementFormatError(record.number, "group header (02) cut short")
            modifier = parts[6].strip() if len(parts) > 6 else ""
            if modifier not in ("", "1", "2", "3", "4"):
                raise StatementFormatError(record.number, "02 as-of-date modifier is not 1-4")
            group = Group(
                record.number,
                parts[0].strip(),
                parts[1].strip(),
                parts[2].strip(),
                _date(parts[3], record.number, "02 as-of date"),
                _currency(parts[5], record.number, "02 currency code") or "USD",
                modifier,
            )
            group_records, group_total, group_accounts = n, 0, 0
        elif record.code == "03":
            if group is None or account is not None:
                raise StatementFormatError(
                    record.number, "account identifier (03) outside a group or inside an account"
                )
            account, account_total = _account(record)
            account.currency = account.currency or group.currency
            account_records = n
        elif record.code == "16":
            if account is None:
                raise StatementFormatError(
                    record.number, "transaction detail (16) outside an account"
                )
            tx = _transaction(record)
            account.transactions.append(tx)
            account_total += tx.amount_cents
        elif record.code == "49":
            if account is None or group is None:
                raise StatementFormatError(record.number, "account trailer (49) outside an account")
            _trailer_check(
                record,
                parts,
                "account trailer (49)",
                ("account control total", True, account_total, "the account's sum "),
                ("number of records", False, account_records, "the account's "),
            )
            group.accounts.append(account)
            group_total += account_total
            group_accounts += 1
            account = None
        elif record.code == "98":
            if group is None or account is not None:
                raise StatementFormatError(
                    record.number, "group trailer (98) outside a group or before a 49"
                )
            _trailer_check(
                record,
                parts,
                "group trailer (98)",
                ("group control total", True, group_total, "the sum "),
                ("number of accounts", False, group_accounts, ""),
                ("number of records", False, group_records, ""),
            )
            statement.groups.append(group)
            file_total += group_total
            file_groups += 1
            group = None
        elif record.code == "99":
            if group is not None:
                raise StatementFormatError(record.number, "file trailer (99) inside a group")
            _trailer_check(
                record,
                parts,
                "file trailer (99)",
                ("file control total", True, file_total, "the sum "),
                ("number of groups", False, file_groups, ""),
                ("number of records", False, physical_count, ""),
            )
            ended = True
        else:  # a second 01
            raise StatementFormatError(record.number, "a second file header (01)")
    if not ended:
        last = len(lines)
        raise StatementFormatError(
            last, "truncated: the statement ends before its file trailer (99)"
        )
    return statement
