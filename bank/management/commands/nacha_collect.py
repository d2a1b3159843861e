"""Collect the bank's return and NOC files and put their events on the queue: one round, or
a round every ``--every SECONDS`` until stopped (a process rather than a scheduler's task)."""

from bank.collect import nacha_files_collect
from bank.management.rounds import DropCollectCommand
from bank.nacha.received import received_name_shown


class Command(DropCollectCommand):
    help = (
        "Read the whole files in the bank's drop (BANK['NACHA_TRANSPORT']), store each "
        "(a malformed one refused whole and kept), and publish their events to the queue."
    )

    def collect(self, *, transport, min_age_seconds: float):
        return nacha_files_collect(transport=transport, min_age_seconds=min_age_seconds)

    def report(self, result, options) -> None:
        if options["every"] and not (result.imported or result.refused or result.set_aside):
            return  # a repeating process stays quiet when nothing came
        self.stdout.write(
            f"imported {len(result.imported)}, refused {len(result.refused)}, seen before "
            f"{len(result.seen_before)}; {result.published} events queued, "
            f"{result.dead_lettered} dead-lettered (unknown trace number)"
        )
        for name in result.refused:
            shown = received_name_shown(name)
            self.stderr.write(f"refused: {shown} (kept; see the admin's inbound NACHA files)")
        for name in result.set_aside:
            shown = received_name_shown(name)
            self.stderr.write(f"set aside unread: {shown} (not a regular file; see the alert)")
