"""``python manage.py run_sqs_worker``: consume the main FIFO queue (see callbacks.worker).

SIGTERM/SIGINT once: stop receiving, finish the current message, make the batch's unstarted
messages visible again, exit 0. A second signal exits at once with status 1 (``os._exit``: no
cleanup; in-flight messages reappear after their visibility timeout and are recognised by their
database records). A long poll in progress (up to ``--wait-time`` seconds) ends before the
worker notices the first signal; what it returns is released untouched.

``--metrics-port`` serves the process's own counters on ``/metrics`` while it runs
(``callbacks.metrics_server``).
"""

import argparse
import logging

from django.core.management.base import BaseCommand, CommandError

from callbacks import sqs
from callbacks.metrics_server import metrics_arguments_add, metrics_serving
from callbacks.worker import MAX_LINGER_SECONDS, Worker
from payments.selectors import recommended_visibility_timeout

logger = logging.getLogger(__name__)


def _int_range(low: int, high: int | None = None):
    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
        if number < low or (high is not None and number > high):
            bound = f"{low}-{high}" if high is not None else f"at least {low}"
            raise argparse.ArgumentTypeError(f"{number} is out of range ({bound})")
        return number

    return parse


def _seconds(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if not 0 <= number <= MAX_LINGER_SECONDS:  # also refuses nan
        raise argparse.ArgumentTypeError(f"{value} is out of range (0-{MAX_LINGER_SECONDS:g})")
    return number


def default_visibility_timeout() -> int:
    """The payments core's recommendation, derived from the processor's measured latency."""
    return int(recommended_visibility_timeout())


class Command(BaseCommand):
    help = "Consume the payments FIFO queue: submissions and processor events, exactly once."

    def add_arguments(self, parser):
        parser.add_argument(
            "--batch-size", type=_int_range(1, 10), default=10, help="Messages per receive (1-10)."
        )
        parser.add_argument(
            "--wait-time",
            type=_int_range(0, 20),
            default=20,
            help="Long-poll seconds per receive (0-20).",
        )
        parser.add_argument(
            "--visibility-timeout",
            type=_int_range(1, 43200),
            default=None,
            help="Seconds a received message stays hidden (renewed by a heartbeat while it "
            "is worked on). Default: the payments core's recommendation, else 30.",
        )
        parser.add_argument(
            "--until-empty",
            action="store_true",
            help="Stop when a receive returns nothing, the outbox is drained and no retry "
            "this worker scheduled is still due (tests, demos, benchmarks). Submissions "
            "deferred by the processor's open circuit breaker are not waited for (an outage has "
            "no known end): they stay hidden in the queue until a worker releases them, and the "
            "report counts them.",
        )
        parser.add_argument(
            "--max-messages",
            type=_int_range(1),
            default=None,
            help="Stop after handling this many messages.",
        )
        parser.add_argument(
            "--no-relay",
            action="store_false",
            dest="relay",
            help="Do not publish the outbox from this process.",
        )
        parser.add_argument(
            "--linger",
            type=_seconds,
            default=None,
            help="Seconds to wait after a batch that was not full before the next receive, so "
            "batches fill (default: WORKER_RECEIVE_LINGER_SECONDS, 0.02; 0 receives at once).",
        )
        metrics_arguments_add(parser)

    def handle(self, *args, **options):
        visibility_timeout = options["visibility_timeout"] or default_visibility_timeout()
        worker = Worker(
            batch_size=options["batch_size"],
            wait_time=options["wait_time"],
            visibility_timeout=visibility_timeout,
            until_empty=options["until_empty"],
            max_messages=options["max_messages"],
            relay=options["relay"],
            linger=options["linger"],
        )
        logger.info(
            "run_sqs_worker starting: batch %s, wait %s s, linger %s s, visibility %s s, relay %s",
            worker.batch_size,
            worker.wait_time,
            worker.linger,
            worker.visibility_timeout,
            "on" if worker.relay else "off",
        )
        try:
            with metrics_serving(port=options["metrics_port"], address=options["metrics_address"]):
                stats = worker.run()
        except sqs.QueueUnavailable as exc:
            raise CommandError(f"the queue is unavailable: {exc}") from exc
        summary = ", ".join(f"{k} {v}" for k, v in sorted(stats.outcomes.items())) or "none"
        self.stdout.write(
            f"run_sqs_worker stopped: {stats.processed} handled ({summary}), "
            f"{stats.deleted} deleted, {stats.released} released, {stats.deferred} deferred"
        )
