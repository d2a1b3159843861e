"""A log formatter under which no value from outside can start a record of its own.

Operators' notes, queue messages' fields and processors' texts are logged as they came. With a
plain ``Formatter`` a note holding ``"\\n2026-01-01 INFO fake"`` printed a second, forged
record. Here the message (``record.getMessage()``, arguments included) is one line: CR, LF and
every other C0 or C1 control character, and the Unicode line and paragraph separators, are
written as escapes (``\\n``). A traceback keeps its own line breaks, but each of its lines is
indented with ``"  | "``, so only the first line of a record starts at the margin, whatever an
exception's text holds.

In LOGGING: ``"formatters": {"plain": {"()": "payments.kernel.logformat.SingleLineFormatter",
"format": "..."}}``; it takes the arguments of ``logging.Formatter``.

``BankNumbersInUrlsFilter`` masks bank numbers in the paths and queries an access log line
quotes (``payments.kernel.bank_numbers``): a client that puts an account number in a URL
(``/api/merchants/758259572987/balance/``) is answered 400, but the server has logged the URL
already. In LOGGING it filters the ``django.server`` (runserver) and ``django.request``
(``Bad Request: /path``) loggers; ``config/gunicorn.py`` puts it on ``gunicorn.access``.

``JsonLineFormatter`` is the format for a fleet's log pipeline: one JSON object per line, with
every field a call passes in ``extra=`` (payment_id, message_id, outcome, ...) and the ones bound
by ``payments.kernel.logcontext`` (request_id, trace_id) as keys of their own. JSON's escaping is
what keeps a value from outside inside its record: a line break, a NUL or a quote is written as its
escape, and a lone surrogate as ``\\udcxx`` (ASCII output), so every record is one parseable
line; a traceback is the string of one key.
"""

import copy
import logging
import re
from typing import Any

from pythonjsonlogger.json import JsonFormatter

from payments.kernel.bank_numbers import mask_bank_numbers_in_urls

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
# Inside a traceback a line break is the traceback's own; everything else is escaped.
_CONTROL_BUT_LF = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029]")
CONTINUATION = "  | "


def _escape(match: re.Match) -> str:
    return match.group().encode("unicode_escape").decode("ascii")


def one_line(text: str) -> str:
    """``text`` with every control character written as its escape."""
    return _CONTROL.sub(_escape, text)


def continuation_lines(text: str) -> str:
    """A traceback or stack: its own line breaks kept, each line indented as a continuation."""
    lines = _CONTROL_BUT_LF.sub(_escape, text).split("\n")
    return "\n".join(CONTINUATION + line for line in lines)


class SingleLineFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        # A copy: other handlers of the same record format it their own way.
        safe = copy.copy(record)
        safe.msg = one_line(record.getMessage())
        safe.args = None
        safe.exc_info = safe.exc_text = safe.stack_info = None
        text = super().format(safe)
        blocks = []
        if record.exc_info:
            blocks.append(self.formatException(record.exc_info))
        elif record.exc_text:
            blocks.append(record.exc_text)
        if record.stack_info:
            blocks.append(self.formatStack(record.stack_info))
        for block in blocks:
            text += "\n" + continuation_lines(block.rstrip("\n"))
        return text


class JsonLineFormatter(JsonFormatter):
    """python-json-logger's formatter with the module's key names: ``time`` (ISO 8601, UTC),
    ``level``, ``logger``, ``message``, then each extra field. Takes its arguments too."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("fmt", "%(levelname)s %(name)s %(message)s")
        kwargs.setdefault("rename_fields", {"levelname": "level", "name": "logger"})
        kwargs.setdefault("timestamp", "time")
        super().__init__(*args, **kwargs)


class BankNumbersInUrlsFilter(logging.Filter):
    """On a logger: every record's paths, queries and URLs with their bank numbers masked to
    the last 4 digits (``/api/merchants/****2987/balance/``); the rest of the line (status,
    size, duration) as it was. A record's ``request`` (``django.request`` passes the request
    object, which a JSON line writes as its repr, path included) is shown masked the same way;
    its attributes are the request's own, for the handlers that read them."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = mask_bank_numbers_in_urls(message)
        if masked != message:
            record.msg, record.args = masked, None
        request = getattr(record, "request", None)
        if request is not None and not isinstance(request, _MaskedRepr):
            record.request = _MaskedRepr(request)
        return True


class _MaskedRepr:
    """``wrapped`` with its text forms masked by ``mask_bank_numbers_in_urls``."""

    def __init__(self, wrapped: Any) -> None:
        self._wrapped = wrapped

    def __getattr__(self, name: str) -> Any:
        return getattr(self._wrapped, name)

    def __repr__(self) -> str:
        return mask_bank_numbers_in_urls(repr(self._wrapped))

    def __str__(self) -> str:
        return mask_bank_numbers_in_urls(str(self._wrapped))
