"""Collect the bank's BAI2 statements and match their lines against the books: one pass, or a
pass every ``--every SECONDS`` until stopped (as ``nacha_collect``)."""

from django.core.management.base import CommandError

from bank.books.conf import statement_transport_options
from bank.books.services import bank_statements_collect
from bank.management.rounds import DropCollectCommand
from bank.nacha.received import received_name_shown


class Command(DropCollectCommand):
    help = (
        "Read the whole statements in the bank's drop (BANK['BOOKS_STATEMENT_TRANSPORT']), "
        "store each sealed (a malformed one refused whole and kept), and match their lines."
    )
    what = "statement collection"

    def transport_open(self):
        from bank.nacha.transports import transport_open

        options = statement_transport_options()
        if options is None:
            raise CommandError("BANK['BOOKS_STATEMENT_TRANSPORT'] is not set")
        return transport_open(options)

    def collect(self, *, transport, min_age_seconds: float):
        return bank_statements_collect(transport=transport, min_age_seconds=min_age_seconds)

    def report(self, result, options) -> None:
        if options["every"] and not (result.imported or result.refused):
            return
        self.stdout.write(
            f"imported {len(result.imported)}, refused {len(result.refused)}, seen before "
            f"{len(result.seen_before)}; {result.matched} lines matched"
        )
        for name in result.refused:
            shown = received_name_shown(name)
            self.stderr.write(f"refused: {shown} (kept; see the admin's bank statements)")
