"""A banking day as people ask for one (``GET /api/merchants/<id>/books/?date=``, ``books_close
--date``): ``YYYY-MM-DD`` in digits 0-9, from ``FIRST_DAY`` to the bank's tomorrow.

``date.fromisoformat`` takes ``20261204`` and week dates (``2026-W49-5``), ``strptime`` takes
``2026-1-5`` and full-width digits; a day centuries ahead reached the books' date arithmetic.
Each is refused here with a reason that names the rule, before the books are asked."""

from __future__ import annotations

import re
from datetime import date, timedelta

from django.utils import timezone

from payments.banking_days import ach_date

DAY_RE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
# Before any books this module keeps; and early enough for every look-back to stay a date.
FIRST_DAY = date(2000, 1, 1)
# A client a time zone ahead of the bank's asks for its own today: one day ahead is taken.
DAYS_AHEAD = 1


def books_day_parse(value: str) -> date:
    """The day ``value`` names; ``ValueError`` saying what a day must be otherwise."""
    if not isinstance(value, str) or not DAY_RE.fullmatch(value):
        raise ValueError("a day is written YYYY-MM-DD in digits 0-9")
    try:
        day = date.fromisoformat(value)
    except ValueError:
        raise ValueError(f"{value} is not a day of the calendar") from None
    last = ach_date(timezone.now()) + timedelta(days=DAYS_AHEAD)
    if not FIRST_DAY <= day <= last:
        raise ValueError(f"a day from {FIRST_DAY.isoformat()} to {last.isoformat()}")
    return day
