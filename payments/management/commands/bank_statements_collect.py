"""Collect the bank's BAI2 statements and match their lines against the books: one pass, or a
pass every ``--every SECONDS`` until stopped (as ``nacha_collect``)."""

from django.core.management.base import CommandError

from payments.books.conf import statement_transport_options
from payments.books.services import bank_statements_collect
from payments.nacha.rounds import RoundsCommand
from payments.nacha.transports import TransportError, transport_open
from payments.vault.crypto import VaultUnavailable


def non_negative(value: str) -> float:
    number = float(value)
    if number < 0:
        raise ValueError(value)
    return number


class Command(RoundsCommand):
    help = (
        "Read the whole statements in the bank's drop (PAYMENTS_BOOKS['STATEMENT_TRANSPORT']), "
        "store each sealed (a malformed one refused whole and kept), and match their lines."
    )

    def add_arguments(self, parser):
        super().add_arguments(parser)
        parser.add_argument(
            "--min-age-seconds",
            type=non_negative,
            default=60.0,
            help="skip files changed more recently (the bank may still be writing); default 60",
        )

    def round(self, options) -> None:
        transport_options = statement_transport_options()
        if transport_options is None:
            raise CommandError("PAYMENTS_BOOKS['STATEMENT_TRANSPORT'] is not set")
        transport = transport_open(transport_options)
        try:
            result = bank_statements_collect(
                transport=transport, min_age_seconds=options["min_age_seconds"]
            )
        except TransportError as exc:
            raise CommandError(f"statement collection stopped: {exc}") from exc
        except VaultUnavailable as exc:
            raise CommandError(f"statement collection stopped, vault unavailable: {exc}") from exc
        finally:
            transport.close()
        if options["every"] and not (result.imported or result.refused):
            return
        self.stdout.write(
            f"imported {len(result.imported)}, refused {len(result.refused)}, seen before "
            f"{len(result.seen_before)}; {result.matched} lines matched"
        )
        for name in result.refused:
            self.stderr.write(f"refused: {name} (kept; see the admin's bank statements)")
