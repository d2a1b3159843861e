"""Answer the NACHA files delivered to the directory transport, as a bank would (sandbox.bank)."""

from django.core.management.base import BaseCommand, CommandError

from bank import conf
from bank.nacha.transport_options import parse_transport
from sandbox.bank import bank_answer_files


class Command(BaseCommand):
    help = "Read the files in NACHA_TRANSPORT's outbound directory and write returns and NOCs."

    def handle(self, *args, **options):
        transport = parse_transport(conf.NACHA_TRANSPORT)
        if transport is None or transport["kind"] != "directory":
            raise CommandError("the sandbox bank needs BANK['NACHA_TRANSPORT'] of kind directory")
        written = bank_answer_files(outbound=transport["outbound"], inbound=transport["inbound"])
        self.stdout.write(f"wrote {len(written)} answer files: {', '.join(written) or '-'}")
