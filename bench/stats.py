"""Small statistics for the report: percentiles, rates, backlog trend."""

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], pct: float) -> float | None:
    """The nearest-rank percentile (``pct`` in 0..100); None for no values."""
    if not values:
        return None
    if not 0 <= pct <= 100:
        raise ValueError(f"percentile must be within 0..100, got {pct}")
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]


def rate(count: int, first: float | None, last: float | None) -> float | None:
    """Events per second between the first and the last completion: ``count - 1`` intervals."""
    if count < 2 or first is None or last is None or last <= first:
        return None
    return (count - 1) / (last - first)


def ratio(value: float | None, baseline: float | None) -> float | None:
    if value is None or not baseline:
        return None
    return value / baseline


def slope(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of (t, y) points: how fast y grows per unit of t."""
    if len(points) < 2:
        return 0.0
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    if var == 0:
        return 0.0
    return sum((t - mean_t) * (y - mean_y) for t, y in points) / var


def backlog_trend(points: Sequence[tuple[float, float]], *, settle: float = 3.0) -> float:
    """The backlog's growth per second after the first ``settle`` seconds of a step."""
    if not points:
        return 0.0
    settled = [(t, y) for t, y in points if t >= points[0][0] + settle]
    return slope(settled if len(settled) >= 2 else points)


def backlog_grows(
    points: Sequence[tuple[float, float]], offered_rate: float, *, settle: float = 3.0
) -> bool:
    """Whether the queue backlog kept growing during a step at ``offered_rate`` messages/s.

    Growing means the backlog is still there at the end (more than half a second of offered
    work, at least 20 messages) and trended upwards after the first ``settle`` seconds (in-flight
    messages ramp up when a step starts) by more than 2 % of the offered rate (at least 5
    messages/s); or more than two seconds of offered work is queued at the end whatever the
    trend. A backlog that wobbles around a small level, or a stall the system drained before
    the step ended, is a system keeping up.
    """
    if not points:
        return False
    trend = backlog_trend(points, settle=settle)
    final = points[-1][1]
    if final > 2 * offered_rate:
        return True
    return final > max(20.0, 0.5 * offered_rate) and trend > max(5.0, 0.02 * offered_rate)
