"""Print a NACHA file's entries, one JSON object a line, without importing anything.

For a human looking at what the bank sent (or what we are about to send): no database, no
queue, no setting is read. A malformed file prints the refusal (record number and reason) on
stderr and exits 1, as the import would refuse it.
"""

import json
import sys

from django.core.management.base import BaseCommand, CommandError

from bank.nacha.parser import NachaFormatError, parse_nacha
from bank.nacha.summary import entry_summary


class Command(BaseCommand):
    help = (
        "Print each entry of a NACHA file as one JSON line (trace number, SEC code, amount in "
        "cents, transaction code, R- or C-code and original trace number of a return or NOC; "
        "the account number masked to its last 4 digits). Exits 1 on a malformed file."
    )
    requires_system_checks: list[str] = []
    requires_migrations_checks = False

    def add_arguments(self, parser):
        parser.add_argument("file", help="path of the NACHA file, or - for standard input")

    def handle(self, *args, **options):
        path = options["file"]
        try:
            if path == "-":
                data = sys.stdin.buffer.read()
            else:
                with open(path, "rb") as handle:
                    data = handle.read()
        except OSError as exc:
            raise CommandError(f"cannot read {path}: {exc.strerror}") from exc
        try:
            parsed = parse_nacha(data)
        except NachaFormatError as exc:
            raise CommandError(f"{path}: malformed NACHA file: {exc}") from exc
        for entry in parsed.entries():
            self.stdout.write(json.dumps(entry_summary(entry), separators=(",", ":")))
