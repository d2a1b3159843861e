"""Banking days against the Federal Reserve's published holiday schedules, and the return time
frames and late flags that count them."""

from datetime import UTC, date, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from payments.banking_days import (
    ACH_TIME_ZONE,
    ach_date,
    add_banking_days,
    banking_days_between,
    is_banking_day,
)
from payments.models import Payment, PaymentReturn, PaymentState
from payments.return_codes import RETURN_CODES
from payments.services import payment_apply_event
from tests.factories import PaymentFactory, processor_event

# The Fed's schedules as published (Holidays Observed by the Federal Reserve System), written
# out: every weekday of the year the Reserve Banks are closed.
FED_CLOSED_WEEKDAYS = {
    2024: [
        date(2024, 1, 1),
        date(2024, 1, 15),
        date(2024, 2, 19),
        date(2024, 5, 27),
        date(2024, 6, 19),
        date(2024, 7, 4),
        date(2024, 9, 2),
        date(2024, 10, 14),
        date(2024, 11, 11),
        date(2024, 11, 28),
        date(2024, 12, 25),
    ],
    2025: [
        date(2025, 1, 1),
        date(2025, 1, 20),
        date(2025, 2, 17),
        date(2025, 5, 26),
        date(2025, 6, 19),
        date(2025, 7, 4),
        date(2025, 9, 1),
        date(2025, 10, 13),
        date(2025, 11, 11),
        date(2025, 11, 27),
        date(2025, 12, 25),
    ],
    2026: [
        date(2026, 1, 1),
        date(2026, 1, 19),
        date(2026, 2, 16),
        date(2026, 5, 25),
        date(2026, 6, 19),
        # Independence Day is a Saturday: nothing closes.
        date(2026, 9, 7),
        date(2026, 10, 12),
        date(2026, 11, 11),
        date(2026, 11, 26),
        date(2026, 12, 25),
    ],
    2027: [
        date(2027, 1, 1),
        date(2027, 1, 18),
        date(2027, 2, 15),
        date(2027, 5, 31),
        # Juneteenth is a Saturday: nothing closes.
        date(2027, 7, 5),  # Independence Day is a Sunday: the Monday after closes.
        date(2027, 9, 6),
        date(2027, 10, 11),
        date(2027, 11, 11),
        date(2027, 11, 25),
        # Christmas is a Saturday, and so is New Year's Day 2028: nothing closes.
    ],
}

# A holiday on a Saturday closes nothing: the Friday before is a banking day, unlike on the
# federal-employee calendar.
SATURDAY_HOLIDAYS = [
    (date(2026, 7, 4), date(2026, 7, 3)),
    (date(2027, 6, 19), date(2027, 6, 18)),
    (date(2027, 12, 25), date(2027, 12, 24)),
    (date(2028, 1, 1), date(2027, 12, 31)),
]


@pytest.mark.parametrize("year", sorted(FED_CLOSED_WEEKDAYS))
def test_the_weekdays_closed_are_exactly_the_feds_published_schedule(year):
    days = (date(year, 1, 1) + timedelta(days=i) for i in range(366))
    weekdays = [d for d in days if d.year == year and d.weekday() < 5]

    closed = [d for d in weekdays if not is_banking_day(d)]

    assert closed == FED_CLOSED_WEEKDAYS[year]


@pytest.mark.parametrize(("holiday", "friday_before"), SATURDAY_HOLIDAYS)
def test_a_holiday_on_a_saturday_closes_neither_the_friday_before_nor_the_monday_after(
    holiday, friday_before
):
    assert holiday.weekday() == 5
    assert is_banking_day(friday_before)
    assert is_banking_day(holiday + timedelta(days=2))
    assert not is_banking_day(holiday)


def test_a_holiday_on_a_sunday_closes_the_monday_after():
    independence_day = date(2027, 7, 4)
    assert independence_day.weekday() == 6
    assert not is_banking_day(date(2027, 7, 5))
    assert is_banking_day(date(2027, 7, 2))


def test_a_moment_counts_by_its_date_in_new_york():
    assert not is_banking_day(datetime(2026, 12, 25, 9, 0, tzinfo=UTC))
    # 03:00 UTC on Christmas is 22:00 on Christmas Eve in New York: a banking day.
    assert is_banking_day(datetime(2026, 12, 25, 3, 0, tzinfo=UTC))
    # 02:00 UTC on the Friday after Thanksgiving is Thursday evening there: closed.
    assert not is_banking_day(datetime(2026, 11, 27, 2, 0, tzinfo=UTC))
    assert is_banking_day(datetime(2026, 11, 27, 5, 0, tzinfo=UTC))
    # Summer time: New York is 4 hours behind, so 03:59 UTC on 4 July 2025 is still 3 July.
    assert ach_date(datetime(2025, 7, 4, 3, 59, tzinfo=UTC)) == date(2025, 7, 3)
    assert ach_date(datetime(2025, 7, 4, 4, 0, tzinfo=UTC)) == date(2025, 7, 4)


def test_a_deadline_ends_at_midnight_in_new_york():
    # Returned on a Monday evening in New York (after midnight UTC): two banking days from
    # Monday, the deadline ends as Wednesday ends there, 05:00 UTC on Thursday in winter.
    due = add_banking_days(datetime(2026, 12, 1, 2, 0, tzinfo=UTC), 2)
    assert due == datetime(2026, 12, 2, 23, 59, 59, 999999, tzinfo=ACH_TIME_ZONE)
    assert due.astimezone(UTC) == datetime(2026, 12, 3, 4, 59, 59, 999999, tzinfo=UTC)


