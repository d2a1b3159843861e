"""``python manage.py ingest_dlq``: move dead letters from the DLQ into the database."""

import argparse

from django.core.management.base import BaseCommand, CommandError

from callbacks import sqs
from triage.ingestion import dead_letters_ingest


def _positive(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"{number} must be at least 1")
    return number


class Command(BaseCommand):
    help = (
        "Receive messages from the dead-letter queue, store each as a dead letter (idempotent "
        "on its original message id), raise an alert for each new one, then delete it from the "
        "DLQ."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--max-messages",
            type=_positive,
            default=100,
            help="Take at most this many messages from the DLQ (default 100).",
        )

    def handle(self, *args, max_messages: int, **options):
        try:
            stored = dead_letters_ingest(max_messages=max_messages)
        except sqs.QueueUnavailable as exc:
            raise CommandError(f"the dead-letter queue is unavailable: {exc}") from exc
        self.stdout.write(f"{stored} new dead letter(s) stored")
