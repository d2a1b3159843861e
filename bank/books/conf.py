"""The books' settings are the bank app's (``BANK["BOOKS_..."]``, declared in ``bank.conf``);
this reads the one that needs its parser at run time."""

from __future__ import annotations

from typing import Any

from bank import conf
from bank.books.options import parse_statement_transport


def statement_transport_options() -> dict[str, Any] | None:
    """Where the bank's statements wait (``BANK["BOOKS_STATEMENT_TRANSPORT"]``), or None."""
    return parse_statement_transport(conf.BOOKS_STATEMENT_TRANSPORT)
