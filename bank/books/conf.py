"""The books' settings, each with its default kept here: a host sets ``PAYMENTS_BOOKS = {...}``
with only what it changes (at least ``STATEMENT_TRANSPORT`` to collect statements)."""

from __future__ import annotations

from typing import Any

from django.conf import settings

from bank.nacha.transport_options import parse_transport

DEFAULTS: dict[str, Any] = {
    # Where the bank's BAI2 statements wait (bank.nacha.transports' shapes: a directory or
    # SFTP; ``inbound`` is read, ``outbound`` unused and defaulted to it).
    "STATEMENT_TRANSPORT": None,
    # BAI2 detail type codes the bank uses for an originated ACH batch's settlement (credits)
    # and for a return debited back (banks differ: set yours).
    "SETTLEMENT_TYPE_CODES": ("165", "166", "169", "142", "145"),
    "RETURN_TYPE_CODES": ("455", "466", "495", "555"),
    # A banking day not closed green by this hour (Eastern) of the next banking day alerts.
    "CLOSE_BY_HOUR_EASTERN": 12,
    # An open variance older than this many banking days alerts (high).
    "VARIANCE_ALERT_BANKING_DAYS": 2,
}


def books_setting(name: str) -> Any:
    if name not in DEFAULTS:
        raise KeyError(name)
    return getattr(settings, "PAYMENTS_BOOKS", {}).get(name, DEFAULTS[name])


def statement_transport_options() -> dict[str, Any] | None:
    value = books_setting("STATEMENT_TRANSPORT")
    if value is None:
        return None
    if isinstance(value, dict) and "inbound" in value and "outbound" not in value:
        value = {**value, "outbound": value["inbound"]}
    return parse_transport(value)


def books_settings_problems() -> list[str]:
    """What is wrong with ``PAYMENTS_BOOKS``, each naming its key (``manage.py check``)."""
    value = getattr(settings, "PAYMENTS_BOOKS", {})
    if not isinstance(value, dict):
        return ["PAYMENTS_BOOKS must be a dict"]
    problems = [
        f"PAYMENTS_BOOKS has an unknown key {name!r}" for name in sorted(set(value) - set(DEFAULTS))
    ]
    try:
        statement_transport_options()
    except ValueError as exc:
        problems.append(f'PAYMENTS_BOOKS["STATEMENT_TRANSPORT"] {exc}')
    for name in ("SETTLEMENT_TYPE_CODES", "RETURN_TYPE_CODES"):
        codes = value.get(name, DEFAULTS[name])
        if isinstance(codes, str) or not all(
            isinstance(c, str) and len(c) == 3 and c.isdigit() for c in codes
        ):
            problems.append(f'PAYMENTS_BOOKS["{name}"] must be a list of 3-digit BAI2 type codes')
    hour = value.get("CLOSE_BY_HOUR_EASTERN", DEFAULTS["CLOSE_BY_HOUR_EASTERN"])
    if isinstance(hour, bool) or not isinstance(hour, int) or not 0 <= hour <= 23:
        problems.append('PAYMENTS_BOOKS["CLOSE_BY_HOUR_EASTERN"] must be an hour 0-23')
    days = value.get("VARIANCE_ALERT_BANKING_DAYS", DEFAULTS["VARIANCE_ALERT_BANKING_DAYS"])
    if isinstance(days, bool) or not isinstance(days, int) or not 0 <= days <= 60:
        problems.append('PAYMENTS_BOOKS["VARIANCE_ALERT_BANKING_DAYS"] must be 0-60')
    return problems
