"""One error envelope for every error the module's HTTP endpoints answer, and a request id on
every answer.

A team's clients already parse Stripe's errors, so every refusal of the payments API and the
callback endpoint, 401 to 503, has one shape::

    {"error": {"type": "invalid_request_error", "code": "parameter_invalid",
               "param": "amount", "message": "...", "request_id": "req_...",
               "errors": {"amount": ["..."]}}}

``type`` says who must act (the request, its credentials, its permissions, its rate, or us),
``code`` is stable for a program, ``param`` names the first refused field, header or query
parameter (``null`` when none), and ``errors`` keeps every problem found, bounded
(``payments.http_limits.bounded_errors``). Every answer, success too, carries ``Request-Id``;
an error's ``request_id`` is the same value and its log line names it, so a support ticket
quoting either finds the request.

Both are pinned on the module's views (``ModuleErrorsMixin``): a host installs no middleware and
its ``EXCEPTION_HANDLER`` reshapes nothing here. The id is minted per request, never taken from
the caller, so a log search for it finds this request and no forged one.
"""

from __future__ import annotations

import enum
import logging
import uuid

from django.conf import settings
from django.core.signals import got_request_exception
from django.db import InterfaceError, OperationalError
from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from rest_framework import exceptions, serializers, status
from rest_framework.response import Response
from rest_framework.views import exception_handler, set_rollback

from payments.http_limits import MORE_ERRORS, LengthRequired, PayloadTooLarge, bounded_errors

logger = logging.getLogger(__name__)

REQUEST_ID_HEADER = "Request-Id"
# Where the id lives on Django's request, for the view's answer and its log lines.
_REQUEST_ID_ATTRIBUTE = "payments_request_id"
NON_FIELD_ERRORS = "non_field_errors"

# Seconds a client should wait before retrying while the database cannot be reached: a restart
# or a failover takes a few seconds, and a shorter wait would only add load to the recovery.
DATABASE_RETRY_AFTER_SECONDS = 5
DATABASE_UNAVAILABLE_MESSAGE = "the database is unavailable; retry later"


class ErrorType(enum.StrEnum):
    # What a client does with each is in docs/reference/error-codes.md (TYPE_ACTIONS).
    INVALID_REQUEST = "invalid_request_error"  # fix the request (400, 404, 405, 409, 411-422)
    AUTHENTICATION = "authentication_error"  # 401: credentials or signature
    PERMISSION = "permission_error"  # 403: authenticated, not allowed
    IDEMPOTENCY = "idempotency_error"  # 409: the key's request is running; retry with the key
    RATE_LIMIT = "rate_limit_error"  # 429: slow down, after Retry-After
    API = "api_error"  # 5xx: ours; retry after Retry-After


# The codes DRF's own exceptions carry, renamed where Stripe's clients know another name.
_CODES = {
    "not_found": "resource_missing",
    "invalid": "parameter_invalid",
    "parse_error": "body_invalid",
    "throttled": "rate_limited",
    "too_large": "body_too_large",
}


class ApiError(exceptions.APIException):
    """A refusal the module raises or returns: its status, type, code, the parameter it names,
    a message, and the problems by name (``{name: [message, ...]}``)."""

    def __init__(
        self,
        status_code: int,
        code: str,
        message: str,
        *,
        param: str | None = None,
        errors: dict | None = None,
        error_type: ErrorType | None = None,
    ) -> None:
        self.status_code = status_code
        self.error_code = code
        self.param = param
        self.errors = bounded_errors(errors if errors is not None else {})
        self.error_type = error_type or _type_for(status_code)
        super().__init__(message, code)

    def body(self) -> dict:
        return error_body(
            self.error_type, self.error_code, str(self.detail), self.param, self.errors
        )


def field_errors(
    errors: dict, status_code: int = status.HTTP_400_BAD_REQUEST, code: str = "parameter_invalid"
) -> ApiError:
    """Problems by field (a serializer's ``errors``): ``param`` is the first named one, the
    message its first message."""
    bounded = bounded_errors(errors)
    named = [name for name in bounded if name not in (NON_FIELD_ERRORS, MORE_ERRORS)]
    param = named[0] if named else None
    first = next((messages[0] for messages in bounded.values() if messages), "invalid request")
    message = f"{param}: {first}" if param else first
    return ApiError(status_code, code, message, param=param, errors=errors)


