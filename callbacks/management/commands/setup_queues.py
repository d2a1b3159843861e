import argparse

from django.core.management.base import BaseCommand, CommandError

from callbacks import sqs
from callbacks.queues import MAX_RECEIVE_COUNT_DEFAULT, QueueSetupError, queues_ensure


def _non_negative_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
    if number < 0:
        raise argparse.ArgumentTypeError(f"expected zero or more, got {number}")
    return number


class Command(BaseCommand):
    help = (
        "Create or verify the main FIFO queue (SQS_QUEUE_NAME) and its FIFO dead-letter queue "
        "(SQS_DLQ_NAME): RedrivePolicy, visibility timeout, high-throughput FIFO, retention, "
        "SSE-SQS encryption. "
        "Idempotent; prints what it created, verified, changed or (with --dry-run) would change."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--visibility-timeout",
            type=_non_negative_int,
            default=None,
            metavar="SECONDS",
            help="Main queue visibility timeout (default: processor latency P99 x 2, floor 30).",
        )
        parser.add_argument(
            "--max-receive-count",
            type=_non_negative_int,
            default=MAX_RECEIVE_COUNT_DEFAULT,
            metavar="N",
            help="RedrivePolicy maxReceiveCount, above the worker's own attempt limit "
            f"(default {MAX_RECEIVE_COUNT_DEFAULT}).",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="Report what would change; change nothing."
        )

    def handle(self, *args, visibility_timeout, max_receive_count, dry_run, **options):
        try:
            lines = queues_ensure(
                visibility_timeout=visibility_timeout,
                max_receive_count=max_receive_count,
                dry_run=dry_run,
            )
        except (QueueSetupError, sqs.QueueUnavailable) as exc:
            raise CommandError(str(exc)) from exc
        for line in lines:
            self.stdout.write(line)