@pytest.mark.parametrize(
    ("moment", "day", "due_year"),
    [
        # Before any New York offset can be applied: dated by the moment's own date.
        (datetime(1, 1, 1, 0, 0, tzinfo=timezone(timedelta(hours=1))), date(1, 1, 1), 1),
        (
            datetime(9999, 12, 31, 23, 59, 59, tzinfo=timezone(timedelta(hours=-1))),
            date(9999, 12, 31),
            9999,
        ),
        (datetime(9999, 12, 28, 12, 0, tzinfo=UTC), date(9999, 12, 28), 9999),
    ],
    ids=["year-1", "year-9999", "days-before-the-end"],
)
def test_a_timestamp_at_the_ends_of_time_saturates_instead_of_raising(moment, day, due_year):
    """The contract takes any timestamp datetime can hold: a deadline counted from one at the
    ends of time is a representable moment, never an OverflowError in the worker."""
    due = add_banking_days(moment, 6)
    assert due.astimezone(UTC).year == due_year
    assert ach_date(moment) == day
    if due_year == 9999:
        assert due == datetime.max.replace(tzinfo=UTC)


# --- return time frames around holidays ------------------------------------------------------


@pytest.mark.parametrize(
    ("settled", "deadline"),
    [
        # Wednesday before Thanksgiving (Thu 26 Nov 2026): Fri 27, Mon 30.
        (datetime(2026, 11, 25, 15, 0, tzinfo=UTC), date(2026, 11, 30)),
        # Thursday before Christmas on a Friday (25 Dec 2026): Mon 28, Tue 29.
        (datetime(2026, 12, 24, 15, 0, tzinfo=UTC), date(2026, 12, 29)),
        # Friday before Labor Day (Mon 7 Sep 2026): Tue 8, Wed 9.
        (datetime(2026, 9, 4, 15, 0, tzinfo=UTC), date(2026, 9, 9)),
        # Friday before Martin Luther King Jr. Day (Mon 18 Jan 2027): Tue 19, Wed 20.
        (datetime(2027, 1, 15, 15, 0, tzinfo=UTC), date(2027, 1, 20)),
        # Settled on the holiday itself: counted from the next banking day.
        (datetime(2026, 9, 7, 15, 0, tzinfo=UTC), date(2026, 9, 9)),
        # Thursday before Independence Day on a Saturday (4 Jul 2026): Fri 3 is open.
        (datetime(2026, 7, 2, 15, 0, tzinfo=UTC), date(2026, 7, 6)),
    ],
)
def test_a_two_banking_day_time_frame_skips_the_holiday(settled, deadline):
    due = RETURN_CODES["R01"].deadline(settled)

    assert due == datetime.combine(deadline, datetime.max.time(), tzinfo=ACH_TIME_ZONE)


def test_a_calendar_day_time_frame_ignores_holidays():
    settled = datetime(2026, 11, 25, 15, 0, tzinfo=UTC)

    assert RETURN_CODES["R10"].deadline(settled) == settled + timedelta(days=60)


@pytest.mark.django_db
@pytest.mark.usefixtures("event_write_path")
@pytest.mark.parametrize(
    ("returned", "late"),
    [
        # Counting weekends only, the deadline was Monday's end and this return was late.
        (datetime(2026, 9, 8, 15, 0, tzinfo=UTC), False),
        # Tuesday ends at midnight in New York: 04:00 UTC on Wednesday in summer time.
        (datetime(2026, 9, 9, 3, 59, tzinfo=UTC), False),
        (datetime(2026, 9, 9, 4, 0, 1, tzinfo=UTC), True),
    ],
)
def test_a_return_on_the_tuesday_after_a_monday_holiday_is_on_time_for_a_thursday_debit(
    returned, late
):
    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    payment_apply_event(event=processor_event(payment, "settled"))
    settled_thursday = datetime(2026, 9, 3, 15, 0, tzinfo=UTC)  # before Labor Day, Mon 7 Sep
    Payment.objects.filter(pk=payment.pk).update(state_changed_at=settled_thursday)

    payment_apply_event(
        event=processor_event(payment, "returned", reason_code="R01", timestamp=returned)
    )

    record = PaymentReturn.objects.get(payment=payment)  # Fri 4 Sep, then Tue 8 Sep
    assert record.deadline == datetime(2026, 9, 8, 23, 59, 59, 999999, tzinfo=ACH_TIME_ZONE)
    assert record.late is late


# --- properties ------------------------------------------------------------------------------

# The years the Fed's calendar is known for (1999-2100), with room for 60 banking days after.
moments = st.datetimes(
    min_value=datetime(1999, 1, 1), max_value=datetime(2100, 9, 30), timezones=st.just(UTC)
)


@given(moment=moments, days=st.integers(min_value=1, max_value=60))
def test_adding_banking_days_lands_on_a_banking_day_that_many_banking_days_later(moment, days):
    due = add_banking_days(moment, days)

    assert is_banking_day(due)
    assert banking_days_between(moment, due) == days
    # No banking day is skipped: the day before the deadline is one banking day short.
    assert banking_days_between(moment, due - timedelta(days=1)) == days - 1
    assert (due.hour, due.minute, due.tzinfo) == (23, 59, ACH_TIME_ZONE)


@given(start=moments, offset=st.integers(min_value=-400, max_value=400))
def test_banking_days_between_counts_the_same_either_way_round(start, offset):
    end = start + timedelta(days=offset)

    assert banking_days_between(end, start) == -banking_days_between(start, end)