def error_body(
    error_type: str, code: str, message: str, param: str | None, errors: dict
) -> dict[str, dict]:
    # request_id is filled in as the answer leaves the view (ModuleErrorsMixin): one place
    # sets it and the header, so the two are always the same value.
    return {
        "error": {
            "type": str(error_type),
            "code": code,
            "param": param,
            "message": message,
            "request_id": None,
            "errors": errors,
        }
    }


def _type_for(status_code: int) -> ErrorType:
    if status_code == status.HTTP_401_UNAUTHORIZED:
        return ErrorType.AUTHENTICATION
    if status_code == status.HTTP_403_FORBIDDEN:
        return ErrorType.PERMISSION
    if status_code == status.HTTP_429_TOO_MANY_REQUESTS:
        return ErrorType.RATE_LIMIT
    if status_code >= 500:
        return ErrorType.API
    return ErrorType.INVALID_REQUEST


def _as_api_error(exc: exceptions.APIException) -> ApiError:
    """DRF's own exceptions (validation, parse, authentication, permission, media type,
    method, throttle) and the body limits, in the envelope."""
    code = exc.default_code
    if isinstance(exc, exceptions.ValidationError):
        code = "invalid"
    elif isinstance(exc.get_codes(), str):
        code = exc.get_codes()
    code = _CODES.get(code, code)
    detail = exc.detail
    if isinstance(detail, dict) and set(detail) == {"errors"}:
        detail = detail["errors"]  # the strict JSON parser's problems by field
    if isinstance(detail, list):
        detail = {NON_FIELD_ERRORS: detail}
    if isinstance(detail, dict):
        return field_errors(detail, exc.status_code, code)
    if isinstance(exc, PayloadTooLarge):
        message = f"larger than {exc.limit} bytes, the limit of this API"
    else:
        message = str(detail)
    param = "body" if isinstance(exc, PayloadTooLarge | LengthRequired) else None
    errors = {param: [message]} if param else {}
    return ApiError(exc.status_code, code, message, param=param, errors=errors)


def module_exception_handler(exc: Exception, context: dict) -> Response | None:
    """The module's handler, pinned on its views: a host's ``EXCEPTION_HANDLER`` does not
    reshape these answers.

    A database that cannot be reached (refused, lost or closed connections, wherever they
    happen: authentication, the Idempotency-Key claim, the work) is the client's cue to retry,
    not a server bug: 503 with ``Retry-After``. Anything else unexpected (a bug, a bad row's
    ``DataError`` or ``IntegrityError``) is a 500 in the envelope, with the request id a
    support ticket quotes and none of the exception's text (its traceback goes to the log under
    that id, and to Django's ``got_request_exception`` as Django's own 500 would send it). With
    ``DEBUG`` on, Django's own debug page shows it instead.
    """
    if isinstance(exc, OperationalError | InterfaceError):
        return _database_unavailable_response(exc, context)
    # DRF's handler maps Django's Http404 and PermissionDenied, rolls back ATOMIC_REQUESTS and
    # sets WWW-Authenticate and Retry-After; the body is then replaced by the envelope.
    response = exception_handler(exc, context)
    if response is None:
        return None if settings.DEBUG else _unexpected_error_response(exc, context)
    if not isinstance(exc, exceptions.APIException):
        exc = (
            exceptions.NotFound() if response.status_code == 404 else exceptions.PermissionDenied()
        )
    error = exc if isinstance(exc, ApiError) else _as_api_error(exc)
    response.data = error.body()
    return response


def _database_unavailable_response(exc: Exception, context: dict) -> Response:
    # Never an idempotency.Answer: raised, not returned, so no Idempotency-Key stores it and a
    # retry with the key executes once the database is back.
    set_rollback()
    request = context["request"]
    match = getattr(request, "resolver_match", None)
    cause = exc.__cause__ or exc
    # The driver's message names the host, port and database: only the class and SQLSTATE are
    # logged, and the route's name rather than its path (a balance URL holds a merchant id).
    logger.error(
        "payments API answered 503, database unavailable: %s %s (%s%s), request %s",
        request.method,
        match.url_name if match else type(context["view"]).__name__,
        type(cause).__name__,
        f", SQLSTATE {cause.sqlstate}" if getattr(cause, "sqlstate", None) else "",
        request_id_of(request),
        extra={"outcome": "database_unavailable", "request_id": request_id_of(request)},
    )
    error = ApiError(
        status.HTTP_503_SERVICE_UNAVAILABLE, "database_unavailable", DATABASE_UNAVAILABLE_MESSAGE
    )
    response = Response(error.body(), status=error.status_code)
    response["Retry-After"] = str(DATABASE_RETRY_AFTER_SECONDS)
    # The line above is the record; Django's request log would add a second one with the path.
    response._has_been_logged = True
    return response


