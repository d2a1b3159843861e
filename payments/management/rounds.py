"""A command that runs one round, or a round every ``--every SECONDS`` until stopped: a process
for a host (or the demo) that runs it so rather than from a scheduler. Pulling the processor's
events (``processor_events_pull``), sending bank files (``nacha_send``) and collecting them
(``nacha_collect``) are such rounds."""

import time

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError


def seconds(value: str) -> float:
    """An interval in seconds, 0 to a day."""
    number = float(value)
    if not 0 <= number <= 24 * 60 * 60:
        raise ValueError(value)
    return number


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
