"""Read a NACHA file whole, or refuse it whole naming the record and the reason.

A file from the bank moves money, so nothing of a file that breaks the format is used: the
parser reads every record against its layout (``layouts``), checks the order of the records
(file header, then batches of a header, entries with their addenda and a control, then the
file control and the 9-filled records that block the file to a multiple of ten), and checks
every count, hash and total against what it read. The first problem stops it with a
``NachaFormatError`` carrying the record's number (1-based, as a human counts lines) and a
reason that names the field and its columns, never the field's value: a refusal is logged and
shown, and an account number must not travel with it.

What other implementations write and the rules allow is read as written: ``\\r\\n`` or ``\\n``
line ends, or none at all (records back to back); a last line without an end; trailing
spaces trimmed off a record (it is padded back to 94 columns); effective dates of ``000000`` or
blanks in return and NOC batches.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date

from bank.nacha import layouts as L
from bank.nacha.layouts import Layout
from bank.nacha.routing import check_digit

MAX_FILE_BYTES = 256 * 1024 * 1024  # about 2.8 million records; a bigger file is not a bank's


class NachaFormatError(ValueError):
    """The file breaks the format at ``record_number``; nothing of it may be used."""

    def __init__(self, record_number: int, reason: str) -> None:
        super().__init__(f"record {record_number}: {reason}")
        self.record_number = record_number
        self.reason = reason


@dataclass(frozen=True)
class Record:
    number: int
    layout: Layout
    fields: dict[str, str]

    def __getitem__(self, name: str) -> str:
        return self.fields[name]

    def text(self, name: str) -> str:
        return self.fields[name].strip()

    def integer(self, name: str) -> int:
        return int(self.fields[name])


@dataclass(frozen=True)
class Entry:
    record: Record
    addenda: tuple[Record, ...]
    batch: BatchHeaderView

    @property
    def trace_number(self) -> str:
        return self.record["trace_number"]

    @property
    def transaction_code(self) -> int:
        return self.record.integer("transaction_code")

    @property
    def amount_cents(self) -> int:
        return self.record.integer("amount")

    @property
    def is_debit(self) -> bool:
        return self.transaction_code in L.DEBIT_CODES

    @property
    def receiving_routing_number(self) -> str:
        return self.record["receiving_dfi_identification"] + self.record["check_digit"]

    @property
    def account_last4(self) -> str:
        return self.record.text("dfi_account_number")[-4:]

    @property
    def return_addenda(self) -> Record | None:
        """The entry's return (99) or NOC (98) addenda: the last one, which states what the
        entry is now when a dishonor or a contest carries the chain before it."""
        for addenda in reversed(self.addenda):
            if addenda["addenda_type_code"] in ("98", "99"):
                return addenda
        return None


@dataclass(frozen=True)
class BatchHeaderView:
    """What an entry needs of its batch, without a reference cycle to the batch."""

    number: int
    sec_code: str
    service_class_code: str
    company_identification: str
    effective_entry_date: date | None


@dataclass(frozen=True)
class Batch:
    header: Record
    entries: tuple[Entry, ...]
    control: Record


@dataclass(frozen=True)
class NachaFile:
    header: Record
    batches: tuple[Batch, ...]
    control: Record
    record_count: int  # every record, the 9-filled blocking ones included

    def entries(self) -> Iterator[Entry]:
        for batch in self.batches:
            yield from batch.entries


def _split(data: bytes) -> list[str]:
    if not data:
        raise NachaFormatError(1, "the file is empty: a file header (record type 1) is expected")
    if len(data) > MAX_FILE_BYTES:
        raise NachaFormatError(1, f"the file is over {MAX_FILE_BYTES} bytes")
    lines = data.replace(b"\r\n", b"\n").split(b"\n")
    while lines and lines[-1] == b"":  # the last line's end, and blank lines after it
        lines.pop()
    if len(lines) == 1 and len(lines[0]) % L.RECORD_LENGTH == 0:  # records back to back
        line, width = lines[0], L.RECORD_LENGTH
        lines = [line[i : i + width] for i in range(0, len(line), width)]
    if not lines:
        raise NachaFormatError(1, "the file holds no record: a file header is expected")
    records = []
    for number, line in enumerate(lines, start=1):
        for column, byte in enumerate(line, start=1):
            if not 0x20 <= byte <= 0x7E:
                what = "a carriage return" if byte == 0x0D else "a character"
                raise NachaFormatError(
                    number, f"column {column} holds {what} outside printable ASCII"
                )
        if not line:
            raise NachaFormatError(number, "the record is empty")
        if len(line) > L.RECORD_LENGTH:
            raise NachaFormatError(
                number, f"the record is {len(line)} characters long, over {L.RECORD_LENGTH}"
            )
        records.append(line.decode("ascii").ljust(L.RECORD_LENGTH))
    return records


def _read(layout: Layout, text: str, number: int) -> Record:
    fields = {}
    for f in layout.fields:
        value = f.cut(text)
        if f.kind == L.CONSTANT and value != f.value:
            raise NachaFormatError(
                number, f"{layout.name} {f.name} (column {f.start}) must be {f.value!r}"
            )
        if f.kind == L.NUMERIC and not value.isdigit():
            raise NachaFormatError(
                number, f"{layout.name} {f.name} (columns {f.start}-{f.end}) must be digits"
            )
        fields[f.name] = value
    return Record(number, layout, fields)


def _yymmdd(value: str) -> date | None:
    if not value.isdigit():
        return None
    try:
        return date(2000 + int(value[:2]), int(value[2:4]), int(value[4:6]))
    except ValueError:
        return None


def _reason_code(text: str, number: int, letter: str, what: str) -> None:
    code = text[3:6]
    if not (code[0] == letter and code[1:].isdigit()):
        raise NachaFormatError(
            number, f"addenda {text[1:3]} {what} (columns 4-6) must be {letter} and 2 digits"
        )


def _addenda_layout(text: str, number: int, sec_code: str) -> Layout:
    type_code = text[1:3]
    if type_code == "99":
        _reason_code(text, number, "R", "return reason code")
        return L.addenda_99_layout(text[3:6])
    if type_code == "98":
        if sec_code != "COR":
            raise NachaFormatError(
                number, f"a NOC addenda (98) belongs in a COR batch, not a {sec_code} batch"
            )
        _reason_code(text, number, "C", "change code")
        return L.addenda_98_layout(text[3:6])
    if type_code in L.ADDENDA_LAYOUTS:
        return L.ADDENDA_LAYOUTS[type_code]
    raise NachaFormatError(
        number, "addenda type code (columns 2-3) must be 02, 05, 98 or 99 (IAT is not read)"
    )


def _entry_hash(routings: list[str]) -> int:
    return sum(int(r) for r in routings) % 10**10


class _Reader:
    def __init__(self, records: list[str]) -> None:
        self.records = records
        self.position = 0  # index of the next record

    @property
    def number(self) -> int:
        return self.position + 1

    def peek(self) -> str | None:
        if self.position < len(self.records):
            return self.records[self.position][0]
        return None

    def take(self, layout: Layout) -> Record:
        record = _read(layout, self.records[self.position], self.number)
        self.position += 1
        return record


def _batch(reader: _Reader) -> Batch:
    header = reader.take(L.BATCH_HEADER)
    service_class = header["service_class_code"]
    if service_class not in L.SERVICE_CLASS_CODES:
        raise NachaFormatError(
            header.number, "batch header service class code (columns 2-4) must be 200, 220 or 225"
        )
    sec_code = header.text("standard_entry_class_code")
    if sec_code == "IAT":
        raise NachaFormatError(header.number, "IAT batches are not read")
    if len(sec_code) != 3 or not sec_code.isalpha() or not sec_code.isupper():
        raise NachaFormatError(
            header.number, "batch header SEC code (columns 51-53) must be 3 capital letters"
        )
    view = BatchHeaderView(
        number=header.integer("batch_number"),
        sec_code=sec_code,
        service_class_code=service_class,
        company_identification=header["company_identification"],
        effective_entry_date=_yymmdd(header["effective_entry_date"]),
    )
    entries: list[Entry] = []
    while reader.peek() == "6":
        entries.append(_entry(reader, view))
    kind = reader.peek()
    if kind == "7":
        raise NachaFormatError(
            reader.number, "an addenda record follows an entry whose addenda indicator is 0"
        )
    if kind != "8":
        found = "the end of the file" if kind is None else f"record type {kind}"
        raise NachaFormatError(
            reader.number,
            f"batch {view.number} has no batch control (record type 8): found {found}",
        )
    control = reader.take(L.BATCH_CONTROL)
    _check_batch(header, entries, control)
    return Batch(header, tuple(entries), control)


def _entry(reader: _Reader, batch: BatchHeaderView) -> Entry:
    record = reader.take(L.ENTRY_DETAIL)
    code = record.integer("transaction_code")
    if code not in L.TRANSACTION_CODES:
        raise NachaFormatError(
            record.number, "entry detail transaction code (columns 2-3) is not an ACH code"
        )
    if batch.service_class_code == "220" and code in L.DEBIT_CODES:
        raise NachaFormatError(record.number, "a debit entry in a credits-only batch (220)")
    if batch.service_class_code == "225" and code in L.CREDIT_CODES:
        raise NachaFormatError(record.number, "a credit entry in a debits-only batch (225)")
    if check_digit(record["receiving_dfi_identification"]) != int(record["check_digit"]):
        raise NachaFormatError(
            record.number, "entry detail check digit (column 12) does not match the routing number"
        )
    indicator = record["addenda_record_indicator"]
    if indicator not in ("0", "1"):
        raise NachaFormatError(
            record.number, "entry detail addenda record indicator (column 79) must be 0 or 1"
        )
    addenda: list[Record] = []
    while indicator == "1" and reader.peek() == "7":
        text = reader.records[reader.position]
        addenda.append(reader.take(_addenda_layout(text, reader.number, batch.sec_code)))
    if indicator == "1" and not addenda:
        raise NachaFormatError(
            record.number, "entry detail addenda record indicator is 1 but no addenda follows"
        )
    _check_addenda_sequence(record, addenda)
    return Entry(record, tuple(addenda), batch)


def _check_addenda_sequence(entry: Record, addenda: list[Record]) -> None:
    """An addenda 05 names its entry by the last 7 digits of the entry's trace number and
    counts from 0001 (the rules' addenda record layouts): one that names another entry, or
    numbers out of order, may belong to another entry, so the file is refused."""
    position = 0
    for record in addenda:
        if record["addenda_type_code"] != "05":
            continue
        position += 1
        if record["entry_detail_sequence_number"] != entry["trace_number"][-7:]:
            raise NachaFormatError(
                record.number,
                "addenda 05 entry detail sequence number (columns 88-94) must be the last 7 "
                f"digits of its entry's trace number (record {entry.number})",
            )
        if record.integer("addenda_sequence_number") != position:
            raise NachaFormatError(
                record.number,
                f"addenda 05 addenda sequence number (columns 84-87) must be {position:04d}",
            )


def _check_batch(header: Record, entries: list[Entry], control: Record) -> None:
    n = control.number
    for name in ("service_class_code", "originating_dfi_identification", "batch_number"):
        if control[name] != header[name]:
            raise NachaFormatError(n, f"batch control {name} differs from its batch header's")
    # Compared without padding: a bank's return file right-justifies what we left-justified.
    if control.text("company_identification") != header.text("company_identification"):
        raise NachaFormatError(
            n, "batch control company_identification differs from its batch header's"
        )
    count = sum(1 + len(e.addenda) for e in entries)
    if control.integer("entry_addenda_count") != count:
        raise NachaFormatError(
            n,
            f"batch control entry/addenda count says {control.integer('entry_addenda_count')}"
            f", the batch holds {count}",
        )
    entry_hash = _entry_hash([e.record["receiving_dfi_identification"] for e in entries])
    if control.integer("entry_hash") != entry_hash:
        raise NachaFormatError(n, "batch control entry hash does not match the batch's entries")
    debits = sum(e.amount_cents for e in entries if e.is_debit)
    credits = sum(e.amount_cents for e in entries if not e.is_debit)
    if control.integer("total_debit_amount") != debits:
        raise NachaFormatError(n, "batch control total debit amount does not match the entries")
    if control.integer("total_credit_amount") != credits:
        raise NachaFormatError(n, "batch control total credit amount does not match the entries")


def _check_file(batches: list[Batch], control: Record, record_count: int) -> None:
    n = control.number
    if control.integer("batch_count") != len(batches):
        raise NachaFormatError(
            n,
            f"file control batch count says {control.integer('batch_count')}, "
            f"the file holds {len(batches)}",
        )
    if record_count % L.BLOCKING_FACTOR:
        raise NachaFormatError(
            record_count,
            f"the file has {record_count} records: it must be blocked to a multiple of "
            f"{L.BLOCKING_FACTOR} with 9-filled records",
        )
    if control.integer("block_count") != record_count // L.BLOCKING_FACTOR:
        raise NachaFormatError(
            n,
            f"file control block count says {control.integer('block_count')}, the file has "
            f"{record_count // L.BLOCKING_FACTOR} blocks of {L.BLOCKING_FACTOR} records",
        )
    count = sum(b.control.integer("entry_addenda_count") for b in batches)
    if control.integer("entry_addenda_count") != count:
        raise NachaFormatError(n, "file control entry/addenda count does not match the batches")
    entry_hash = sum(b.control.integer("entry_hash") for b in batches) % 10**10
    if control.integer("entry_hash") != entry_hash:
        raise NachaFormatError(n, "file control entry hash does not match the batches")
    for name in ("total_debit_amount", "total_credit_amount"):
        if control.integer(name) != sum(b.control.integer(name) for b in batches):
            raise NachaFormatError(n, f"file control {name} does not match the batches")


def parse_nacha(data: bytes) -> NachaFile:
    """The file, read and checked whole; raises ``NachaFormatError`` at the first problem."""
    if isinstance(data, str):
        raise TypeError("parse_nacha reads bytes: a file's text is ASCII, checked here")
    records = _split(data)
    reader = _Reader(records)
    if reader.peek() != "1":
        raise NachaFormatError(1, "the first record must be a file header (record type 1)")
    header = reader.take(L.FILE_HEADER)
    modifier = header["file_id_modifier"]
    # A-Z or 0-9 by the rules; a blank is what at least one processor's empty return file has.
    if not (modifier == " " or modifier.isupper() or modifier.isdigit()):
        raise NachaFormatError(1, "file header file ID modifier (column 34) must be A-Z or 0-9")
    batches: list[Batch] = []
    while reader.peek() == "5":
        batches.append(_batch(reader))
    kind = reader.peek()
    if kind != "9":
        found = "the end of the file" if kind is None else f"record type {kind}"
        raise NachaFormatError(
            reader.number, f"a batch header (5) or the file control (9) is expected: found {found}"
        )
    control = reader.take(L.FILE_CONTROL)
    while reader.position < len(records):
        if records[reader.position] != L.FILLER_RECORD:
            raise NachaFormatError(
                reader.number, "after the file control only 9-filled blocking records may follow"
            )
        reader.position += 1
    _check_file(batches, control, len(records))
    return NachaFile(header, tuple(batches), control, len(records))
