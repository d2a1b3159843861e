"""Fraud monitoring rules: each a plug-in that looks at a new payment and the merchant's history
and says whether a person should see it before it is sent.

NACHA's fraud-monitoring rule (2026) asks every non-consumer originator and Third-Party Sender
for risk-based processes that catch entries initiated by fraud. A rule here is a small class:

- ``name``: what a hold, a metric and the risk report call it;
- ``options``: its settings with their defaults (``PAYMENTS["FRAUD_RULES"][name]``), parsed by
  the class's ``__init__``, which raises ``ValueError`` naming a bad one;
- ``check(entry, history)``: a ``Flag`` with the figures that tripped it, or None.

The ``history`` a rule reads is the merchant's, read once per create by
``payments.services.fraud`` under the merchant's exposure lock (one statement, whatever the
number of rules): so the rules add no reads of their own, and two creates racing each other are
seen one after the other.

The setting is a dict by rule name; the built-in rules are on unless the host names them with
``"enabled": False``, and keep the defaults of every option it does not give::

    PAYMENTS["FRAUD_RULES"] = {
        "velocity": {"multiple": "4", "floor": "50000.00"},
        "first_large_debit": {"enabled": False},
        # A host's own rule, by dotted path, with its options:
        "round_amounts": {"path": "risk.rules.RoundAmounts", "amount": "1000.00"},
    }
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, ClassVar, Protocol

from django.utils.module_loading import import_string

from payments.exposure_limits import limit_amount

ACCEPTED = (
    "None, or a dict {rule name: {'enabled': bool, option: value}}; a host's own rule adds "
    "'path': 'package.module.Class' (a subclass of payments.fraud_rules.FraudRule)"
)
ENABLED = "enabled"
PATH = "path"
_NAME_CHARACTERS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_")
NAME_MAX = 48


@dataclass(frozen=True)
class Entry:
    """What a rule sees of the payment being created."""

    merchant_id: str
    direction: str  # "debit" or "credit"
    purpose: str  # "collection", "refund" or "payout"
    amount: Decimal
    currency: str
    account_token: str  # the account debited, or credited
    now: datetime
    # When the backend knows the account's details last changed (a vault account's row), else
    # None: the account is then as new as the merchant's first payment with it.
    account_changed_at: datetime | None = None


class History(Protocol):
    """The merchant's figures a rule may read (``payments.services.fraud.MerchantHistory``):
    in the entry's direction and currency, not counting failed or canceled entries."""

    @property
    def today_total(self) -> Decimal: ...

    @property
    def daily_mean(self) -> Decimal: ...

    @property
    def baseline_days(self) -> int: ...

    @property
    def account_first_seen(self) -> datetime | None: ...

    @property
    def account_debits(self) -> int: ...


@dataclass(frozen=True)
class Flag:
    """A rule's finding: ``summary`` for the reviewer, ``figures`` (strings and numbers, JSON)
    what tripped it."""

    rule: str
    summary: str
    figures: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "summary": self.summary, "figures": self.figures}


class FraudRule:
    """One rule. A subclass names itself, declares its options with their defaults, parses them
    in ``__init__`` (``ValueError`` naming the option) and implements ``check``."""

    name: ClassVar[str] = ""
    options: ClassVar[dict[str, Any]] = {}

    def __init__(self, **options: Any) -> None:
        unknown = sorted(str(key)[:40] for key in options if key not in self.options)
        if unknown:
            raise ValueError(f"unknown option(s) {unknown}; it takes {sorted(self.options)}")
        self.settings = {**self.options, **options}

    def check(self, entry: Entry, history: History) -> Flag | None:
        raise NotImplementedError

    def flag(self, summary: str, **figures: Any) -> Flag:
        return Flag(self.name, summary, {key: _shown(value) for key, value in figures.items()})


