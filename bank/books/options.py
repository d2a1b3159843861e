"""The books' settings' parsers (``bank.conf`` declares the settings): the check at start-up
and the code at run time read a value through the same function."""

from __future__ import annotations

from typing import Any

from bank.nacha.transport_options import parse_transport

STATEMENT_TRANSPORT_ACCEPTED = (
    "None, or a dict of NACHA_TRANSPORT's shapes (a directory or SFTP) whose 'inbound' is where "
    "the bank's BAI2 statements wait ('outbound' unused, defaulted to it)"
)
TYPE_CODES_ACCEPTED = "a list of 3-digit BAI2 type codes, such as ['165', '166']"


def parse_statement_transport(value: Any) -> dict[str, Any] | None:
    """The transport's options, ``outbound`` defaulted to ``inbound`` (nothing is sent)."""
    if value is None:
        return None
    if isinstance(value, dict) and "inbound" in value and "outbound" not in value:
        value = {**value, "outbound": value["inbound"]}
    return parse_transport(value)


def parse_type_codes(value: Any) -> tuple[str, ...]:
    if isinstance(value, str) or not all(
        isinstance(code, str) and len(code) == 3 and code.isascii() and code.isdigit()
        for code in value
    ):
        raise ValueError(f"must be {TYPE_CODES_ACCEPTED}")
    return tuple(value)
