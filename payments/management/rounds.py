"""A command that runs one round, or a round every ``--every SECONDS`` until stopped: a process
for a host (or the demo) that runs it so rather than from a scheduler. Pulling the processor's
events (``processor_events_pull``), sending bank files (``nacha_send``) and collecting them
(``nacha_collect``) are such rounds."""

import argparse
import re
import time
from collections.abc import Callable

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

# Where an option has digits it has ASCII digits: ``float`` and ``int`` also read full-width
# and Arabic-Indic ones, and ``float`` reads "nan", "inf" and "1e400".
_DECIMAL = re.compile(r"[0-9]{1,12}(?:\.[0-9]{1,6})?")
_WHOLE = re.compile(r"[0-9]{1,12}")


def seconds(value: str) -> float:
    """An interval in seconds, 0 to a day, written in digits 0-9."""
    if not _DECIMAL.fullmatch(value) or not 0 <= (number := float(value)) <= 24 * 60 * 60:
        raise argparse.ArgumentTypeError(
            f"{value[:32]!r} is not a number of seconds from 0 to 86400 (digits 0-9)"
        )
    return number


def whole_number(minimum: int, maximum: int) -> Callable[[str], int]:
    """An option's type: a whole number from ``minimum`` to ``maximum``, written in digits
    0-9; argparse's usage error names the option and the range."""

    def parse(value: str) -> int:
        if not _WHOLE.fullmatch(value) or not minimum <= (number := int(value)) <= maximum:
            raise argparse.ArgumentTypeError(
                f"{value[:32]!r} is not a whole number from {minimum} to {maximum} (digits 0-9)"
            )
        return number

    return parse


class RoundsCommand(BaseCommand):
    """Subclasses add their own arguments after calling ``super().add_arguments`` and do one
    round in ``round(options)``, which must be idempotent."""

    def add_arguments(self, parser):
        parser.add_argument(
            "--every",
            type=seconds,
            default=0.0,
            metavar="SECONDS",
            help="repeat a round every SECONDS until stopped (default: one round)",
        )

    def handle(self, *args, **options):
        if not options["every"]:
            self.round(options)
            return
        while True:
            # A process that keeps running: a round that fails (the transport or the database
            # away) is reported and the next one tries again; each round is idempotent.
            try:
                self.round(options)
            except (CommandError, DatabaseError) as exc:
                self.stderr.write(f"round failed, trying again: {exc}")
            time.sleep(options["every"])

    def round(self, options) -> None:
        raise NotImplementedError
