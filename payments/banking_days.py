"""Banking days: the days the Federal Reserve Banks are open, and so the days ACH settles on.

Every banking-day figure of the module (a return's time frame, the ``late return`` flag) is
counted here, so a holiday shifts each of them the same way. The holidays are the Federal
Reserve's own calendar as the ``holidays`` package ships it (``holidays.financial``, market
``XFED``), kept up to date there rather than typed in by hand: New Year's Day, Martin Luther
King Jr.'s birthday, Washington's birthday, Memorial Day, Juneteenth, Independence Day, Labor
Day, Columbus Day, Veterans Day, Thanksgiving and Christmas. A holiday on a Sunday closes the
Monday after; one on a Saturday closes nothing: the Reserve Banks stay open the Friday before
(unlike the federal-employee calendar, which closes that Friday). The package covers 1999 to
2100; outside those years only weekends are skipped.

A day is a date in Eastern time (``America/New_York``, daylight saving included), where the
Federal Reserve and NACHA's rules keep their clock: a return received at 02:00 UTC on a Friday
arrived on Thursday evening, and a deadline "by the end of the banking day" ends at midnight in
New York (04:00 or 05:00 UTC), not at midnight UTC. A moment is converted before its date is
read; a naive datetime is taken as Eastern already, and a ``date`` is that date.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo

import holidays

FEDERAL_RESERVE_MARKET = "XFED"
# The Federal Reserve's and NACHA's clock: banking days begin and end at midnight here.
ACH_TIME_ZONE = ZoneInfo("America/New_York")


@lru_cache(maxsize=256)
def _holidays_of(year: int) -> frozenset[date]:
    """The Fed's closed days of ``year``. The package's calendar fills itself in as years are
    asked for; a frozen set per year is computed once and is safe to share between threads."""
    return frozenset(holidays.financial_holidays(FEDERAL_RESERVE_MARKET, years=year))


# The contract accepts any timestamp datetime can hold (year 1 to 9999): the calendar's arithmetic
# saturates at its ends instead of raising on a processor's nonsense date.
_LAST_DAY = date.max - timedelta(days=1)  # its end in New York is still a representable UTC time
_LAST_MOMENT = datetime.max.replace(tzinfo=UTC)


def ach_date(value: date) -> date:
    """The banking calendar's date of ``value``: an aware moment's date in Eastern time."""
    if not isinstance(value, datetime):
        return value
    if value.tzinfo is not None:
        try:
            value = value.astimezone(ACH_TIME_ZONE)
        except OverflowError:  # the first hours of year 1: before any calendar that matters
            pass
    return value.date()


def end_of_banking_day(day: date) -> datetime:
    """The last moment of ``day`` in Eastern time, as an aware datetime."""
    if day >= _LAST_DAY:
        return _LAST_MOMENT
    return datetime.combine(day, time.max, tzinfo=ACH_TIME_ZONE)


def is_banking_day(day: date) -> bool:
    """Whether the Federal Reserve Banks are open on ``day`` (a moment counts by its Eastern
    date)."""
    day = ach_date(day)
    return day.weekday() < 5 and day not in _holidays_of(day.year)


def add_banking_days(moment: datetime, days: int) -> datetime:
    """``moment`` moved forward by ``days`` banking days, to the end of that day in Eastern time
    (an aware datetime, which compares with the UTC timestamps the module stores).

    Something due within N banking days is due by the end of the Nth banking day after, whatever
    the hour it started: a settlement on a weekend or a holiday counts from the next banking day.
    """
    day = ach_date(moment)
    added = 0
    while added < days:
        if day >= _LAST_DAY:
            return _LAST_MOMENT
        day += timedelta(days=1)
        if is_banking_day(day):
            added += 1
    return end_of_banking_day(day)


def banking_days_between(start: date, end: date) -> int:
    """The banking days after ``start`` up to and including ``end`` (negative if ``end`` comes
    first), so ``banking_days_between(d, add_banking_days(d, n)) == n``."""
    first, last = ach_date(start), ach_date(end)
    if last < first:
        return -banking_days_between(last, first)
    return sum(is_banking_day(first + timedelta(days=i)) for i in range(1, (last - first).days + 1))


def available_cutoff(now: datetime, days: int) -> datetime:
    """The latest moment ``m`` with ``add_banking_days(m, days) <= now``: what happened by then
    has had its ``days`` banking days. ``days`` = 0: no wait at all, whatever a moment says
    (the last moment the calendar holds)."""
    if days <= 0:
        return _LAST_MOMENT
    today = ach_date(now)
    day = today
    # add_banking_days only grows with its moment's date, so walk back to the last date whose
    # end of the waiting time has passed; a few weeks at most for any sane number of days.
    while add_banking_days(_noon(day), days) > now:
        day -= timedelta(days=1)
    return end_of_banking_day(day)


def _noon(day: date) -> datetime:
    return datetime.combine(day, time(12), tzinfo=ACH_TIME_ZONE)
