"""One settings object per app, read from one dict of the host's Django settings.

DRF's ``api_settings`` and django-oauth-toolkit's ``oauth2_settings`` are the model: a host sets
``PAYMENTS = {"PROCESSOR_TIMEOUT_SECONDS": 5}``, ``CALLBACKS = {...}``, ``BANK = {...}``,
``TRIAGE = {...}``, and each app reads ``conf.NAME``: the host's value, else the default its spec
declares. The module's settings then sit in four names of the host's settings, beside Django's
and Celery's own, instead of fifty-odd top-level names, and a key the app does not know is
refused at start-up instead of being silently ignored.

Values are read once and kept; Django's ``setting_changed`` signal (sent by
``override_settings`` and pytest-django's ``settings`` fixture) drops them, so a test that
changes an app's dict is seen by the next read.
"""

from __future__ import annotations

import difflib
import threading
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from django.conf import settings
from django.core.checks import Error, Warning
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed

from payments.kernel.setting_specs import Keys, Spec, Unreadable, setting_refused, shown


class AppSettings:
    """The settings of the app ``app``, held in the Django setting ``setting`` (a dict).

    ``specs`` declares every setting with a default; ``required`` those without one (each with
    a spec that checks its value once set, or ``None``); ``relations`` pairs ``(low, high)`` whose
    low value may not exceed the high one; ``readers`` turn an accepted value into the one the
    code uses (the signing secrets, a string or a list, into a list). ``formerly`` names the
    dict the settings were read from in the last release (the bank app's, ``PAYMENTS``): a key
    set there and not in ``setting`` is still read, and ``moved`` warns about it. ``renamed``
    maps, per setting, a dotted path of the last release to the one that replaced it: the old one
    is read as the new, and ``renamed_paths`` warns about it. ``folded`` maps a whole dict of the
    last release to the prefix its keys took in ``setting`` (``{"PAYMENTS_BOOKS": "BOOKS_"}``:
    ``PAYMENTS_BOOKS["CLOSE_BY_HOUR_EASTERN"]`` is now ``BANK["BOOKS_CLOSE_BY_HOUR_EASTERN"]``):
    read as ``formerly`` is, with the same warning, and a key of it the app does not know is
    refused by ``refused``.
    """

    every: ClassVar[list[AppSettings]] = []

    def __init__(
        self,
        *,
        app: str,
        setting: str,
        specs: dict[str, Spec],
        required: Mapping[str, Spec | None] | None = None,
        relations: tuple[tuple[str, str], ...] = (),
        readers: Mapping[str, Callable[[Any], Any]] | None = None,
        formerly: str | None = None,
        renamed: Mapping[str, Mapping[str, str]] | None = None,
        folded: Mapping[str, str] | None = None,
    ) -> None:
        self.app = app
        self.formerly = formerly
        self.folded = dict(folded or {})
        self.renamed = {name: dict(paths) for name, paths in (renamed or {}).items()}
        self.setting = setting
        self.specs = specs
        self.required = dict(required or {})
        self.relations = relations
        self.readers = dict(readers or {})
        self.names = frozenset(specs) | frozenset(self.required)
        self._values: dict[str, Any] = {}
        # A read that raced a change is not kept: its value may be the old one.
        self._generation = 0
        self._lock = threading.Lock()
        AppSettings.every.append(self)
        setting_changed.connect(self._setting_changed, weak=False)

    def label(self, name: str) -> str:
        """How the host writes the setting: ``PAYMENTS["PROCESSOR_TIMEOUT_SECONDS"]``."""
        return f'{self.setting}["{name}"]'

    def host_values(self) -> Mapping[str, Any]:
        """The host's dict; not a dict at all is the start-up check's to refuse."""
        values = getattr(settings, self.setting, None)
        own = values if isinstance(values, Mapping) else {}
        moved = self._moved(own)
        return {**moved, **own} if moved else own

    def _moved(self, own: Mapping[str, Any]) -> dict[str, Any]:
        """This app's settings the host still sets in the dicts they left."""
        return {name: value for name, (_, value) in self._left_behind(own).items()}

    def _left_behind(self, own: Mapping[str, Any]) -> dict[str, tuple[str, Any]]:
        """Each setting still set where the last release read it (``formerly``, ``folded``),
        and not in ``setting``: its name here, the label it has there, and its value."""
        found: dict[str, tuple[str, Any]] = {}
        places = [(self.formerly, "")] if self.formerly else []
        for old_setting, prefix in [*places, *self.folded.items()]:
            old = getattr(settings, old_setting, None)
            if not isinstance(old, Mapping):
                continue
            for key, value in old.items():
                name = f"{prefix}{key}"
                if name in self.names and name not in own and name not in found:
                    found[name] = (f'{old_setting}["{key}"]', value)
        return found

    def renamed_paths(self, *, warning_id: str) -> list[Warning]:
        """One warning per setting naming a dotted path of the last release that moved: it is
        read as its new path in this release only."""
        host = self.host_values()
        return [
            Warning(
                f"{self.label(name)} = {host[name]!r} names the path of the last release; it is "
                f"read as {paths[host[name]]!r} in this release only.",
                hint=f"Set {self.label(name)} = {paths[host[name]]!r}.",
                obj=name,
                id=warning_id,
            )
            for name, paths in sorted(self.renamed.items())
            if isinstance(host.get(name), str) and host[name] in paths
        ]

    def moved(self, *, warning_id: str) -> list[Warning]:
        """One warning per setting read from the dict it left (``formerly``): it works this
        release and is refused in the next, so the host moves it now."""
        own = getattr(settings, self.setting, None)
        moved = self._left_behind(own if isinstance(own, Mapping) else {})
        return [
            Warning(
                f"{old_label} has moved to {self.label(name)}: it is read from "
                f"{old_label.split('[')[0]} in this release only.",
                hint=f"Move it into {self.setting}: {self.label(name)} = ...",
                obj=name,
                id=warning_id,
            )
            for name, (old_label, _) in sorted(moved.items())
        ]

    def folded_refused(self, *, error_id: str) -> list[Error]:
        """A dict of the last release (``folded``) that is not a dict, or holds a key the app
        does not know under its prefix: refused as an unknown key of ``setting`` would be,
        rather than ignored for the release it is still read."""
        errors = []
        for old_setting, prefix in self.folded.items():
            old = getattr(settings, old_setting, None)
            if old is None:
                continue
            if not isinstance(old, Mapping):
                errors.append(
                    Error(
                        f"{old_setting} = {shown(old)} is refused: it is a dict of settings, "
                        f"now keys of {self.setting} with the prefix {prefix}.",
                        hint=f"Move its keys into {self.setting}, each as {prefix}<key>.",
                        obj=old_setting,
                        id=error_id,
                    )
                )
                continue
            errors += [
                Error(
                    f'{old_setting}["{key}"] is not a setting of the {self.app} app.',
                    hint=f"Its settings moved into {self.setting} with the prefix {prefix}: "
                    + ", ".join(self.label(n) for n in sorted(self.names) if n.startswith(prefix)),
                    obj=str(key),
                    id=error_id,
                )
                for key in old
                if f"{prefix}{key}" not in self.names
            ]
        return errors

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self._values[name]
        except KeyError:
            pass
        if name not in self.names:
            raise AttributeError(f"{self.app}.conf has no setting {name}")
        generation = self._generation
        value = self._read(name)
        with self._lock:
            if generation == self._generation:
                self._values[name] = value
        return value

    def _read(self, name: str) -> Any:
        host = self.host_values()
        if name in self.required and self._unset(name, host):
            raise ImproperlyConfigured(
                f"{self.label(name)} is required by the {self.app} app and is not set"
            )
        spec = self.specs.get(name)
        value = host.get(name, spec.default if spec else None)
        if isinstance(value, Unreadable):
            raise ImproperlyConfigured(
                f"{self.label(name)} is refused: the environment variable {value.variable} = "
                f"{value.text!r} is not {value.expected}"
            )
        if isinstance(spec, Keys) and spec.partial and isinstance(value, Mapping):
            value = {**spec.default, **value}
        if isinstance(value, str) and value in self.renamed.get(name, {}):
            value = self.renamed[name][value]
        reader = self.readers.get(name)
        return reader(value) if reader else value

    def reload(self) -> None:
        with self._lock:
            self._generation += 1
            self._values.clear()

    def _setting_changed(self, *, setting: str, **kwargs: Any) -> None:
        if setting in (self.setting, self.formerly, *self.folded):
            self.reload()

    def _unset(self, name: str, host: Mapping[str, Any]) -> bool:
        # Blank counts as unset, unless a reader says what is wrong with it (an empty secret
        # list is named as empty).
        value = host.get(name)
        return value is None or (not value and name not in self.readers)

    def missing(self) -> list[str]:
        """The required settings the host has not set."""
        host = self.host_values()
        return [name for name in self.required if self._unset(name, host)]

    def refused(self, *, error_id: str, unknown_id: str) -> list[Error]:
        """One error per key the app does not know (``unknown_id``), then one per value its
        spec refuses, the host's or the default, and one per ``(low, high)`` pair whose low
        value exceeds its high one (``error_id``). A required setting is checked once set."""
        raw = getattr(settings, self.setting, {})
        if not isinstance(raw, Mapping):
            return [
                Error(
                    f"{self.setting} = {shown(raw)} is refused: the {self.app} app's settings "
                    "are a dict of setting names to values.",
                    hint=f"Set {self.setting} to a dict such as "
                    f'{{"{next(iter(self.specs))}": ...}}, or remove it to use the defaults.',
                    obj=self.setting,
                    id=error_id,
                )
            ]
        # A key another app took over from this dict is that app's to read and warn about.
        left = {
            name
            for other in AppSettings.every
            if other.formerly == self.setting
            for name in other.names
        }
        errors = [
            self._unknown(str(key), unknown_id)
            for key in raw
            if key not in self.names and key not in left
        ]
        raw = {**self._moved(raw), **raw}
        checked = dict(self.specs)
        values = {name: raw.get(name, spec.default) for name, spec in checked.items()}
        for name, spec in self.required.items():
            if spec is not None and raw.get(name):
                checked[name], values[name] = spec, raw[name]
        for name, spec in checked.items():
            error = setting_refused(self.label(name), spec, values[name], error_id, obj=name)
            if error is not None:
                errors.append(error)
        refused = {error.obj for error in errors}
        errors += [
            Error(
                f"{self.label(low)} = {shown(values[low])} is above {self.label(high)} = "
                f"{shown(values[high])}. Accepted: {low} at most {high}.",
                obj=low,
                id=error_id,
            )
            for low, high in self.relations
            if low not in refused and high not in refused and values[low] > values[high]
        ]
        return errors

    def stray(self, *, warning_id: str) -> list[Warning]:
        """One warning per setting of this app the host set as a top-level name of its
        settings, where the app never reads it (``PROCESSOR_BASE_URL = ...`` beside, not inside,
        ``PAYMENTS``): the old spelling, or a dict entry written out of its dict, would
        otherwise leave the default in force without a word. A warning, not an error: a host's
        own setting may share a name (``SILENCED_SYSTEM_CHECKS`` takes the id)."""
        host = self.host_values()
        return [
            Warning(
                f"{name} is set as a top-level setting, which the {self.app} app does not "
                f"read; {self.label(name)} "
                + (
                    "is also set, and is the value in force."
                    if name in host
                    else "is not set, so its default is in force."
                ),
                hint=f"Move it into {self.setting}: {self.label(name)} = ...",
                obj=name,
                id=warning_id,
            )
            for name in sorted(self.names)
            if hasattr(settings, name)
        ]

    def _unknown(self, key: str, error_id: str) -> Error:
        owner = next((other for other in AppSettings.every if key in other.names), None)
        if owner is not None:
            hint = f"{key} is a setting of the {owner.app} app: set {owner.label(key)}."
        else:
            known = {name: other for other in AppSettings.every for name in other.names}
            close = difflib.get_close_matches(key, known, n=1)
            own = difflib.get_close_matches(key, self.names, n=1)
            if own:
                hint = f"Did you mean {self.label(own[0])}?"
            elif close:
                hint = f"Did you mean {known[close[0]].label(close[0])}?"
            else:
                hint = f"The {self.app} app's settings are listed in the README's Settings."
        return Error(
            f"{self.label(key)} is not a setting of the {self.app} app.",
            hint=hint,
            obj=key,
            id=error_id,
        )
