"""Write a NACHA file of debits and credits: file header, a batch per company (the merchant's
name and identification, or the originator's), SEC code and company entry description, entries,
controls, blocking.

Debits (collections) take transaction code 27 or 37 in batches of service class 225; credits
(money out: refunds and payouts) 22 or 32, in batches of their own description (``REFUND``,
``PAYOUT``) and service class 220; a batch holding both is 200. A prenote (an account's
validation, NACHA's zero-dollar entry) is 28 or 38 for a debit, 23 or 33 for a credit, amount
0, in the batch its live entries would take. Each batch control and the file
control total debits and credits apart.

A pure function of its input (no database, no clock): the service that cuts a file decides
what goes in it and stores the bytes, so a delivery retried later sends the same bytes. Every
record is formatted from the layouts the parser reads (``layouts``), and ``format_record``
refuses a value that does not fit its field rather than cutting it: only free-text names are
shortened, on purpose, here.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import date, datetime
from itertools import groupby

from bank.nacha import layouts as L
from bank.nacha.layouts import Layout
from bank.nacha.routing import routing_number_problem

SEC_CODES = ("PPD", "CCD", "WEB")
DEBIT_TRANSACTION_CODES = {"checking": 27, "savings": 37}
CREDIT_TRANSACTION_CODES = {"checking": 22, "savings": 32}
TRANSACTION_CODES = {"debit": DEBIT_TRANSACTION_CODES, "credit": CREDIT_TRANSACTION_CODES}
PRENOTE_TRANSACTION_CODES = {
    "debit": {"checking": 28, "savings": 38},
    "credit": {"checking": 23, "savings": 33},
}
# A batch's service class by the directions of its entries.
SERVICE_CLASSES = {frozenset({"debit"}): "225", frozenset({"credit"}): "220"}
MIXED_SERVICE_CLASS = "200"


@dataclass(frozen=True)
class Originator:
    """Who sends the file (the module's operator) and to whom (the ODFI)."""

    immediate_destination: str  # the ODFI's (or its operator's) routing number, 9 digits
    immediate_destination_name: str
    immediate_origin: str  # 10 characters agreed with the bank, often "1" + the EIN
    immediate_origin_name: str
    company_name: str
    company_identification: str  # 10 characters, often "1" + the EIN
    company_entry_description: str  # 10 characters, shown on the receiver's statement
    odfi_identification: str  # the ODFI's routing number less its check digit, 8 digits


@dataclass(frozen=True)
class FileEntry:
    """One entry of a file: a debit, or a credit (``direction="credit"``)."""

    trace_number: str  # 15 digits: the ODFI's 8 and a sequence of 7
    sec_code: str
    account_type: str  # checking | savings
    routing_number: str
    account_number: str
    amount_cents: int
    identification: str  # our reference, 15 characters at most
    receiver_name: str
    recurring: bool = False  # WEB: the payment type code, R (recurring) or S (single)
    direction: str = "debit"  # or "credit"
    # The company entry description of its batch (RETRY PYMT, REFUND, PAYOUT, the merchant's
    # own); "": the originator's.
    description: str = ""
    # The company its batch names (the merchant's originator profile); "": the originator's.
    company_name: str = ""
    company_identification: str = ""
    # A prenote: zero dollars, the prenote's transaction code (28/38, 23/33).
    prenote: bool = False

    @property
    def transaction_code(self) -> int:
        codes = PRENOTE_TRANSACTION_CODES if self.prenote else TRANSACTION_CODES
        return codes[self.direction][self.account_type]


class EntryRefused(ValueError):
    """An entry that cannot be written; the message names the trace number, never an account
    or routing number."""


def clean_text(value: str, width: int) -> str:
    """Free text as the format takes it: printable ASCII (accents dropped), capitals, cut to
    ``width``."""
    ascii_text = unicodedata.normalize("NFKD", value).encode("ascii", "ignore").decode()
    printable = "".join(c if " " <= c <= "~" else " " for c in ascii_text)
    return " ".join(printable.upper().split())[:width].rstrip()


def format_record(layout: Layout, values: Mapping[str, str | int]) -> str:
    """One 94-column record; ValueError naming the field for a value that does not fit."""
    parts = []
    for field in layout.fields:
        if field.kind == L.CONSTANT:
            parts.append(field.value)
            continue
        value = values.get(field.name, "")
        if field.kind == L.NUMERIC:
            text = str(value).zfill(field.width)
            if not text.isascii() or not text.isdigit():
                raise ValueError(f"{layout.name} {field.name}: digits only")
        else:
            text = str(value).ljust(field.width)
            if not text.isascii() or not text.isprintable():
                raise ValueError(f"{layout.name} {field.name}: printable ASCII only")
        if len(text) != field.width:
            raise ValueError(f"{layout.name} {field.name}: over {field.width} characters")
        parts.append(text)
    return "".join(parts)


def entry_check(entry: FileEntry, odfi_identification: str) -> None:
    """Raise ``EntryRefused`` unless ``entry`` can be written under this ODFI."""
    trace = entry.trace_number
    if len(trace) != 15 or not trace.isdigit() or trace[:8] != odfi_identification:
        raise EntryRefused(f"entry {trace!r}: a trace number is the ODFI's 8 digits and 7 more")
    if entry.sec_code not in SEC_CODES:
        raise EntryRefused(f"entry {trace}: SEC code must be one of {', '.join(SEC_CODES)}")
    if entry.direction not in TRANSACTION_CODES:
        raise EntryRefused(f"entry {trace}: direction must be debit or credit")
    if entry.account_type not in DEBIT_TRANSACTION_CODES:
        raise EntryRefused(f"entry {trace}: account type must be checking or savings")
    if problem := routing_number_problem(entry.routing_number):
        raise EntryRefused(f"entry {trace}: {problem}")
    account = entry.account_number
    if not (4 <= len(account) <= 17 and account.isascii() and account.isalnum()):
        raise EntryRefused(f"entry {trace}: an account number is 4-17 letters or digits")
    if entry.prenote:
        if entry.amount_cents != 0:
            raise EntryRefused(f"entry {trace}: a prenote's amount is 0")
    elif not 0 < entry.amount_cents < 10**10:
        raise EntryRefused(f"entry {trace}: the amount must be 0.01 to 99,999,999.99")


def _batch_key(entry: FileEntry, o: Originator) -> tuple[str, str, str, str]:
    """What an entry's batch is: its class, company (identification and name) and description,
    the originator's where the entry names none."""
    return (
        entry.sec_code,
        (entry.company_identification or o.company_identification).ljust(10),
        entry.company_name or o.company_name,
        entry.description or o.company_entry_description,
    )


def _batched(
    entries: list[FileEntry], o: Originator
) -> Iterator[tuple[int, tuple[str, str, str, str], list[FileEntry]]]:
    """The file's batches in the order it writes them: (batch number, key, entries)."""
    entries = sorted(
        entries, key=lambda e: (SEC_CODES.index(e.sec_code), *_batch_key(e, o)[1:], e.trace_number)
    )
    for number, (key, group) in enumerate(groupby(entries, key=lambda e: _batch_key(e, o)), 1):
        yield number, key, list(group)


def batch_numbers(*, originator: Originator, entries: Iterable[FileEntry]) -> dict[str, int]:
    """Each entry's batch number in the file ``nacha_file_write`` writes of the same entries,
    by trace number: the bank settles per batch and names it, so the books match per batch."""
    return {
        entry.trace_number: number
        for number, _, batch in _batched(list(entries), originator)
        for entry in batch
    }


def nacha_file_write(
    *,
    originator: Originator,
    entries: Iterable[FileEntry],
    effective_entry_date: date,
    created_at: datetime,
    file_id_modifier: str,
) -> bytes:
    """The file, blocked to a multiple of ten records, each line ending in LF; raises
    ``EntryRefused`` for an entry that cannot be written (nothing is written then)."""
    o = originator
    entries = list(entries)
    for entry in entries:
        entry_check(entry, o.odfi_identification)
    if len({e.trace_number for e in entries}) != len(entries):
        raise EntryRefused("a trace number appears twice")
    records = [
        format_record(
            L.FILE_HEADER,
            {
                "priority_code": "01",
                "immediate_destination": " " + o.immediate_destination,
                "immediate_origin": o.immediate_origin.rjust(10),
                "file_creation_date": created_at.strftime("%y%m%d"),
                "file_creation_time": created_at.strftime("%H%M"),
                "file_id_modifier": file_id_modifier,
                "immediate_destination_name": clean_text(o.immediate_destination_name, 23),
                "immediate_origin_name": clean_text(o.immediate_origin_name, 23),
            },
        )
    ]
    file_totals = {"count": 0, "hash": 0, "debit": 0, "credit": 0, "batches": 0}
    for batch_number, key, batch in _batched(entries, o):
        sec_code, company_identification, company_name, description = key
        service_class = SERVICE_CLASSES.get(
            frozenset(e.direction for e in batch), MIXED_SERVICE_CLASS
        )
        header = {
            "service_class_code": service_class,
            "company_name": clean_text(company_name, 16),
            "company_identification": company_identification,
            "standard_entry_class_code": sec_code,
            "company_entry_description": clean_text(description, 10),
            "effective_entry_date": effective_entry_date.strftime("%y%m%d"),
            "originator_status_code": "1",
            "originating_dfi_identification": o.odfi_identification,
            "batch_number": batch_number,
        }
        records.append(format_record(L.BATCH_HEADER, header))
        for entry in batch:
            records.append(
                format_record(
                    L.ENTRY_DETAIL,
                    {
                        "transaction_code": entry.transaction_code,
                        "receiving_dfi_identification": entry.routing_number[:8],
                        "check_digit": entry.routing_number[8],
                        "dfi_account_number": entry.account_number,
                        "amount": entry.amount_cents,
                        "identification_number": clean_text(entry.identification, 15),
                        "receiver_name": clean_text(entry.receiver_name, 22),
                        "discretionary_data": ("R " if entry.recurring else "S ")
                        if sec_code == "WEB"
                        else "",
                        "addenda_record_indicator": "0",
                        "trace_number": entry.trace_number,
                    },
                )
            )
        entry_hash = sum(int(e.routing_number[:8]) for e in batch) % 10**10
        debit = sum(e.amount_cents for e in batch if e.direction == "debit")
        credit = sum(e.amount_cents for e in batch if e.direction == "credit")
        records.append(
            format_record(
                L.BATCH_CONTROL,
                {
                    "service_class_code": service_class,
                    "entry_addenda_count": len(batch),
                    "entry_hash": entry_hash,
                    "total_debit_amount": debit,
                    "total_credit_amount": credit,
                    "company_identification": company_identification,
                    "originating_dfi_identification": o.odfi_identification,
                    "batch_number": batch_number,
                },
            )
        )
        file_totals["count"] += len(batch)
        file_totals["hash"] += entry_hash
        file_totals["debit"] += debit
        file_totals["credit"] += credit
        file_totals["batches"] += 1
    blocks = -(-(len(records) + 1) // L.BLOCKING_FACTOR)
    records.append(
        format_record(
            L.FILE_CONTROL,
            {
                "batch_count": file_totals["batches"],
                "block_count": blocks,
                "entry_addenda_count": file_totals["count"],
                "entry_hash": file_totals["hash"] % 10**10,
                "total_debit_amount": file_totals["debit"],
                "total_credit_amount": file_totals["credit"],
            },
        )
    )
    records += [L.FILLER_RECORD] * (blocks * L.BLOCKING_FACTOR - len(records))
    return ("\n".join(records) + "\n").encode("ascii")
