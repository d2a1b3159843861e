from django.core.management.base import BaseCommand, CommandError

from callbacks import sqs
from callbacks.reconciliation import payments_reconcile


def _positive(value: str) -> int:
    import argparse

    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {number}")
    return number


class Command(BaseCommand):
    help = (
        "Check stuck payments (submitted too long, or pending after a timed-out submission) "
        "with the processor and publish what it knows to the main queue."
    )

    def add_arguments(self, parser):
        parser.add_argument("--limit", type=_positive, default=None, help="At most this many.")

    def handle(self, *args, limit=None, **options):
        try:
            published = payments_reconcile(limit=limit)
        except sqs.QueueUnavailable as exc:
            raise CommandError(f"could not publish to the queue: {exc}") from exc
        self.stdout.write(f"published events for {published} payment(s)")
