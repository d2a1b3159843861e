"""``manage.py risk_report --from 2026-01-01 --to 2026-12-31 [--format csv|jsonl]``: the figures
of the annual review of the risk controls, per merchant and rule (``payments.risk_report``), to
standard output."""

from __future__ import annotations

import csv
import json
from argparse import ArgumentTypeError
from datetime import date

from django.core.management.base import BaseCommand, CommandError

from payments.risk_report import COLUMNS, risk_report_records

FORMATS = ("csv", "jsonl")
# A report over more than ten years is a mistake in a date, not a review.
MAX_DAYS = 3660


def report_day(value: str) -> date:
    """A day as ``YYYY-MM-DD`` (ASCII digits)."""
    if len(value) != 10 or not value.isascii():
        raise ArgumentTypeError(f"{value[:40]!r} is not a day such as 2026-12-31")
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise ArgumentTypeError(f"{value[:40]!r} is not a day such as 2026-12-31") from None


class Command(BaseCommand):
    help = (
        "The risk report of a period (UTC days, both included): per merchant and rule, payments "
        "checked, held, approved and rejected; returns by category against NACHA's thresholds; "
        "exposure-limit changes. CSV (one header, a 'record' column) or JSON lines."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--from", dest="start", type=report_day, required=True, help="first day, YYYY-MM-DD"
        )
        parser.add_argument(
            "--to", dest="end", type=report_day, required=True, help="last day, YYYY-MM-DD"
        )
        parser.add_argument("--format", choices=FORMATS, default="csv", help="default csv")

    def handle(self, *args, start: date, end: date, format: str, **options):
        if end < start:
            raise CommandError(f"--to {end} is before --from {start}")
        if (end - start).days >= MAX_DAYS:
            raise CommandError(f"--from {start} --to {end}: at most {MAX_DAYS} days")
        records = risk_report_records(start=start, end=end)
        if format == "jsonl":
            for record in records:
                self.stdout.write(json.dumps(record, sort_keys=True, default=str))
            return
        writer = csv.DictWriter(self.stdout, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        for record in records:
            writer.writerow({key: csv_cell(value) for key, value in record.items()})


# A spreadsheet runs a cell that starts with one of these as a formula (CSV injection).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value):
    """A record's value as a CSV cell: a dict as JSON; a text a person wrote (a note, a user
    name) that a spreadsheet would read as a formula, quoted with a leading apostrophe."""
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value
