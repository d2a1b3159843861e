from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from payments.models import AttemptOutcome, ProcessorAttempt
from payments.selectors import (
    percentile,
    processor_latency_summary,
    recommended_visibility_timeout,
)
from tests.factories import PaymentFactory

pytestmark = pytest.mark.django_db


def record_latencies(latencies_ms, *, age=timedelta(minutes=5)):
    payment = PaymentFactory()
    started = timezone.now() - age
    ProcessorAttempt.objects.bulk_create(
        ProcessorAttempt(
            payment=payment,
            attempt_number=n,
            idempotency_key=payment.idempotency_key,
            outcome=AttemptOutcome.ACCEPTED,
            http_status=201,
            latency_ms=latency,
            started_at=started,
        )
        for n, latency in enumerate(latencies_ms, start=1)
    )


def run(*args):
    out = StringIO()
    call_command("recommend_visibility_timeout", *args, stdout=out)
    return out.getvalue()


def test_percentile_interpolates_like_postgres():
    values = [100.0 * i for i in range(1, 101)]

    assert percentile(values, 0.5) == pytest.approx(5050.0)
    assert percentile(values, 0.99) == pytest.approx(9901.0)
    assert percentile([7.0], 0.99) == 7.0
    with pytest.raises(ValueError):
        percentile([], 0.5)


def test_command_prints_the_figures_from_recorded_attempts():
    record_latencies([100.0 * i for i in range(1, 101)])  # p99 9901 ms -> x2 = 19.8 s
    record_latencies([900_000.0], age=timedelta(hours=30))  # outside the 24 h window

    out = run("--floor", "5")

    assert "processor calls: 100" in out
    assert "p50: 5050.0 ms" in out
    assert "p99: 9901.0 ms" in out
    assert "floor: 5 s" in out
    assert "recommended visibility timeout: 20 s (p99 x 2)" in out


def test_floor_wins_over_a_fast_processor():
    record_latencies([100.0 * i for i in range(1, 101)])

    out = run()

    assert "recommended visibility timeout: 30 s (floor)" in out
    assert recommended_visibility_timeout() == 30
    assert recommended_visibility_timeout(floor=10) == 20


def test_window_option_takes_older_attempts_in():
    record_latencies([100.0 * i for i in range(1, 101)])
    record_latencies([60_000.0] * 10, age=timedelta(hours=30))

    out = run("--window-hours", "48", "--floor", "5")

    assert "processor calls: 110" in out
    assert "recommended visibility timeout: 120 s (p99 x 2)" in out


def test_no_recorded_attempts_gives_the_floor():
    out = run("--floor", "45")

    assert "processor calls: 0" in out
    assert "recommended visibility timeout: 45 s (floor)" in out
    assert processor_latency_summary().p99_ms is None


def test_invalid_options_are_refused():
    with pytest.raises(CommandError, match="window-hours"):
        run("--window-hours", "0")
    with pytest.raises(CommandError, match="floor"):
        run("--floor", "-1")
