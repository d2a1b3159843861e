"""The bank demo's books: the sandbox bank writes its BAI2 statement of each banking day the
run touched, with a missing settlement, a short amount and an extra line injected on the first
day; the module imports and matches them (``bank_statements_collect``) and closes each day
(``books_close``). The check: exactly the injected variances are found, every other day
closes green, and ``books_close`` exits 1 only for the day with injections."""

from __future__ import annotations

import io
import json
from datetime import date
from pathlib import Path

INJECTED = ("missing", "short", "extra")
KIND_OF = {"missing": "missing_settlement", "short": "short_amount", "extra": "extra_line"}


def _days(inbound: Path) -> list[date]:
    from datetime import datetime

    from bank.nacha.models import NachaFile
    from bank.nacha.parser import parse_nacha
    from sandbox.statements import settlement_day

    days = set(
        NachaFile.objects.filter(delivered_at__isnull=False).values_list(
            "effective_entry_date", flat=True
        )
    )
    for folder in (inbound, inbound / "processed"):
        for path in folder.glob("answers-*") if folder.is_dir() else ():
            created = parse_nacha(path.read_bytes()).header["file_creation_date"]
            days.add(settlement_day(datetime.strptime(created, "%y%m%d").date()))
    return sorted(days)


def _close(day: date) -> tuple[int, list[dict]]:
    from django.core.management import call_command

    out = io.StringIO()
    try:
        call_command("books_close", "--date", day.isoformat(), stdout=out)
        code = 0
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    return code, [json.loads(line) for line in out.getvalue().splitlines()]


def books_check(*, outbound: str, inbound: str, statements: str) -> list[tuple[str, bool]]:
    """Write, import and close each day; the checks as (label, passed)."""
    from django.core.management import call_command

    from bank.books.models import BooksVariance
    from sandbox.statements import bank_statement_write

    days = _days(Path(inbound))
    if not days:
        return [("the books closed at least one banking day", False)]
    injected: dict[str, str] = {}
    for i, day in enumerate(days):
        written = bank_statement_write(
            outbound=outbound,
            inbound=inbound,
            statements=statements,
            day=day,
            inject=INJECTED if i == 0 else (),
        )
        if i == 0:
            injected = written.injected
    call_command("bank_statements_collect", "--min-age-seconds", "0", stdout=io.StringIO())
    closes = {day: _close(day) for day in days}
    found = sorted(BooksVariance.objects.filter(status="open").values_list("day", "kind"))
    wanted = sorted((days[0], KIND_OF[name]) for name in injected)
    print("\n  Books (BAI2 statements of the sandbox bank)")
    print("  " + "-" * 66)
    for day, (code, lines) in closes.items():
        totals = {k: sum(float(line[k]) for line in lines) for k in ("expected", "settled")}
        variances = sum(line["variances"] for line in lines)
        print(
            f"  {day}  expected {totals['expected']:.2f}  settled {totals['settled']:.2f}  "
            f"variances {variances}  books_close exit {code}"
        )
    print(f"  injected on {days[0]}: {', '.join(injected) or 'nothing'}")
    return [
        (
            f"the books found exactly the injected variances ({len(wanted)}) and no other",
            bool(wanted) and found == wanted,
        ),
        (
            f"books_close exits 1 for the day with injections, 0 for the other "
            f"{len(days) - 1} day(s)",
            closes[days[0]][0] == 1 and all(closes[d][0] == 0 for d in days[1:]),
        ),
    ]
