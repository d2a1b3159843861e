"""The settlement window: the weekly hours when the processor's T+1 batch lands.

``SETTLEMENT_WINDOW`` (e.g. ``Mon-Fri 05:00-08:00 America/Chicago``) is parsed strictly here;
alerting keeps low-severity (backlog) alerts quiet inside it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, time
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.core.exceptions import ImproperlyConfigured

DAY_NAMES = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_WINDOW_RE = re.compile(
    r"^(?P<days>[A-Za-z,\-]+)\s+(?P<start>\d{2}:\d{2})-(?P<end>\d{2}:\d{2})\s+(?P<tz>\S+)$"
)


@dataclass(frozen=True)
class SettlementWindow:
    """Weekly window, e.g. ``Mon-Fri 05:00-08:00 America/Chicago``.

    Days are names (``Mon``..``Sun``), ranges (``Mon-Fri``, ``Sat-Mon`` wraps) or comma lists.
    An end before the start crosses midnight; the day names the day the window opens.
    """

    days: frozenset[int]
    start: time
    end: time
    tz: ZoneInfo
    text: str

    def contains(self, moment: datetime) -> bool:
        local = moment.astimezone(self.tz)
        clock = local.time().replace(tzinfo=None)
        weekday = local.weekday()
        if self.start < self.end:
            return weekday in self.days and self.start <= clock < self.end
        # Crosses midnight: the evening part of an open day, or the morning after one.
        if weekday in self.days and clock >= self.start:
            return True
        return (weekday - 1) % 7 in self.days and clock < self.end


def _window_error(text: str, problem: str) -> ImproperlyConfigured:
    return ImproperlyConfigured(
        f"SETTLEMENT_WINDOW {text!r}: {problem}. Expected '<days> <HH:MM>-<HH:MM> <IANA zone>', "
        "such as 'Mon-Fri 05:00-08:00 America/Chicago', or an empty value for no window."
    )


def _parse_day(text: str, name: str) -> int:
    try:
        return DAY_NAMES.index(name.capitalize())
    except ValueError:
        raise _window_error(text, f"unknown day {name!r} (use {', '.join(DAY_NAMES)})") from None


def _parse_clock(text: str, value: str) -> time:
    hours, minutes = (int(part) for part in value.split(":"))
    if hours > 23 or minutes > 59:
        raise _window_error(text, f"{value!r} is not a time of day")
    return time(hours, minutes)


def settlement_window_parse(text: str | None) -> SettlementWindow | None:
    """Parse the setting strictly; ``None`` or blank means no window. Raises
    ``ImproperlyConfigured`` naming ``SETTLEMENT_WINDOW`` and what is wrong."""
    if text is None or not text.strip():
        return None
    match = _WINDOW_RE.match(text.strip())
    if match is None:
        raise _window_error(text, "not in the expected form")
    days = _parse_days(text, match["days"])
    start = _parse_clock(text, match["start"])
    end = _parse_clock(text, match["end"])
    if start == end:
        raise _window_error(text, "the window starts and ends at the same time")
    try:
        tz = ZoneInfo(match["tz"])
    except (ZoneInfoNotFoundError, ValueError):
        raise _window_error(text, f"unknown time zone {match['tz']!r}") from None
    return SettlementWindow(days, start, end, tz, text.strip())


def _parse_days(text: str, spec: str) -> frozenset[int]:
    """``Mon-Fri``, ``Sat-Mon`` (wrapping) or ``Mon,Wed``: the weekdays (0 = Monday) it names."""
    days: set[int] = set()
    for part in spec.split(","):
        if not part:
            raise _window_error(text, "empty day in the day list")
        if "-" in part:
            first, _, last = part.partition("-")
            if not first or not last or "-" in last:
                raise _window_error(text, f"bad day range {part!r}")
            a, b = _parse_day(text, first), _parse_day(text, last)
            day = a
            days.add(day)
            while day != b:
                day = (day + 1) % 7
                days.add(day)
        else:
            days.add(_parse_day(text, part))
    return frozenset(days)
