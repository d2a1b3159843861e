"""Write the sandbox bank's BAI2 statement of one banking day (sandbox.statements) into the
books' statement directory, with variances injected on demand."""

from datetime import date

from django.core.management.base import BaseCommand, CommandError

from bank import conf
from bank.books.conf import statement_transport_options
from bank.nacha.transport_options import parse_transport
from sandbox.statements import INJECTIONS, bank_statement_write


def injections(value: str) -> tuple[str, ...]:
    names = tuple(name for name in value.split(",") if name)
    if set(names) - set(INJECTIONS):
        raise ValueError(value)
    return names


class Command(BaseCommand):
    help = "Write the sandbox bank's statement of a day: settlements of the files it received."

    def add_arguments(self, parser):
        parser.add_argument("--date", type=date.fromisoformat, required=True)
        parser.add_argument(
            "--inject",
            type=injections,
            default=(),
            help=f"comma-separated, of: {', '.join(INJECTIONS)}",
        )

    def handle(self, *args, **options):
        nacha = parse_transport(conf.NACHA_TRANSPORT)
        statements = statement_transport_options()
        if nacha is None or nacha["kind"] != "directory":
            raise CommandError("the sandbox bank needs BANK['NACHA_TRANSPORT'] of kind directory")
        if statements is None or statements["kind"] != "directory":
            raise CommandError(
                "the sandbox bank needs BANK['BOOKS_STATEMENT_TRANSPORT'] of kind directory"
            )
        written = bank_statement_write(
            outbound=nacha["outbound"],
            inbound=nacha["inbound"],
            statements=statements["inbound"],
            day=options["date"],
            inject=options["inject"],
        )
        injected = ", ".join(f"{k} ({v})" for k, v in written.injected.items()) or "nothing"
        self.stdout.write(f"wrote {written.name}: {written.lines} lines; injected {injected}")
