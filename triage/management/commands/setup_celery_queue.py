"""Create (or find) the Celery broker's standard SQS queue and print its URL.

Celery's SQS transport is given the queue's URL in ``predefined_queues`` (it then never lists or
creates queues itself), so the URL must be the one SQS's GetQueueUrl returns: on AWS
``https://sqs.<region>.amazonaws.com/<account>/<name>``, on the local server its own form. Put the
printed ``CELERY_SQS_QUEUE_URL=...`` line in the environment of the Celery worker and beat.
"""

from botocore.exceptions import BotoCoreError, ClientError
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from callbacks import sqs


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
        name = settings.CELERY_SQS_QUEUE_NAME
        if name.endswith(".fifo"):
            raise CommandError(
                f"CELERY_SQS_QUEUE_NAME {name!r} names a FIFO queue; Celery's queue is a "
                "standard queue (drop the .fifo suffix)"
            )
        transport = getattr(settings, "CELERY_BROKER_TRANSPORT_OPTIONS", {})
        timeout = visibility_timeout or transport.get("visibility_timeout", 300)
        if not 0 <= timeout <= 43200:
            raise CommandError(f"--visibility-timeout must be 0..43200 seconds, got {timeout}")
        try:
            url = sqs.sqs_client().create_queue(
                QueueName=name,
                Attributes={"VisibilityTimeout": str(timeout)},
            )["QueueUrl"]
        except ClientError as exc:
            error = exc.response.get("Error", {})
            raise CommandError(
                f"SQS refused to create queue {name!r}: {error.get('Code')} "
                f"{error.get('Message', '')}"
            ) from exc
        except BotoCoreError as exc:
            raise CommandError(f"cannot reach SQS to create queue {name!r}: {exc}") from exc
        self.stdout.write(f"CELERY_SQS_QUEUE_URL={url}")
