import argparse
import logging
import signal
import threading

from django.core.management.base import BaseCommand
from django.db import DatabaseError, close_old_connections

from callbacks.metrics_server import metrics_arguments_add, metrics_serving
from callbacks.outbox import outbox_relay_publish

logger = logging.getLogger(__name__)


def _positive_float(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {value!r}") from None
    if not number > 0:
        raise argparse.ArgumentTypeError(f"expected more than 0 seconds, got {value}")
    return number


def _positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"expected at least 1, got {number}")
    return number


class Command(BaseCommand):
    help = (
        "Publish committed outbox rows to the FIFO queue, oldest first, until stopped. "
        "run_sqs_worker also relays on each loop; this command is for deployments that want a "
        "dedicated relay. SIGTERM/SIGINT finish the current batch and exit 0."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--interval",
            type=_positive_float,
            default=1.0,
            metavar="SECONDS",
            help="Pause between rounds when the outbox is drained (default 1).",
        )
        parser.add_argument(
            "--limit",
            type=_positive_int,
            default=500,
            help="Rows published per round at most (default 500).",
        )
        parser.add_argument("--once", action="store_true", help="Run one round and exit.")
        metrics_arguments_add(parser)

    def handle(self, *args, interval, limit, once, metrics_port, metrics_address, **options):
        with metrics_serving(port=metrics_port, address=metrics_address):
            self._run(interval=interval, limit=limit, once=once)

    def _run(self, *, interval: float, limit: int, once: bool) -> None:
        if once:
            published = outbox_relay_publish(limit=limit)
            self.stdout.write(f"published {published} outbox rows")
            return

        stop = threading.Event()

        def request_stop(signum, frame):
            if stop.is_set():
                raise SystemExit(1)  # second signal: leave at once
            logger.info("outbox relay stopping after the current round (signal %s)", signum)
            stop.set()

        previous = {
            sig: signal.signal(sig, request_stop) for sig in (signal.SIGTERM, signal.SIGINT)
        }
        try:
            total = self._loop(stop, interval=interval, limit=limit)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        self.stdout.write(f"outbox relay stopped; published {total} outbox rows")

    def _loop(self, stop: threading.Event, *, interval: float, limit: int) -> int:
        self.stdout.write(f"outbox relay running (interval {interval} s, limit {limit})")
        self.stdout.flush()
        total = 0
        while not stop.is_set():
            close_old_connections()
            try:
                published = outbox_relay_publish(limit=limit)
            except DatabaseError:
                # The rows stay in the outbox; the next round tries again.
                logger.exception("outbox relay round failed on the database; retrying")
                published = 0
            total += published
            # A full round means more may be waiting: go again without pausing.
            if published < limit:
                stop.wait(interval)
        close_old_connections()
        return total
