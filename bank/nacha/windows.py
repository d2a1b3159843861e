"""When files go to the bank: the Federal Reserve's processing windows, less the bank's buffer.

FedACH takes forward files by fixed deadlines, in Eastern time: 02:15 for the next-day window
(entries settle that morning), and 10:30, 14:45 and 16:45 for the three same-day windows.
The ODFI wants a file some minutes before it must pass it on: its buffer. A window on banking
day D therefore closes for us at ``D + deadline - buffer``, and its entries carry D as their
effective entry date (an entry cut Monday evening goes in Tuesday's 02:15 window, settles
Tuesday). Banking days come from ``payments.banking_days`` (the Fed's holidays).

Same-day ACH takes entries of at most $1,000,000.00; a larger one waits for a next-day window.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from typing import Any

from payments.banking_days import ACH_TIME_ZONE, is_banking_day

EASTERN = ACH_TIME_ZONE  # the Fed's clock, the banking calendar's own
SAME_DAY_LIMIT_CENTS = 1_000_000_00
FED_WINDOWS: list[dict[str, Any]] = [
    {"name": "next_day", "deadline": "02:15", "same_day": False},
    {"name": "same_day_1", "deadline": "10:30", "same_day": True},
    {"name": "same_day_2", "deadline": "14:45", "same_day": True},
    {"name": "same_day_3", "deadline": "16:45", "same_day": True},
]
WINDOWS_ACCEPTED = (
    "a non-empty list of {'name': str, 'deadline': 'HH:MM' (Eastern), 'same_day': bool}, "
    "names unique, deadlines unique, at least one window not same-day"
)


@dataclass(frozen=True)
class Window:
    name: str
    deadline: time  # the Fed's deadline, Eastern time
    same_day: bool


@dataclass(frozen=True)
class WindowInstance:
    """One window on one banking day."""

    window: Window
    effective_entry_date: date
    fed_deadline: datetime
    bank_cutoff: datetime  # the Fed's deadline less the bank's buffer: our last moment

    @property
    def name(self) -> str:
        return self.window.name

    def accepts(self, amount_cents: int) -> bool:
        return not self.window.same_day or amount_cents <= SAME_DAY_LIMIT_CENTS


def parse_windows(value: Any) -> tuple[Window, ...]:
    """The windows of the ``NACHA_WINDOWS`` setting, sorted by deadline; ValueError naming
    what is wrong (the start-up check calls this too)."""
    if not isinstance(value, (list, tuple)) or not value:
        raise ValueError("must be a non-empty list of windows")
    windows = []
    for item in value:
        if not isinstance(item, dict) or set(item) != {"name", "deadline", "same_day"}:
            raise ValueError("each window is a dict of exactly name, deadline and same_day")
        name, deadline, same_day = item["name"], item["deadline"], item["same_day"]
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"window name {name!r} must be an identifier")
        try:
            parsed = datetime.strptime(deadline, "%H:%M").time()
        except (TypeError, ValueError):
            raise ValueError(f"window {name}: deadline {deadline!r} is not HH:MM") from None
        if not isinstance(same_day, bool):
            raise ValueError(f"window {name}: same_day must be True or False")
        windows.append(Window(name, parsed, same_day))
    if len({w.name for w in windows}) != len(windows):
        raise ValueError("window names must be unique")
    if len({w.deadline for w in windows}) != len(windows):
        raise ValueError("window deadlines must be unique")
    if all(w.same_day for w in windows):
        raise ValueError("at least one window must be next-day (same-day ACH has an amount cap)")
    return tuple(sorted(windows, key=lambda w: w.deadline))


def window_instances(
    after: datetime, *, windows: tuple[Window, ...], buffer: timedelta
) -> list[WindowInstance]:
    """The window instances whose bank cutoff comes after ``after``, in order, up to and
    including the first next-day one (which takes any entry)."""
    day = after.astimezone(EASTERN).date() - timedelta(days=1)
    found: list[WindowInstance] = []
    for _ in range(16):
        day += timedelta(days=1)
        if not is_banking_day(day):
            continue
        for window in windows:
            deadline = datetime.combine(day, window.deadline, tzinfo=EASTERN)
            cutoff = deadline - buffer
            if cutoff > after:
                found.append(WindowInstance(window, day, deadline, cutoff))
                if not window.same_day:
                    return found
    raise AssertionError("no banking day within 16 days")  # the Fed never closes that long


def window_next(
    after: datetime, *, windows: tuple[Window, ...], buffer: timedelta
) -> WindowInstance:
    """The first window instance whose bank cutoff is after ``after``."""
    return window_instances(after, windows=windows, buffer=buffer)[0]
