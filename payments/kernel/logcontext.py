"""Fields bound to every log record written while a piece of work runs (a worker's message).

A worker's message is logged from many places (the worker, the handlers, ``payments.services``,
the processor client), most of which never see the message. ``bound(request_id=..., ...)`` puts
the fields in a context variable for the duration of the work, and ``LogContextFilter``, which
LOGGING installs on its handler, copies them onto each record that passes, so every logger of
the process carries them without passing them along. A field the call itself gives
(``extra=``) wins over the bound one. Context variables follow threads and tasks correctly: a
value bound in one never shows in another.
"""

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_fields: ContextVar[dict[str, str] | None] = ContextVar("payments_log_fields", default=None)


def current() -> dict[str, str]:
    """The fields bound here now (a copy)."""
    return dict(_fields.get() or {})


@contextmanager
def bound(**fields: str | None) -> Iterator[None]:
    """Bind ``fields`` (those not None) on top of what is bound already, until the block ends."""
    token = _fields.set(
        {**(_fields.get() or {}), **{k: v for k, v in fields.items() if v is not None}}
    )
    try:
        yield
    finally:
        _fields.reset(token)


class LogContextFilter(logging.Filter):
    """Copies the bound fields onto every record that has no value of its own for them."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name, value in (_fields.get() or {}).items():
            if not hasattr(record, name):
                setattr(record, name, value)
        return True
