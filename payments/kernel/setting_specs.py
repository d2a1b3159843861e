"""Declared types and accepted ranges of the module's settings, and the check that applies them.

Each app's ``conf.py`` declares every setting once, as a spec holding its default and what it
accepts; its settings object (``payments.kernel.app_settings``) reads the host's value through it,
and its ``checks.py`` refuses at start-up (``manage.py check``, ``migrate``, ``runserver``) a value
the spec does not accept. A nonsense value (a negative tolerance, a zero timeout, a window that does
not parse) then stops the process naming the setting, the value and the accepted range, instead
of breaking every request, submission or alert once it is read at run time.

The callbacks and triage apps use it too: they depend on payments, never the other way round.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.core.checks import Error
from django.core.exceptions import ImproperlyConfigured


class Spec:
    """One setting: its default and what it accepts. ``problem`` says what is wrong with a
    value, or returns ``None`` when it is accepted; ``text_type`` is the type a text value (an
    environment variable) is read as, so a project maps its environment onto the setting with
    the setting's own type."""

    default: Any
    accepted: str
    text_type: type = str

    def problem(self, value: Any) -> str | None:
        raise NotImplementedError


@dataclass(frozen=True)
class Unreadable:
    """A text value (an environment variable) the setting's ``text_type`` could not read. It is
    passed on in place of the value so the start-up check names the variable and its text,
    instead of the settings module stopping with a traceback."""

    variable: str
    text: str
    expected: str

    def __repr__(self) -> str:
        # Shown as the text it is; the problem names the variable.
        return repr(self.text)


def value_problem(spec: Spec, value: Any) -> str | None:
    """What ``spec`` refuses in ``value``, an unreadable environment variable included."""
    if isinstance(value, Unreadable):
        return f"the environment variable {value.variable} is not {value.expected}"
    return spec.problem(value)


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
    def text_type(self) -> type:
        # The default's own type: a tolerance of 300 is read as a whole number, as it is written.
        if self.whole or isinstance(self.default, int):
            return int
        return Decimal if isinstance(self.default, Decimal) else float

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
    # Read from text as a whole count of a unit the variable's name gives (``..._DAYS``).
    text_type: type = int

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
    text_type: type = bool

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
    # A value that is key material: a refusal names the problem, never the value.
    secret: bool = False
    # How an environment variable's text is read: ``json_text`` for a dict or a list.
    text_type: Any = str

    def problem(self, value: Any) -> str | None:
        if not isinstance(value, self.types):
            return _type_problem(value, " or ".join(t.__name__ for t in self.types))
        try:
            self.parse(value)
        except (ImproperlyConfigured, ValueError) as exc:
            return str(exc) or type(exc).__name__
        return None


def json_text(text: str) -> Any:
    """A JSON value from an environment variable: the ``text_type`` of a dict or list setting
    (``NACHA_ORIGINATOR='{"odfi_routing_number": ...}'``). Its ValueError makes it Unreadable."""
    return json.loads(text)


@dataclass(frozen=True)
class Keys(Spec):
    """A dict whose keys are among ``values`` and whose each value its spec accepts; the
    default is each key's own. With ``partial`` a host may give only some keys (the defaults
    fill the others in)."""

    values: dict[str, Spec] = field(default_factory=dict)
    partial: bool = False

    @property
    def default(self) -> dict[str, Any]:  # type: ignore[override]
        return {key: spec.default for key, spec in self.values.items()}

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
            if key in value and (problem := value_problem(spec, value[key])) is not None:
                return f"[{key!r}] = {value[key]!r}: {problem}"
        return None


def defaults(specs: dict[str, Spec]) -> dict[str, Any]:
    """The ``DEFAULTS`` dict a ``conf.py`` reads, taken from its specs."""
    return {name: spec.default for name, spec in specs.items()}


def shown(value: Any) -> str:
    text = repr(value)
    # A value from outside is quoted by repr; a huge one is cut, not echoed whole.
    return text if len(text) <= 200 else text[:200] + "..."


def setting_refused(label: str, spec: Spec, value: Any, error_id: str, obj: str) -> Error | None:
    """The error refusing ``value`` for the setting written ``label`` (``PAYMENTS["NAME"]``),
    or ``None`` when ``spec`` accepts it."""
    problem = value_problem(spec, value)
    if problem is None:
        return None
    value_text = "<not shown: key material>" if getattr(spec, "secret", False) else shown(value)
    return Error(
        f"{label} = {value_text} is refused: {problem.rstrip('.')}. Accepted: {spec.accepted}.",
        hint=f"Set {label} to {spec.accepted}, or remove it to use the default "
        f"{shown(spec.default)}.",
        obj=obj,
        id=error_id,
    )
