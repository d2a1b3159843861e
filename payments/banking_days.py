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

A day is the moment's own calendar date, in the time zone it carries (the timestamps stored and
received are UTC).
"""

from __future__ import annotations

from datetime import date, datetime, timedelta
from functools import lru_cache

import holidays

FEDERAL_RESERVE_MARKET = "XFED"


@lru_cache(maxsize=256)
def _holidays_of(year: int) -> frozenset[date]:
    """The Fed's closed days of ``year``. The package's calendar fills itself in as years are
    asked for; a frozen set per year is computed once and is safe to share between threads."""
    return frozenset(holidays.financial_holidays(FEDERAL_RESERVE_MARKET, years=year))


def _day(value: date) -> date:
    return value.date() if isinstance(value, datetime) else value


def is_banking_day(day: date) -> bool:
    """Whether the Federal Reserve Banks are open on ``day`` (a datetime counts by its date)."""
    day = _day(day)
    return day.weekday() < 5 and day not in _holidays_of(day.year)


def add_banking_days(moment: datetime, days: int) -> datetime:
    """``moment`` moved forward by ``days`` banking days, to the end of that day.

    Something due within N banking days is due by the end of the Nth banking day after, whatever
    the hour it started: a settlement on a weekend or a holiday counts from the next banking day.
    """
    day = moment
    added = 0
    while added < days:
        day += timedelta(days=1)
        if is_banking_day(day):
            added += 1
    return day.replace(hour=23, minute=59, second=59, microsecond=999999)


def banking_days_between(start: date, end: date) -> int:
    """The banking days after ``start`` up to and including ``end`` (negative if ``end`` comes
    first), so ``banking_days_between(d, add_banking_days(d, n)) == n``."""
    first, last = _day(start), _day(end)
    if last < first:
        return -banking_days_between(last, first)
    return sum(is_banking_day(first + timedelta(days=i)) for i in range(1, (last - first).days + 1))
