"""A banking day as the books API and ``books_close --date`` take it: ``YYYY-MM-DD`` in digits
0-9, from 2000-01-01 to the bank's tomorrow; anything else refused naming ``date``."""

from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from payments.banking_days import ach_date
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


def test_the_books_api_takes_today_and_the_banks_tomorrow_not_the_day_after(api_client, user):
    grant(user, "acme")
    today = ach_date(timezone.now())

    answers = [
        api_client.get("/api/merchants/acme/books/", {"date": str(today + timedelta(days=n))})
        for n in (0, 1, 2)
    ]

    assert [a.status_code for a in answers] == [200, 200, 400]
    assert "a day from 2000-01-01 to" in str(answers[2].json()["error"]["errors"]["date"])


@pytest.mark.parametrize("value", REFUSED)
def test_books_close_refuses_a_day_outside_its_format_or_range_with_a_usage_error(value):
    with pytest.raises(CommandError, match="argument --date"):
        call_command("books_close", "--date", value)