def _shown(value: Any) -> Any:
    if isinstance(value, Decimal):
        return f"{value:.2f}"
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def whole_number(value: object, *, name: str, minimum: int, maximum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise ValueError(f"{name}: must be a whole number from {minimum} to {maximum}")
    return value


def multiple(value: object, *, name: str) -> Decimal:
    """A factor such as ``"5"`` or ``"2.5"``: 1 to 1000."""
    if isinstance(value, bool) or not isinstance(value, (str, int, Decimal)):
        raise ValueError(f"{name}: give a number such as '5' (a string or a whole number)")
    try:
        factor = Decimal(str(value).strip()) if str(value).isascii() else Decimal("NaN")
    except ArithmeticError:
        factor = Decimal("NaN")
    if not factor.is_finite() or not Decimal(1) <= factor <= Decimal(1000):
        raise ValueError(f"{name}: must be a number from 1 to 1000, not {str(value)[:40]!r}")
    return factor


class NewDestination(FraudRule):
    """A payout (or, when ``purposes`` names them, a refund) to an account the merchant first
    paid or drew from, or whose details changed, within ``days`` days: the
    business-email-compromise pattern (a taken-over login sends the balance to an account added
    the same hour).

    Refunds are not checked by default: a refund goes back to the account its debit drew from,
    under that debit's authorization, so a refund of this week's sale would be held for no
    reason. A host whose refunds may go elsewhere names them."""

    name = "new_destination"
    options = {"days": 7, "purposes": ["payout"]}

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.days = whole_number(self.settings["days"], name="days", minimum=1, maximum=365)
        purposes = self.settings["purposes"]
        if not isinstance(purposes, (list, tuple)) or not set(purposes) <= {"payout", "refund"}:
            raise ValueError("purposes: a list of 'payout' and/or 'refund'")
        self.purposes = tuple(purposes)

    def check(self, entry: Entry, history: History) -> Flag | None:
        if entry.direction != "credit" or entry.purpose not in self.purposes:
            return None
        since = entry.now - timedelta(days=self.days)
        first_seen = history.account_first_seen
        if first_seen is None or first_seen > since:
            return self.flag(
                f"{entry.purpose} to an account first seen "
                + ("now" if first_seen is None else f"at {first_seen:%Y-%m-%d %H:%M} UTC")
                + f", within {self.days} days",
                days=self.days,
                account_first_seen=first_seen,
                amount=entry.amount,
            )
        changed = entry.account_changed_at
        if changed is not None and changed > since:
            return self.flag(
                f"{entry.purpose} to an account whose details changed at "
                f"{changed:%Y-%m-%d %H:%M} UTC, within {self.days} days",
                days=self.days,
                account_changed_at=changed,
                account_first_seen=first_seen,
                amount=entry.amount,
            )
        return None


class Velocity(FraudRule):
    """A merchant's debits (or credits) today above ``multiple`` times its daily mean over the
    trailing 30 banking days, and above ``floor``: a new merchant, whose mean is nothing yet,
    is not held for its first payments."""

    name = "velocity"
    options = {"multiple": "5", "floor": "25000.00"}

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.multiple = multiple(self.settings["multiple"], name="multiple")
        self.floor = limit_amount(self.settings["floor"], name="floor")

    def check(self, entry: Entry, history: History) -> Flag | None:
        today = history.today_total + entry.amount
        threshold = max(self.multiple * history.daily_mean, self.floor)
        if today <= threshold:
            return None
        return self.flag(
            f"{entry.direction}s today {today:.2f} {entry.currency} with this one, above "
            f"{self.multiple}x the {history.baseline_days}-banking-day daily mean "
            f"{history.daily_mean:.2f} (floor {self.floor:.2f})",
            today_with_this=today,
            daily_mean=history.daily_mean,
            multiple=str(self.multiple),
            floor=self.floor,
            threshold=threshold,
        )


class FirstLargeDebit(FraudRule):
    """The first debit from an account, above ``amount``: a stolen account number is drawn
    on big at once."""

    name = "first_large_debit"
    options = {"amount": "10000.00"}

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.amount = limit_amount(self.settings["amount"], name="amount")

    def check(self, entry: Entry, history: History) -> Flag | None:
        if entry.direction != "debit" or entry.amount <= self.amount:
            return None
        if history.account_debits:
            return None
        return self.flag(
            f"first debit from this account, {entry.amount:.2f} {entry.currency}, above "
            f"{self.amount:.2f}",
            amount=entry.amount,
            threshold=self.amount,
        )


BUILT_IN: dict[str, type[FraudRule]] = {
    rule.name: rule for rule in (NewDestination, Velocity, FirstLargeDebit)
}


def parse_fraud_rules(value: object) -> tuple[FraudRule, ...]:
    """The rules that run, in order (the built-in ones first), from the setting
    ``FRAUD_RULES``; ``ValueError`` naming the first problem."""
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise ValueError(f"must be None or a dict by rule name, not {type(value).__name__}")
    rules = []
    for name in [*BUILT_IN, *(key for key in value if key not in BUILT_IN)]:
        options = value.get(name, {})
        if not isinstance(name, str) or not name or len(name) > NAME_MAX:
            raise ValueError(f"{str(name)[:40]!r}: a rule name is 1-{NAME_MAX} characters")
        if not set(name) <= _NAME_CHARACTERS:
            raise ValueError(f"{name!r}: a rule name is lower-case letters, digits and _")
        if not isinstance(options, dict):
            raise ValueError(f"[{name!r}] must be a dict of options, not {type(options).__name__}")
        options = dict(options)
        enabled = options.pop(ENABLED, True)
        if not isinstance(enabled, bool):
            raise ValueError(f"[{name!r}] enabled: true or false")
        try:
            rule_class = _rule_class(name, options.pop(PATH, None))
            rule = rule_class(**options)
        except ValueError as exc:
            raise ValueError(f"[{name!r}] {exc}") from None
        if enabled:
            rules.append(rule)
    return tuple(rules)


def _rule_class(name: str, path: object) -> type[FraudRule]:
    if path is None:
        if name not in BUILT_IN:
            raise ValueError(
                f"no built-in rule of that name ({', '.join(BUILT_IN)}); a host's own names "
                "its class with 'path'"
            )
        return BUILT_IN[name]
    if name in BUILT_IN:
        raise ValueError("a built-in rule takes no 'path'")
    if not isinstance(path, str):
        raise ValueError("path: a dotted path such as 'package.module.Class'")
    try:
        rule_class = import_string(path)
    except ImportError as exc:
        raise ValueError(f"path {path[:200]!r} cannot be imported: {exc}") from None
    if not (isinstance(rule_class, type) and issubclass(rule_class, FraudRule)):
        raise ValueError(f"path {path[:200]!r} is not a subclass of payments.fraud_rules.FraudRule")
    if rule_class.name != name:
        raise ValueError(f"path {path[:200]!r} names its rule {rule_class.name!r}, not {name!r}")
    return rule_class
