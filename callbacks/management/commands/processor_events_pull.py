"""Pull the processor's events after the stored cursor onto the queue: one pass, or a pass every
``--every SECONDS`` until stopped (a process rather than beat's task)."""

from django.core.management.base import CommandError
from django.db import close_old_connections

from callbacks.conf import SPECS
from callbacks.events_pull import PullOutcome, processor_events_cursor_set, processor_events_pull
from payments.management.rounds import RoundsCommand, whole_number


def _in_range_of(setting: str):
    """An option with the range of the setting it stands in for."""
    spec = SPECS[setting]
    return whole_number(int(spec.minimum), int(spec.maximum))


class Command(RoundsCommand):
    help = (
        "Read the processor's events (GET /v1/events) after the stored cursor and put each on "
        "the main queue as its callback would have been: an event whose callback never came "
        "is applied, one already applied is a duplicate. The cursor moves once a page is "
        "queued; one pass runs at a time."
    )

    def add_arguments(self, parser):
        super().add_arguments(parser)
        parser.add_argument(
            "--page-size",
            type=_in_range_of("PROCESSOR_EVENTS_PULL_PAGE_SIZE"),
            default=None,
            help="events asked for per page, 1-500 (default PROCESSOR_EVENTS_PULL_PAGE_SIZE)",
        )
        parser.add_argument(
            "--max-pages",
            type=_in_range_of("PROCESSOR_EVENTS_PULL_MAX_PAGES"),
            default=None,
            help="pages per pass at most, 1-10000 (default PROCESSOR_EVENTS_PULL_MAX_PAGES)",
        )
        parser.add_argument(
            "--set-cursor",
            metavar="CURSOR",
            default=None,
            help="store CURSOR (the processor's, opaque; '' = its first event) as where the next "
            "pass starts, and exit: where a host starts pulling instead of the processor's "
            "whole history",
        )

    def handle(self, *args, **options):
        if options["set_cursor"] is not None:
            try:
                was = processor_events_cursor_set(cursor=options["set_cursor"])
            except (ValueError, RuntimeError) as exc:
                raise CommandError(str(exc)) from exc
            self.stdout.write(
                f"the next pass starts after {options['set_cursor'] or '(the first event)'!r} "
                f"(was {was or '(the first event)'!r})"
            )
            return
        super().handle(*args, **options)

    def round(self, options) -> None:
        # A process that keeps pulling: a connection the database dropped since the last pass
        # (a restart, a failover) is replaced instead of failing every pass after it.
        close_old_connections()
        result = processor_events_pull(
            page_size=options["page_size"], max_pages=options["max_pages"]
        )
        if result.outcome in (PullOutcome.FAILED, PullOutcome.STALLED):
            raise CommandError(f"processor events pull {result.summary()}")
        if options["every"] and result.outcome == PullOutcome.DONE and not result.pulled:
            return  # a repeating process stays quiet when nothing came
        self.stdout.write(f"processor events pull {result.summary()}")
