"""Size the SQS visibility timeout from recorded processor latencies: P99 x 2, with a floor."""

from datetime import timedelta

from django.core.management.base import BaseCommand

from payments.selectors import (
    VISIBILITY_FLOOR_DEFAULT,
    processor_latency_summary,
    visibility_timeout_from,
)


def positive_float(value: str) -> float:
    number = float(value)
    if number <= 0:
        raise ValueError(value)
    return number


def non_negative_int(value: str) -> int:
    number = int(value)
    if number < 0:
        raise ValueError(value)
    return number


class Command(BaseCommand):
    help = (
        "Recommend the SQS visibility timeout: P99 of the processor call latencies recorded in "
        "the window, times two, never below the floor. Prints the figures it used."
    )

    def add_arguments(self, parser):
        parser.add_argument("--window-hours", type=positive_float, default=24.0, help="default 24")
        parser.add_argument(
            "--floor",
            type=non_negative_int,
            default=VISIBILITY_FLOOR_DEFAULT,
            help=f"seconds; default {VISIBILITY_FLOOR_DEFAULT}",
        )

    def handle(self, *args, **options):
        window = timedelta(hours=options["window_hours"])
        floor = options["floor"]
        summary = processor_latency_summary(window=window)
        result = visibility_timeout_from(summary, floor=floor)
        self.stdout.write(f"window: {options['window_hours']:g} h")
        self.stdout.write(f"processor calls: {summary.count}")
        if summary.count:
            self.stdout.write(f"p50: {summary.p50_ms:.1f} ms")
            self.stdout.write(f"p99: {summary.p99_ms:.1f} ms")
            self.stdout.write(f"p99 x 2: {summary.p99_ms * 2 / 1000:.3f} s")
        else:
            self.stdout.write("p50: n/a\np99: n/a (no calls recorded in the window)")
        self.stdout.write(f"floor: {floor} s")
        basis = "floor" if summary.p99_ms is None or result == floor else "p99 x 2"
        self.stdout.write(f"recommended visibility timeout: {result} s ({basis})")
