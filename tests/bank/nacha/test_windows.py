"""Windows: the Fed's deadlines less the bank's buffer, on the Fed's banking days."""

from datetime import UTC, datetime, timedelta

import pytest

from bank.nacha.windows import (
    EASTERN,
    FED_WINDOWS,
    SAME_DAY_LIMIT_CENTS,
    parse_windows,
    window_instances,
    window_next,
)

WINDOWS = parse_windows(FED_WINDOWS)
BUFFER = timedelta(minutes=30)


def _et(*args) -> datetime:
    return datetime(*args, tzinfo=EASTERN)


@pytest.mark.parametrize(
    ("now", "window", "effective", "cutoff"),
    [
        # Tuesday 2026-12-01, 09:00 ET: the first same-day window, 10:30 less 30 minutes.
        (_et(2026, 12, 1, 9, 0), "same_day_1", "2026-12-01", _et(2026, 12, 1, 10, 0)),
        (_et(2026, 12, 1, 10, 0), "same_day_2", "2026-12-01", _et(2026, 12, 1, 14, 15)),
        (_et(2026, 12, 1, 16, 14), "same_day_3", "2026-12-01", _et(2026, 12, 1, 16, 15)),
        # After the last same-day window: the next morning's next-day window.
        (_et(2026, 12, 1, 16, 16), "next_day", "2026-12-02", _et(2026, 12, 2, 1, 45)),
        # Friday evening: Monday's next-day window.
        (_et(2026, 12, 4, 20, 0), "next_day", "2026-12-07", _et(2026, 12, 7, 1, 45)),
        # Christmas 2026 is a Friday, so Thursday evening waits for Monday the 28th.
        (_et(2026, 12, 24, 18, 0), "next_day", "2026-12-28", _et(2026, 12, 28, 1, 45)),
        # July 4th 2026 is a Saturday: the Fed stays open on Friday the 3rd.
        (_et(2026, 7, 2, 18, 0), "next_day", "2026-07-03", _et(2026, 7, 3, 1, 45)),
    ],
)
def test_the_next_window_and_its_effective_entry_date(now, window, effective, cutoff):
    found = window_next(now.astimezone(UTC), windows=WINDOWS, buffer=BUFFER)
    assert (found.name, found.effective_entry_date.isoformat()) == (window, effective)
    assert found.bank_cutoff == cutoff
    assert found.fed_deadline - found.bank_cutoff == BUFFER


def test_a_larger_buffer_moves_the_cutoff_earlier():
    found = window_next(_et(2026, 12, 1, 9, 59), windows=WINDOWS, buffer=timedelta(hours=1))
    assert (found.name, found.bank_cutoff) == ("same_day_2", _et(2026, 12, 1, 13, 45))


def test_same_day_windows_take_at_most_a_million_dollars():
    instance = window_next(_et(2026, 12, 1, 9, 0), windows=WINDOWS, buffer=BUFFER)
    assert instance.accepts(SAME_DAY_LIMIT_CENTS)
    assert not instance.accepts(SAME_DAY_LIMIT_CENTS + 1)
    following = window_instances(_et(2026, 12, 1, 9, 0), windows=WINDOWS, buffer=BUFFER)
    assert following[-1].name == "next_day" and following[-1].accepts(SAME_DAY_LIMIT_CENTS + 1)


def test_a_next_day_only_configuration_never_picks_a_same_day_window():
    windows = parse_windows([{"name": "nightly", "deadline": "02:15", "same_day": False}])
    found = window_next(_et(2026, 12, 1, 9, 0), windows=windows, buffer=BUFFER)
    assert (found.name, found.effective_entry_date.isoformat()) == ("nightly", "2026-12-02")


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ([], "non-empty"),
        ("02:15", "non-empty list"),
        ([{"name": "x", "deadline": "02:15"}], "exactly name, deadline and same_day"),
        ([{"name": "x y", "deadline": "02:15", "same_day": False}], "identifier"),
        ([{"name": "x", "deadline": "25:00", "same_day": False}], "HH:MM"),
        ([{"name": "x", "deadline": "02:15", "same_day": "no"}], "True or False"),
        ([{"name": "x", "deadline": "10:30", "same_day": True}], "next-day"),
        (
            [
                {"name": "x", "deadline": "02:15", "same_day": False},
                {"name": "x", "deadline": "03:15", "same_day": False},
            ],
            "names must be unique",
        ),
        (
            [
                {"name": "x", "deadline": "02:15", "same_day": False},
                {"name": "y", "deadline": "02:15", "same_day": False},
            ],
            "deadlines must be unique",
        ),
    ],
    ids=[
        "empty",
        "text",
        "keys",
        "name",
        "deadline",
        "flag",
        "all-same-day",
        "dup-name",
        "dup-time",
    ],
)
def test_a_wrong_window_setting_is_refused_naming_the_problem(value, problem):
    with pytest.raises(ValueError, match=problem):
        parse_windows(value)
