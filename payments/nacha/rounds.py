"""A bank-path command that runs one round, or a round every ``--every SECONDS`` until stopped:
a process for a host (or the demo) that runs it so rather than from a scheduler. Sending files
(``nacha_send``) and collecting them (``nacha_collect``) are such rounds."""

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


def non_negative(value: str) -> float:
    number = float(value)
    if number < 0:
        raise ValueError(value)
    return number


class DropCollectCommand(RoundsCommand):
    """A round that reads the whole files in one of the bank's drops (``nacha_collect``'s return
    and NOC files, ``bank_statements_collect``'s statements): ``collect(transport,
    min_age_seconds)`` does the work; a transport or key holder that fails stops the round with
    ``what`` named, and the next round does it (nothing was stored for what could not be sealed
    or opened). ``report(result, options)`` writes what came."""

    what = "collection"

    def add_arguments(self, parser):
        super().add_arguments(parser)
        parser.add_argument(
            "--min-age-seconds",
            type=non_negative,
            default=60.0,
            help="skip files changed more recently (the bank may still be writing); default 60",
        )

    def transport_open(self):
        from payments.nacha.transports import transport_open

        return transport_open()

    def collect(self, *, transport, min_age_seconds: float):
        raise NotImplementedError

    def report(self, result, options) -> None:
        raise NotImplementedError

    def round(self, options) -> None:
        from payments.nacha.transports import TransportError
        from payments.vault.crypto import VaultUnavailable

        transport = self.transport_open()
        try:
            result = self.collect(transport=transport, min_age_seconds=options["min_age_seconds"])
        except TransportError as exc:
            raise CommandError(f"{self.what} stopped: {exc}") from exc
        except VaultUnavailable as exc:
            raise CommandError(f"{self.what} stopped, vault unavailable: {exc}") from exc
        finally:
            transport.close()
        self.report(result, options)
