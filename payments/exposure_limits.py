"""Exposure limits: how much one merchant may move, per direction and currency, as a value.

NACHA's rules ask a Third-Party Sender to set, enforce and review an exposure limit for each of
its originators. A merchant's limits, for debits (collections) and for credits (refunds and
payouts) apart, in each currency, are three caps, each optional (``None``: no cap):

- ``single``: the largest one entry may be;
- ``daily``: the most the entries of one effective banking day may add up to;
- ``window``: the most the entries of the last ``window_banking_days`` banking days (today
  included) may add up to.

The global default is the setting ``PAYMENTS["EXPOSURE_LIMITS"]``::

    {"USD": {"debit": {"single": "5000.00", "daily": "20000.00",
                       "window": "50000.00", "window_banking_days": 5},
             "credit": {"daily": "10000.00"}}}

A merchant's own limits (``payments.models.ExposureLimit``, edited in the admin) replace the
default of that direction and currency. Amounts are decimal strings (or whole numbers) with at
most two decimals, above zero and within what a payment's amount column holds; a float is
refused, since ``0.1`` is not ten cents in binary. This module parses and checks; enforcing is
``payments.services.limits``.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

DIRECTIONS = ("debit", "credit")
KINDS = ("single", "daily", "window")
WINDOW_DAYS_KEY = "window_banking_days"
# A payment's amount column holds 14 digits, 2 of them after the point.
MAX_AMOUNT = Decimal("999999999999.99")
# Longer than a quarter of banking days is no longer an exposure window but a budget.
MAX_WINDOW_BANKING_DAYS = 60
_CURRENCY_CHARACTERS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
ACCEPTED = (
    "None, or a dict {currency: {'debit'|'credit': {'single', 'daily', 'window': an amount "
    "such as '5000.00', 'window_banking_days': 1-60}}}"
)


@dataclass(frozen=True)
class Limits:
    """One direction's caps in one currency; ``None`` caps nothing."""

    single: Decimal | None = None
    daily: Decimal | None = None
    window: Decimal | None = None
    window_banking_days: int | None = None

    def __post_init__(self) -> None:
        for kind in KINDS:
            value = getattr(self, kind)
            if value is not None:
                object.__setattr__(self, kind, limit_amount(value, name=kind))
        if (self.window is None) != (self.window_banking_days is None):
            raise ValueError("window and window_banking_days go together: give both, or neither")
        if self.window_banking_days is not None:
            object.__setattr__(
                self, "window_banking_days", window_banking_days(self.window_banking_days)
            )

    @property
    def empty(self) -> bool:
        return self.single is None and self.daily is None and self.window is None

    def as_dict(self) -> dict[str, str | int | None]:
        shown: dict[str, str | int | None] = {
            kind: None if getattr(self, kind) is None else f"{getattr(self, kind):.2f}"
            for kind in KINDS
        }
        shown[WINDOW_DAYS_KEY] = self.window_banking_days
        return shown


NO_LIMITS = Limits()


def limit_amount(value: object, *, name: str) -> Decimal:
    """An amount a limit may be: a decimal string or a whole number, finite, above zero, two
    decimals at most, within ``MAX_AMOUNT``. ``ValueError`` naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (str, int, Decimal)):
        raise ValueError(
            f"{name}: {type(value).__name__} is not an amount; give a decimal string such as "
            "'5000.00'"
        )
    if isinstance(value, str) and not value.isascii():
        raise ValueError(f"{name}: an amount is ASCII digits and a point")
    try:
        amount = Decimal(value.strip() if isinstance(value, str) else value)
    except (InvalidOperation, ValueError):
        raise ValueError(f"{name}: {str(value)[:40]!r} is not a decimal amount") from None
    if not amount.is_finite():
        raise ValueError(f"{name}: must be a finite amount, not {amount}")
    if amount <= 0:
        raise ValueError(f"{name}: must be greater than zero (leave it empty for no limit)")
    if amount > MAX_AMOUNT:
        raise ValueError(f"{name}: must be at most {MAX_AMOUNT}")
    if amount != amount.quantize(Decimal("0.01")):
        raise ValueError(f"{name}: at most two decimals (whole cents)")
    return amount.quantize(Decimal("0.01"))


def window_banking_days(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{WINDOW_DAYS_KEY}: must be a whole number of banking days")
    if not 1 <= value <= MAX_WINDOW_BANKING_DAYS:
        raise ValueError(f"{WINDOW_DAYS_KEY}: must be 1 to {MAX_WINDOW_BANKING_DAYS}")
    return value


def currency_code(value: object) -> str:
    if not (isinstance(value, str) and len(value) == 3 and set(value) <= _CURRENCY_CHARACTERS):
        raise ValueError(f"{str(value)[:40]!r} is not a currency code such as 'USD'")
    return value


def parse_limits(value: object, *, where: str = "") -> Limits:
    """One direction's caps from a dict with some of the keys ``single``, ``daily``,
    ``window`` and ``window_banking_days``; ``ValueError`` naming the first problem."""
    if not isinstance(value, dict):
        raise ValueError(f"{where}must be a dict of limits, not {type(value).__name__}")
    unknown = sorted(str(key)[:40] for key in value if key not in (*KINDS, WINDOW_DAYS_KEY))
    if unknown:
        raise ValueError(f"{where}unknown key(s) {unknown}")
    try:
        return Limits(**{key: item for key, item in value.items() if item is not None})
    except ValueError as exc:
        raise ValueError(f"{where}{exc}") from None


def parse_exposure_limits(value: object) -> dict[tuple[str, str], Limits]:
    """The setting ``EXPOSURE_LIMITS``: ``{(direction, currency): Limits}``, without the
    empty ones. ``ValueError`` naming the first problem."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"must be None or a dict by currency, not {type(value).__name__}")
    parsed: dict[tuple[str, str], Limits] = {}
    for currency, directions in value.items():
        currency = currency_code(currency)
        if not isinstance(directions, dict):
            raise ValueError(f"[{currency!r}] must be a dict with 'debit' and/or 'credit'")
        unknown = sorted(str(key)[:40] for key in directions if key not in DIRECTIONS)
        if unknown:
            raise ValueError(f"[{currency!r}] unknown direction(s) {unknown}")
        for direction, limits in directions.items():
            parsed_limits = parse_limits(limits, where=f"[{currency!r}][{direction!r}] ")
            if not parsed_limits.empty:
                parsed[(direction, currency)] = parsed_limits
    return parsed


def limit_param(direction: str, kind: str) -> str:
    """The name a refusal gives the limit it ran into: ``debit_daily_limit``."""
    return f"{direction}_{kind}_limit"
