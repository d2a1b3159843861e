"""Create (or find) the Celery broker's standard SQS queue and print its URL.

Celery's SQS transport is given the queue's URL in ``predefined_queues`` (it then never lists or
creates queues itself), so the URL must be the one SQS returns: on AWS
``https://sqs.<region>.amazonaws.com/<account>/<name>``, on the local server its own form. Put the
printed ``CELERY_SQS_QUEUE_URL=...`` line in the environment of the Celery worker and beat (where
it is missing, they look it up the same way when they start).
"""

from django.core.management.base import BaseCommand, CommandError

from callbacks.celery_queue import CeleryQueueError, celery_queue_ensure


class Command(BaseCommand):
    help = "Create or verify the standard SQS queue Celery uses as its broker; print its URL."

    def add_arguments(self, parser):
        parser.add_argument(
            "--visibility-timeout",
            type=int,
            default=None,
            help="Seconds (default: the broker's CELERY_SQS_VISIBILITY_TIMEOUT, or 300).",
        )

    def handle(self, *args, visibility_timeout=None, **options):
        try:
            url = celery_queue_ensure(visibility_timeout=visibility_timeout)
        except CeleryQueueError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"CELERY_SQS_QUEUE_URL={url}")
