"""This project's environment variables, mapped onto the module's four settings dicts.

The apps hold every default (``payments/conf.py``, ``callbacks/conf.py``, ``bank/conf.py``,
``triage/conf.py``); this project only passes through a variable that is set, read with the
type its setting declares (``Spec.text_type``), so an unset one takes the app's default and no
default is written twice. A variable whose text that type cannot read is passed on as
``Unreadable``: ``manage.py check`` then names the variable and its text instead of the settings
module stopping with a traceback. A required setting's variable stays required: unset, start-up
stops naming it.
"""

from collections.abc import Iterable, Mapping
from datetime import timedelta
from decimal import Decimal

import environ

from payments.kernel.app_settings import AppSettings
from payments.kernel.setting_specs import Duration, Spec, Unreadable, json_text

# A duration's variable gives a whole count of the unit its name ends with.
_UNITS = {"DAYS": "days", "HOURS": "hours", "MINUTES": "minutes", "SECONDS": "seconds"}
_EXPECTED = {
    int: "a whole number",
    float: "a number",
    Decimal: "a decimal number",
    json_text: "JSON",
}


def app_settings_from_environ(
    env: environ.Env,
    app: AppSettings,
    same_names: Iterable[str] = (),
    **renamed: str | Mapping[str, str],
) -> dict:
    """``app``'s dict from the variables that are set: each of ``same_names`` from the variable
    of its own name, each of ``renamed`` from the variable given (``PROCESSED_EVENT_RETENTION=
    "PROCESSED_EVENT_RETENTION_DAYS"``), or for a dict setting one variable per key
    (``RETURN_RATE_THRESHOLDS={"overall": "RETURN_RATE_OVERALL_PERCENT", ...}``; the keys not
    set keep their defaults)."""
    variables: dict[str, str | Mapping[str, str]] = {name: name for name in same_names}
    variables.update(renamed)
    values: dict = {}
    for name, variable in variables.items():
        if name in app.required:
            values[name] = env.str(variable)
        elif isinstance(variable, Mapping):
            spec = app.specs[name]
            given = {key: _read(env, spec.values[key], var) for key, var in variable.items()}
            given = {key: value for key, value in given.items() if value is not None}
            if given:
                values[name] = {**spec.default, **given}
        elif (value := _read(env, app.specs[name], variable)) is not None:
            values[name] = value
    return values


def _read(env: environ.Env, spec: Spec, variable: str):
    """The variable's value read as ``spec`` declares, ``None`` when it is not set."""
    if variable not in env.ENVIRON:
        return None
    try:
        value = env.get_value(variable, cast=spec.text_type)
    except (ValueError, ArithmeticError):
        expected = _EXPECTED.get(spec.text_type, f"a {spec.text_type.__name__}")
        return Unreadable(variable, env.ENVIRON[variable], expected)
    if isinstance(spec, Duration):
        return timedelta(**{_UNITS[variable.rsplit("_", 1)[1]]: value})
    return value
