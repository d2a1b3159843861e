"""Declared types and accepted ranges of the module's settings, and the check that applies them.

Each app's ``conf.py`` declares every setting once, as a spec holding its default and what it
accepts; its ``checks.py`` runs ``settings_refused`` at start-up (``manage.py check``, ``migrate``,
``runserver``). A nonsense value (a negative tolerance, a zero timeout, a window that does not
parse) then stops the process naming the setting, the value and the accepted range, instead of
breaking every request, submission or alert once it is read at run time.

The callbacks and triage apps use it too: they depend on payments, never the other way round.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.core.checks import Error
from django.core.exceptions import ImproperlyConfigured


class Spec:
    """One setting: its default and what it accepts. ``problem`` says what is wrong with a
    value, or returns ``None`` when it is accepted."""

    default: Any
    accepted: str

    def problem(self, value: Any) -> str | None:
        raise NotImplementedError


def _type_problem(value: Any, expected: str) -> str:
    return f"{type(value).__name__} is not a type this setting accepts (expected {expected})"


@dataclass(frozen=True)
class Number(Spec):
    """A finite number in ``[minimum, maximum]`` (``minimum`` itself excluded when
    ``above_minimum``). ``whole`` accepts integers only. Booleans are not numbers here."""

    default: Any
    minimum: float
    maximum: float
    above_minimum: bool = False
    whole: bool = False
    unit: str = ""

    @property
    def accepted(self) -> str:
        noun = "a whole number" if self.whole else "a number"
        unit = f" {self.unit}" if self.unit else ""
        if self.above_minimum:
            return f"{noun}{unit} above {self.minimum:g} and at most {self.maximum:g}"
        return f"{noun}{unit} from {self.minimum:g} to {self.maximum:g}"

    def problem(self, value: Any) -> str | None:
        kinds = (int,) if self.whole else (int, float, Decimal)
        if isinstance(value, bool) or not isinstance(value, kinds):
            return _type_problem(value, "int" if self.whole else "int, float or Decimal")
        finite = value.is_finite() if isinstance(value, Decimal) else math.isfinite(value)
        if not finite:
            return "not a finite number"
        too_low = value <= self.minimum if self.above_minimum else value < self.minimum
        if too_low or value > self.maximum:
            return "out of range"
        return None


def Seconds(default: float, maximum: float, *, minimum: float = 0, above_minimum=True) -> Number:  # noqa: N802 - reads as a type in the declarations
    return Number(default, minimum, maximum, above_minimum=above_minimum, unit="of seconds")


@dataclass(frozen=True)
class Duration(Spec):
    """A ``timedelta`` from ``minimum`` (inclusive) to ``maximum``, and never zero or negative:
    every duration here is a retention, an interval or an age."""

    default: timedelta
    maximum: timedelta = timedelta(days=3650)
    minimum: timedelta | None = None

    @property
    def accepted(self) -> str:
        low = f"from {self.minimum}" if self.minimum else "above 0:00:00"
        return f"a timedelta {low} up to {self.maximum}"

    def problem(self, value: Any) -> str | None:
        if not isinstance(value, timedelta):
            return _type_problem(value, "datetime.timedelta")
        low = self.minimum if self.minimum else timedelta(microseconds=1)
        if not low <= value <= self.maximum:
            return "out of range"
        return None


@dataclass(frozen=True)
class Flag(Spec):
    default: bool
    accepted: str = "True or False"

    def problem(self, value: Any) -> str | None:
        if not isinstance(value, bool):
            return _type_problem(value, "bool")
        return None


@dataclass(frozen=True)
class Text(Spec):
    """A string matching ``pattern`` (a full match); ``optional`` also accepts ``None``."""

    default: str | None
    pattern: str
    accepted: str
    optional: bool = False

    def problem(self, value: Any) -> str | None:
        if value is None and self.optional:
            return None
        if not isinstance(value, str):
            return _type_problem(value, "str or None" if self.optional else "str")
        if re.fullmatch(self.pattern, value) is None:
            return "not of the accepted form"
        return None


def Url(default: str | None, *, optional: bool = True) -> Text:  # noqa: N802 - reads as a type
    # Blank counts as unset for an optional URL: an empty environment variable means "none".
    blank = "|" if optional else ""
    return Text(
        default,
        pattern=rf"{blank}https?://[^\s/?#]+[^\s]*",
        accepted="an http:// or https:// URL" + (", or None/blank for none" if optional else ""),
        optional=optional,
    )


@dataclass(frozen=True)
class Parsed(Spec):
    """A value a parser of the module reads at run time: the check calls the same parser, so
    what passes start-up is exactly what the run time accepts."""

    default: Any
    parse: Callable[[Any], Any]
    accepted: str
    types: tuple[type, ...] = (str, type(None))

    def problem(self, value: Any) -> str | None:
        if not isinstance(value, self.types):
            return _type_problem(value, " or ".join(t.__name__ for t in self.types))
        try:
            self.parse(value)
        except (ImproperlyConfigured, ValueError) as exc:
            return str(exc) or type(exc).__name__
        return None


@dataclass(frozen=True)
class Keys(Spec):
    """A dict whose keys are among ``values`` and whose each value its spec accepts. With
    ``partial`` a host may give only some keys (the default fills the others in)."""

    default: dict
    values: dict[str, Spec] = field(default_factory=dict)
    partial: bool = False

    @property
    def accepted(self) -> str:
        keys = ", ".join(f"{key!r}: {spec.accepted}" for key, spec in self.values.items())
        some = "some or all of " if self.partial else ""
        return f"a dict with {some}the keys {{{keys}}}"

    def problem(self, value: Any) -> str | None:
        if not isinstance(value, Mapping):
            return _type_problem(value, "dict")
        unknown = sorted(str(k) for k in value if k not in self.values)
        if unknown:
            return f"unknown key(s) {unknown}"
        missing = [k for k in self.values if k not in value]
        if missing and not self.partial:
            return f"missing key(s) {missing}"
        for key, spec in self.values.items():
            if key in value and (problem := spec.problem(value[key])) is not None:
                return f"[{key!r}] = {value[key]!r}: {problem}"
        return None


def defaults(specs: dict[str, Spec]) -> dict[str, Any]:
    """The ``DEFAULTS`` dict a ``conf.py`` reads, taken from its specs."""
    return {name: spec.default for name, spec in specs.items()}


def _shown(value: Any) -> str:
    text = repr(value)
    # A value from outside is quoted by repr; a huge one is cut, not echoed whole.
    return text if len(text) <= 200 else text[:200] + "..."


def setting_refused(name: str, spec: Spec, value: Any, error_id: str) -> Error | None:
    problem = spec.problem(value)
    if problem is None:
        return None
    return Error(
        f"{name} = {_shown(value)} is refused: {problem.rstrip('.')}. Accepted: {spec.accepted}.",
        hint=f"Set {name} to {spec.accepted}, or remove it to use the default "
        f"{_shown(spec.default)}.",
        obj=name,
        id=error_id,
    )


def settings_refused(
    specs: dict[str, Spec],
    error_id: str,
    relations: tuple[tuple[str, str], ...] = (),
) -> list[Error]:
    """One error per setting whose value its spec refuses (the host's value, else the default),
    then one per ``(low, high)`` pair whose low value exceeds its high one."""
    values = {name: getattr(settings, name, spec.default) for name, spec in specs.items()}
    errors = [
        error
        for name, spec in specs.items()
        if (error := setting_refused(name, spec, values[name], error_id)) is not None
    ]
    refused = {error.obj for error in errors}
    for low, high in relations:
        if low in refused or high in refused or values[low] <= values[high]:
            continue
        errors.append(
            Error(
                f"{low} = {_shown(values[low])} is above {high} = {_shown(values[high])}. "
                f"Accepted: {low} at most {high}.",
                obj=low,
                id=error_id,
            )
        )
    return errors
