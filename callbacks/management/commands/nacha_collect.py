"""Collect the bank's return and NOC files and put their events on the queue: one round, or
a round every ``--every SECONDS`` until stopped (a process rather than a scheduler's task)."""

from django.core.management.base import CommandError

from callbacks.nacha_inbound import nacha_files_collect
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
        "Read the whole files in the bank's drop (PAYMENTS['NACHA_TRANSPORT']), store each "
        "(a malformed one refused whole and kept), and publish their events to the queue."
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
        transport = transport_open()
        try:
            result = nacha_files_collect(
                transport=transport, min_age_seconds=options["min_age_seconds"]
            )
        except TransportError as exc:
            raise CommandError(f"collection stopped: {exc}") from exc
        except VaultUnavailable as exc:
            # Nothing was stored for what the key holder could not seal or open: the next
            # round does it.
            raise CommandError(f"collection stopped, vault unavailable: {exc}") from exc
        finally:
            transport.close()
        if options["every"] and not (result.imported or result.refused or result.set_aside):
            return  # a repeating process stays quiet when nothing came
        self.stdout.write(
            f"imported {len(result.imported)}, refused {len(result.refused)}, seen before "
            f"{len(result.seen_before)}; {result.published} events queued, "
            f"{result.dead_lettered} dead-lettered (unknown trace number)"
        )
        for name in result.refused:
            self.stderr.write(f"refused: {name} (kept; see the admin's inbound NACHA files)")
        for name in result.set_aside:
            self.stderr.write(f"set aside unread: {name} (not a regular file; see the alert)")
