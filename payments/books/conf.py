"""The books' settings, each with its default kept here: a host sets ``PAYMENTS_BOOKS = {...}``
with only what it changes (at least ``STATEMENT_TRANSPORT`` to collect statements)."""

from __future__ import annotations

from typing import Any

from django.conf import settings

from payments.nacha.transports import parse_transport

DEFAULTS: dict[str, Any] = {
    # Where the bank's BAI2 statements wait (payments.nacha.transports' shapes: a directory or
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
