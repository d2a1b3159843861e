"""Cut the file of the window that is closing, deliver every file not yet delivered, and
settle the entries whose effective entry date has passed (``nacha_send_due``).

Run it every few minutes (cron, or beat's ``bank.tasks.nacha_send``): it cuts only when
the next window's bank cutoff is within ``--lead-minutes`` (``--now`` cuts at once), and each
file is delivered once, whatever ran before. ``--every SECONDS`` keeps it running, a round
each interval, for a host (or the demo) that runs it as a process rather than from a scheduler.
"""

from datetime import timedelta

from django.core.management.base import CommandError
from django.utils import timezone

from bank.nacha.services import nacha_send_due
from bank.nacha.transports import TransportError, transport_open
from bank.vault.crypto import VaultUnavailable
from bank.vault.services import vault_account_reveal
from payments.management.rounds import RoundsCommand


def minutes(value: str) -> float:
    number = float(value)
    if not 0 <= number <= 24 * 60:
        raise ValueError(value)
    return number


class Command(RoundsCommand):
    help = "Cut the closing window's NACHA file and deliver the files not yet delivered."

    def add_arguments(self, parser):
        super().add_arguments(parser)
        parser.add_argument("--lead-minutes", type=minutes, default=10.0, help="default 10")
        parser.add_argument("--now", action="store_true", help="cut at once, whatever the window")

    def round(self, options) -> None:
        lead = None if options["now"] else timedelta(minutes=options["lead_minutes"])
        transport = transport_open()
        try:
            result = nacha_send_due(
                now=timezone.now(),
                transport=transport,
                resolve_account=vault_account_reveal,
                lead=lead,
            )
        except TransportError as exc:
            raise CommandError(f"delivery stopped: {exc}") from exc
        except VaultUnavailable as exc:
            # Nothing was stored for what the key holder could not seal or open: the next
            # round does it.
            raise CommandError(f"delivery stopped, vault unavailable: {exc}") from exc
        finally:
            transport.close()
        cut = result.cut
        if cut.file is not None:
            self.stdout.write(f"cut {cut.file.name}: {cut.file.entry_count} entries")
        elif not options["every"]:  # a repeating process stays quiet when nothing happened
            self.stdout.write(
                f"nothing cut; next window {cut.window.name} closes at "
                f"{cut.window.bank_cutoff.isoformat()}"
            )
        for entry in cut.refused:
            self.stderr.write(f"refused entry {entry.trace_number}: {entry.refused_reason}")
        for delivered in result.delivered:
            self.stdout.write(f"delivered {delivered.name} to {delivered.delivered_to}")
        if result.settled:
            self.stdout.write(f"{result.settled} entries past their effective date: settled")
