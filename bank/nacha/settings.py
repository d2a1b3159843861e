"""The bank path's settings, read into the writer's types (``bank.conf`` declares them)."""

from __future__ import annotations

from datetime import timedelta

from django.core.exceptions import ImproperlyConfigured

from bank import conf
from bank.nacha.originator import parse_originator
from bank.nacha.windows import Window, parse_windows
from bank.nacha.writer import Originator


def originator() -> Originator:
    found = parse_originator(conf.NACHA_ORIGINATOR)
    if found is None:
        raise ImproperlyConfigured(
            "BANK['NACHA_ORIGINATOR'] is not set: the bank path needs the originator's "
            "identity (docs/how-to/bank-direct.md)"
        )
    return found


def windows() -> tuple[Window, ...]:
    return parse_windows(conf.NACHA_WINDOWS)


def bank_buffer() -> timedelta:
    return timedelta(minutes=conf.NACHA_BANK_BUFFER_MINUTES)
