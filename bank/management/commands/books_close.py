"""Close, or check again, one banking day of the books: one JSON line per merchant and currency
(``merchant_id``, ``currency``, ``expected``, ``settled``, ``returned``, ``variances``: the
count of unexplained ones); exit 0 when there are none, 1 when there are. A day the bank has
not reported yet is checked as far as it goes (``reported_by_bank`` false). The bank account's
own variances (a bank line matching nothing of ours) are the line whose ``merchant_id`` is
null."""

import argparse
import json
import sys
from datetime import date

from django.core.management.base import BaseCommand

from bank.books.days import books_day_parse
from bank.books.selectors import books_day_figures, day_reported
from bank.books.services import books_day_check


def books_day(value: str) -> date:
    try:
        return books_day_parse(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{value[:32]!r}: {exc}") from None


class Command(BaseCommand):
    help = "Match and check one banking day; print its figures as JSON lines; exit 1 on variances."

    def add_arguments(self, parser):
        parser.add_argument(
            "--date",
            type=books_day,
            required=True,
            metavar="YYYY-MM-DD",
            help="the banking day, 2000-01-01 to the second banking day ahead, digits 0-9",
        )

    def handle(self, *args, **options):
        day = options["date"]
        books_day_check(day=day)
        reported = day_reported(day)
        figures = books_day_figures(day=day)
        for row in figures:
            self.stdout.write(json.dumps(row.as_json(day=day, reported=reported)))
        if any(row.variances for row in figures):
            sys.exit(1)
