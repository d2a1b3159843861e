"""A banking day as people ask for one (``GET /api/merchants/<id>/books/?date=``, ``books_close
--date``): ``YYYY-MM-DD`` in digits 0-9, from ``FIRST_DAY`` to the second banking day after
the bank's today.

``date.fromisoformat`` takes ``20261204`` and week dates (``2026-W49-5``), ``strptime`` takes
``2026-1-5`` and full-width digits; a day centuries ahead reached the books' date arithmetic.
Each is refused here with a reason that names the rule, before the books are asked."""

from __future__ import annotations

import re
from datetime import date

from django.utils import timezone

from payments.banking_days import ach_date, add_banking_days

DAY_RE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
# Before any books this module keeps; and early enough for every look-back to stay a date.
FIRST_DAY = date(2000, 1, 1)
# A file cut today settles on its effective date: the next banking day (after a Friday's last
# window, Monday), and its statement may come early. One banking day more for a client a time
# zone ahead of the bank's.
BANKING_DAYS_AHEAD = 2


def books_day_parse(value: str) -> date:
    """The day ``value`` names; ``ValueError`` saying what a day must be otherwise."""
    if not isinstance(value, str) or not DAY_RE.fullmatch(value):
        raise ValueError("a day is written YYYY-MM-DD in digits 0-9")
    try:
        day = date.fromisoformat(value)
    except ValueError:
        raise ValueError(f"{value} is not a day of the calendar") from None
    last = ach_date(add_banking_days(timezone.now(), BANKING_DAYS_AHEAD))
    if not FIRST_DAY <= day <= last:
        raise ValueError(f"a day from {FIRST_DAY.isoformat()} to {last.isoformat()}")
    return day
