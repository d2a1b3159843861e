"""The sandbox bank's BAI2 statements: what it settled and debited on a banking day, for the
files it received and the returns it wrote, with variances injected on demand.

For each NACHA file delivered to it (``outbound``, answered or not) whose batches are
effective on the day, one ACH settlement credit (type 166) per batch for the batch's total,
naming the file in the customer reference as banks name the originator's file; for each return
it wrote that banking day (its answer files in ``inbound``, collected or not; a weekend's on the
Monday), one return debit (type 555) naming the original trace number. A batch of prenotes
alone, and a prenote's return, move no money: the bank posts no line for them. Injections, each
on a line of its own:

``missing``  the first batch's settlement is left out
``short``    the next batch's settlement is one dollar short
``extra``    a credit of $123.45 that matches nothing is added
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from pathlib import Path

from bank.books.bai2_writer import Line, bai2_statement_write
from bank.nacha.parser import parse_nacha
from bank.nacha.transports import is_collectable
from bank.nacha.windows import EASTERN
from payments.banking_days import is_banking_day

ACCOUNT_NUMBER = "000123456789"
INJECTIONS = ("missing", "short", "extra")
EXTRA_CENTS = 12345


@dataclass
class StatementWritten:
    name: str
    lines: int
    injected: dict[str, str] = field(default_factory=dict)  # kind: what it was injected on


def settlement_day(day: date) -> date:
    """The banking day a bank posts what it wrote on ``day`` (a weekend's: the Monday)."""
    while not is_banking_day(day):
        day += timedelta(days=1)
    return day


def _files(directory: Path) -> list[Path]:
    found = []
    for folder in (directory, directory / "answered", directory / "processed"):
        if folder.is_dir():
            found += [p for p in folder.iterdir() if p.is_file() and is_collectable(p.name)]
    return sorted(found, key=lambda p: p.name)


def bank_statement_write(
    *,
    outbound: str,
    inbound: str,
    statements: str,
    day: date,
    inject: tuple[str, ...] = (),
    now: datetime | None = None,
) -> StatementWritten:
    unknown = set(inject) - set(INJECTIONS)
    if unknown:
        raise ValueError(f"unknown injection(s) {sorted(unknown)}; use {', '.join(INJECTIONS)}")
    now = (now or datetime.now(EASTERN)).astimezone(EASTERN)
    settlements: list[Line] = []
    for path in _files(Path(outbound)):
        parsed = parse_nacha(path.read_bytes())
        for batch in parsed.batches:
            view = batch.entries[0].batch if batch.entries else None
            if view is None or view.effective_entry_date != day:
                continue
            total = sum(e.amount_cents for e in batch.entries)
            if total == 0:
                continue  # prenotes alone: a zero-dollar entry moves no money, nothing posts
            settlements.append(
                Line(
                    "166",
                    total,
                    f"B{view.number:07d}",
                    path.name,
                    f"ACH SETTLEMENT {view.sec_code}",
                )
            )
    returns: list[Line] = []
    for path in _files(Path(inbound)):
        if not path.name.startswith("answers-"):
            continue
        parsed = parse_nacha(path.read_bytes())
        created = datetime.strptime(parsed.header["file_creation_date"], "%y%m%d").date()
        if settlement_day(created) != day:
            continue
        for entry in parsed.entries():
            addenda = entry.return_addenda
            if addenda is None or addenda["addenda_type_code"] != "99":
                continue  # a NOC moves no money
            trace = addenda["original_entry_trace_number"]
            code = addenda.text("return_reason_code")
            if entry.amount_cents == 0:
                continue  # a returned prenote moves no money either
            returns.append(Line("555", entry.amount_cents, "", trace, f"ACH RETURN {code}"))
    written = StatementWritten(name=f"statement-{day:%Y%m%d}.bai", lines=0)
    if "missing" in inject and settlements:
        dropped = settlements.pop(0)
        written.injected["missing"] = f"{dropped.customer_reference} {dropped.text}"
    if "short" in inject and settlements:
        first = settlements[0]
        settlements[0] = Line(
            first.type_code,
            first.amount_cents - 100,
            first.bank_reference,
            first.customer_reference,
            first.text,
        )
        written.injected["short"] = f"{first.customer_reference} {first.text}"
    lines = settlements + returns
    if "extra" in inject:
        lines.append(Line("166", EXTRA_CENTS, "X0000001", "", "INCOMING WIRE UNKNOWN"))
        written.injected["extra"] = "wire of 123.45"
    content = bai2_statement_write(
        sender="011000015",
        receiver="SANDBOXUS",
        account_number=ACCOUNT_NUMBER,
        as_of_date=day,
        created_at=now.replace(tzinfo=None),
        file_id=f"{day:%y%m%d}",
        lines=lines,
    )
    target = Path(statements)
    target.mkdir(parents=True, exist_ok=True)
    temporary = target / f".{written.name}.partial"
    temporary.write_bytes(content)
    os.replace(temporary, target / written.name)
    written.lines = len(lines)
    return written