def _unexpected_error_response(exc: Exception, context: dict) -> Response:
    set_rollback()
    request = context["request"]
    match = getattr(request, "resolver_match", None)
    request_id = request_id_of(request)
    # The route's name, not its path (a path holds a merchant id); the traceback is the record.
    logger.error(
        "payments API answered 500, unexpected %s: %s %s, request %s",
        type(exc).__name__,
        request.method,
        match.url_name if match else type(context["view"]).__name__,
        request_id,
        exc_info=exc,
        extra={"outcome": "internal_error", "request_id": request_id},
    )
    error = ApiError(
        status.HTTP_500_INTERNAL_SERVER_ERROR,
        "internal_error",
        "an unexpected error stopped this request; nothing it asked for is promised. Quote its "
        "request_id to support; a retry with the same Idempotency-Key is safe",
    )
    # What Django's own handler does with an exception, so an error tracker hooked on the
    # signal (Sentry's Django integration, for one) still sees it, traceback and request.
    got_request_exception.send(sender=None, request=getattr(request, "_request", request))
    response = Response(error.body(), status=error.status_code)
    response._has_been_logged = True  # the record above, with its traceback, is the one
    return response


def new_request_id() -> str:
    return f"req_{uuid.uuid4().hex}"


def request_id_of(request) -> str:
    """The id minted for ``request`` (Django's or DRF's), minting one if none was."""
    request = getattr(request, "_request", request)
    request_id = getattr(request, _REQUEST_ID_ATTRIBUTE, None)
    if request_id is None:
        request_id = new_request_id()
        setattr(request, _REQUEST_ID_ATTRIBUTE, request_id)
    return request_id


class ModuleErrorsMixin:
    """For the module's ``APIView``s: its exception handler, a request id minted as the request
    arrives, and the id on the answer (header and envelope) as it leaves."""

    def get_exception_handler(self):
        return module_exception_handler

    def initialize_request(self, request, *args, **kwargs):
        setattr(request, _REQUEST_ID_ATTRIBUTE, new_request_id())
        return super().initialize_request(request, *args, **kwargs)

    def finalize_response(self, request, response, *args, **kwargs):
        response = super().finalize_response(request, response, *args, **kwargs)
        request_id = request_id_of(request)
        response[REQUEST_ID_HEADER] = request_id
        data = getattr(response, "data", None)
        if isinstance(data, dict) and isinstance(data.get("error"), dict):
            data["error"]["request_id"] = request_id
            logger.info(
                "%s answered %s %s, request %s",
                type(self).__name__,
                response.status_code,
                data["error"]["code"],
                request_id,
                extra={"request_id": request_id, "outcome": data["error"]["code"]},
            )
        return response


# --- For the OpenAPI schema ---------------------------------------------------------------------


class ErrorTypeField(serializers.ChoiceField):
    """``ErrorType``'s values; described inline by the schema (``ErrorTypeFieldSchema``)."""

    def __init__(self, **kwargs):
        super().__init__(choices=[t.value for t in ErrorType], **kwargs)


class ErrorDetailOutputSerializer(serializers.Serializer):
    type = ErrorTypeField()
    code = serializers.CharField()
    param = serializers.CharField(allow_null=True)
    message = serializers.CharField()
    request_id = serializers.CharField()
    # Every problem by name: at most 10 names, 10 messages each, and ``more_errors`` counting
    # what was left out.
    errors = serializers.DictField(child=serializers.ListField(child=serializers.CharField()))


class ErrorOutputSerializer(serializers.Serializer):
    """The shape of every error answer of the payments API and the callback endpoint."""

    error = ErrorDetailOutputSerializer()


class ErrorTypeFieldSchema(OpenApiSerializerFieldExtension):
    """The envelope's ``type`` as a pattern: drf-spectacular would move an enum into a
    component named after the field, ``TypeEnum``, which says nothing to a client."""

    target_class = ErrorTypeField

    def map_serializer_field(self, auto_schema, direction):
        types = [t.value for t in ErrorType]
        return {
            "type": "string",
            "pattern": f"^(?:{'|'.join(types)})$",
            "description": "Who must act: " + ", ".join(types) + ".",
        }
