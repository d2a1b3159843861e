"""Bounds on what the module's HTTP edges read and answer.

A body is read at most one byte past its limit, whatever ``Content-Length`` says; an error
answer names the first few problems and counts the rest. Without the second bound a body of
20,000 unknown fields got a 2 MB answer, and a key stored it for a day: a client could amplify
its traffic several times over and fill the database.
"""

from __future__ import annotations

import io

from django.http import HttpRequest
from rest_framework import exceptions, status

# Problems named in one error answer, messages per problem, and the characters of a name or a
# message: enough to fix a request, never proportional to its size.
MAX_ERROR_FIELDS = 10
MAX_ERROR_MESSAGES = 10
MAX_ERROR_NAME_CHARS = 64
MAX_ERROR_MESSAGE_CHARS = 300
# The entry that counts what was left out, beside the named problems.
MORE_ERRORS = "more_errors"


class PayloadTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "too_large"

    def __init__(self, limit: int) -> None:
        self.limit = limit
        super().__init__(f"Request body is larger than {limit} bytes.")


class LengthRequired(exceptions.APIException):
    status_code = status.HTTP_411_LENGTH_REQUIRED
    default_code = "length_required"
    default_detail = (
        "A body without Content-Length can only be read through a server that decodes chunked "
        "requests (gunicorn does); send Content-Length."
    )


def _declared_length(request: HttpRequest) -> int | None:
    value = request.META.get("CONTENT_LENGTH")
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        return None


def read_body_limited(request: HttpRequest, limit: int) -> bytes:
    """Read the whole body, refusing more than ``limit`` bytes (413), and keep it as the
    request's body, so a signature check and the parser see exactly these bytes.

    The declared length can be wrong (ASGI streams the real body), so one byte past the limit
    is read rather than trusting it. It can also be absent: with no ``Transfer-Encoding``
    either, the body is empty (HTTP/1.1); with ``Transfer-Encoding: chunked``, Django's WSGI
    request would read nothing at all, so the body comes from ``wsgi.input`` when the server
    says it ends there (``wsgi.input_terminated``, as gunicorn does), and is refused with 411
    by a server that cannot say where it ends. Under ASGI the server has already framed the
    body. Reading it here also keeps Django's ``RequestDataTooBig`` (an HTML 400) from ever
    answering for the module.
    """
    declared = _declared_length(request)
    if declared is not None and declared > limit:
        raise PayloadTooLarge(limit)
    environ = getattr(request, "environ", None)
    chunked = declared is None and "HTTP_TRANSFER_ENCODING" in request.META
    if chunked and environ is not None and "wsgi.input" in environ:
        if not environ.get("wsgi.input_terminated"):
            raise LengthRequired()
        body = environ["wsgi.input"].read(limit + 1)
    else:
        body = request.read(limit + 1)
    if len(body) > limit:
        raise PayloadTooLarge(limit)
    # From here on request.body is these bytes, and DRF's parser reads them from the start.
    request._body = body
    request._stream = io.BytesIO(body)
    request.META["CONTENT_LENGTH"] = str(len(body))
    return body


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def bounded_errors(errors: dict) -> dict[str, list[str]]:
    """``{name: [message, ...]}`` with at most ``MAX_ERROR_FIELDS`` names, each with at most
    ``MAX_ERROR_MESSAGES`` messages, every name and message clipped; what was left out is
    counted under ``more_errors``, so the answer says there is more without repeating it.
    Bounding a bounded dict changes nothing."""
    bounded: dict[str, list[str]] = {}
    more_fields = more_messages = 0
    # Bounded already (a parser's answer passed on): its count is kept, not counted as a field.
    earlier = [str(message) for message in errors.get(MORE_ERRORS, [])]
    for name, messages in errors.items():
        if name == MORE_ERRORS:
            continue
        if not isinstance(messages, list | tuple):
            messages = [messages]
        if len(bounded) >= MAX_ERROR_FIELDS:
            more_fields += 1
            continue
        key = _clip(str(name), MAX_ERROR_NAME_CHARS)
        shown = bounded.setdefault(key, [])
        for message in messages:
            if len(shown) >= MAX_ERROR_MESSAGES:
                more_messages += 1
            else:
                shown.append(_clip(str(message), MAX_ERROR_MESSAGE_CHARS))
    more = earlier[:MAX_ERROR_MESSAGES]
    if more_fields:
        more.append(f"and {more_fields:,} more fields with errors, not shown")
    if more_messages:
        more.append(f"and {more_messages:,} more messages, not shown")
    if more:
        bounded[MORE_ERRORS] = more
    return bounded
