"""A banking day as the books API and ``books_close --date`` take it: ``YYYY-MM-DD`` in digits
0-9, from 2000-01-01 to the second banking day after the bank's today; anything else refused
naming ``date``."""

from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from payments.banking_days import ach_date, add_banking_days
from tests.factories import grant

pytestmark = pytest.mark.django_db

REFUSED = [
    "2026-1-5",  # strptime's %m and %d take one digit
    "2026-W49-5",  # an ISO week date: fromisoformat takes it
    "2026-12-01T00:00",
    " 2026-12-01",
    "+2026-12-01",
    "\uff12\uff10\uff12\uff16-12-01",  # full-width digits
    "2026-02-30",
    "9999-12-31",  # a day centuries ahead
    "2999-01-01",
    "1999-12-31",  # before the books
    "0001-01-01",
]


@pytest.mark.parametrize("value", REFUSED)
def test_the_books_api_refuses_a_day_outside_its_format_or_range_naming_date(
    api_client, user, value
):
    grant(user, "acme")

    response = api_client.get("/api/merchants/acme/books/", {"date": value})

    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "date" and error["errors"]["date"]


def test_the_books_api_takes_today_to_the_second_banking_day_after_not_the_day_after(
    api_client, user
):
    """A Friday's file settles on Monday: Monday's books may be asked for on Friday."""
    grant(user, "acme")
    today = ach_date(timezone.now())
    last = ach_date(add_banking_days(timezone.now(), 2))

    days = [today, today + timedelta(days=1), last, last + timedelta(days=1)]
    answers = [api_client.get("/api/merchants/acme/books/", {"date": str(day)}) for day in days]

    assert [a.status_code for a in answers] == [200, 200, 200, 400]
    assert "a day from 2000-01-01 to" in str(answers[3].json()["error"]["errors"]["date"])


def test_books_close_takes_the_next_banking_day_after_a_weekend(monkeypatch):
    """Friday evening in New York: Monday, the effective date of the files cut after the last
    window, is taken; Wednesday is not."""
    from datetime import datetime

    from bank.books import days as books_days
    from payments.banking_days import ACH_TIME_ZONE

    friday = datetime(2026, 12, 4, 20, 0, tzinfo=ACH_TIME_ZONE)
    monkeypatch.setattr(books_days.timezone, "now", lambda: friday)

    assert books_days.books_day_parse("2026-12-07").isoformat() == "2026-12-07"
    assert books_days.books_day_parse("2026-12-08").isoformat() == "2026-12-08"
    with pytest.raises(ValueError, match="to 2026-12-08"):
        books_days.books_day_parse("2026-12-09")


@pytest.mark.parametrize("value", REFUSED)
def test_books_close_refuses_a_day_outside_its_format_or_range_with_a_usage_error(value):
    with pytest.raises(CommandError, match="argument --date"):
        call_command("books_close", "--date", value)
