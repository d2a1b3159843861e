"""``POST /callbacks/processor/``: check a processor callback and put it on the FIFO queue.

A DRF view that declares everything it relies on (authentication, permission, parser, renderer,
content negotiation, versioning, throttle, metadata, schema, exception handler), so a host
project's ``REST_FRAMEWORK`` defaults change nothing; its errors are the module's envelope
(``payments.api.errors``) and every answer carries ``Request-Id``. The signature is the
authentication, over the exact bytes that were signed; the processor backend
(``PROCESSOR_BACKEND``) checks it and turns the body into an event; the view writes nothing to
the database: a 202 means the event is on the queue (SQS holds the promise), a 503 means nothing
was promised and the processor must retry. Checks run cheapest first and in
the contract's order: size (413), media type (415), signature (401), body (400).
"""

import json
import logging
import threading
from collections import OrderedDict

from django.db import transaction
from django.http import HttpResponse
from django.utils.decorators import method_decorator
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    inline_serializer,
)
from rest_framework import exceptions, serializers, status
from rest_framework.authentication import BaseAuthentication
from rest_framework.metadata import SimpleMetadata
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.permissions import IsAuthenticated
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from callbacks import conf as callbacks_conf
from callbacks import sqs, tracing
from callbacks.metrics import CALLBACKS_RECEIVED, DEDUP_HITS
from callbacks.schema import processor_event_outgoing
from callbacks.serializers import ProcessorEventSerializer
from payments import signing
from payments.api.errors import (
    REQUEST_ID_HEADER,
    ErrorOutputSerializer,
    ModuleErrorsMixin,
    request_id_of,
)
from payments.events import ProcessorEvent
from payments.exceptions import InvalidCallback
from payments.http_limits import LengthRequired, PayloadTooLarge, bounded_errors, read_body_limited
from payments.processor.backend import CallbackRequest, get_backend
from payments.strictjson import StrictJSONParser

logger = logging.getLogger(__name__)

# Seconds the processor should wait before retrying when the queue is down. Short: an SQS
# outage is usually brief and every retry that lands after recovery is accepted.
RETRY_AFTER_SECONDS = 10
JSON = "application/json"


class _RecentSends:
    """processor_event_id -> SQS message id of this process's recent sends.

    SQS answers a send inside its deduplication window with the original message id; seeing
    the same id again for the same deduplication id is how a repeat delivery becomes visible
    (per process, bounded; only for the metric, never for a decision).
    """

    def __init__(self, size: int = 10_000) -> None:
        self._size = size
        self._ids: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def is_repeat(self, deduplication_id: str, message_id: str) -> bool:
        with self._lock:
            repeat = self._ids.get(deduplication_id) == message_id
            self._ids[deduplication_id] = message_id
            self._ids.move_to_end(deduplication_id)
            if len(self._ids) > self._size:
                self._ids.popitem(last=False)
        return repeat


_recent_sends = _RecentSends()


class QueueUnavailable(exceptions.APIException):
    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_code = "queue_unavailable"
    default_detail = "The event queue is unavailable; nothing was accepted, retry later."


class InvalidEvent(exceptions.APIException):
    """A body that breaks the contract: 400 naming the fields, the envelope's ``errors``."""

    status_code = status.HTTP_400_BAD_REQUEST
    default_code = "body_invalid"

    def __init__(self, errors: dict[str, list[str]]) -> None:
        # Bounded: a body of thousands of bad fields must not get an answer of its own size.
        super().__init__({"errors": bounded_errors(errors)})


class ProcessorPrincipal:
    """Who a correctly signed request comes from: the processor, not a user of ours."""

    is_authenticated = True
    is_anonymous = False

    def __str__(self) -> str:
        return "processor"


def _callback_request(request: Request) -> CallbackRequest:
    """The raw request as the processor backend verifies and parses it, with the endpoint's
    secrets; built once per request (reading the secrets parses their setting)."""
    http = request._request
    built = getattr(http, "_processor_callback", None)
    if built is None:
        built = http._processor_callback = CallbackRequest(
            body=http.body,
            headers=request.headers,
            secrets=tuple(callbacks_conf.CALLBACK_SIGNING_SECRETS),
            tolerance_seconds=callbacks_conf.CALLBACK_TOLERANCE_SECONDS,
        )
    return built


class ProcessorSignatureAuthentication(BaseAuthentication):
    """The processor backend's signature check over the raw body as received (not as
    re-serialised JSON); the reference backend's is ``X-Processor-Signature:
    t=<unix seconds>,v1=<hex>``, an HMAC-SHA256 over ``"<t>."`` plus the body, against any
    configured secret."""

    def authenticate(self, request: Request):
        try:
            get_backend().callback_verify(_callback_request(request))
        except signing.SignatureError as exc:
            logger.warning("callback rejected: %s", exc, extra={"outcome": "bad_signature"})
            raise exceptions.AuthenticationFailed(str(exc)) from None
        return ProcessorPrincipal(), None

    def authenticate_header(self, request: Request) -> str:
        # Makes DRF answer 401 (not 403) and tells the caller which scheme is expected.
        return get_backend().callback_challenge()


class JSONOnlyNegotiation(BaseContentNegotiation):
    """JSON whatever the Accept header says: a processor sending ``Accept: text/html`` gets
    the contract's answers, not a 406 the contract does not have."""

    def select_parser(self, request, parsers):
        for parser in parsers:
            if request.content_type.split(";")[0].strip().lower() == parser.media_type:
                return parser
        return None

    def select_renderer(self, request, renderers, format_suffix=None):
        return renderers[0], renderers[0].media_type


# Which exception is which outcome of the callbacks_received metric.
_OUTCOMES = {
    PayloadTooLarge: "too_large",
    LengthRequired: "length_required",
    exceptions.UnsupportedMediaType: "unsupported_media_type",
    exceptions.AuthenticationFailed: "bad_signature",
    exceptions.NotAuthenticated: "bad_signature",
    exceptions.ParseError: "bad_body",
    InvalidEvent: "bad_body",
    QueueUnavailable: "queue_unavailable",
    exceptions.MethodNotAllowed: "method_not_allowed",
}


def _accepted(processor_event_id: str) -> HttpResponse:
    """The 202, ``{"status": "accepted", "processor_event_id": ...}`` as DRF's JSON renderer
    writes it, built directly: the one answer of every accepted callback needs no negotiation
    or rendering."""
    return HttpResponse(
        b'{"status":"accepted","processor_event_id":'
        + json.dumps(processor_event_id).encode()
        + b"}",
        status=status.HTTP_202_ACCEPTED,
        content_type=JSON,
    )


def _error(description: str) -> OpenApiResponse:
    return OpenApiResponse(ErrorOutputSerializer, description=description)


_RESPONSES = {
    202: OpenApiResponse(
        inline_serializer(
            "CallbackAccepted",
            {"status": serializers.CharField(), "processor_event_id": serializers.CharField()},
        ),
        description="On the queue: the event will be applied exactly once.",
    ),
    400: _error(
        "The body breaks the contract or cannot be stored: the first 10 bad fields named in "
        "errors, the rest counted under more_errors."
    ),
    401: _error("Signature missing, malformed, not matching, or outside 300 s."),
    405: _error("Only POST is accepted."),
    411: _error("Chunked body on a server that cannot say where it ends."),
    413: _error("Body over 64 KiB."),
    415: _error("Content-Type is not application/json."),
    503: _error("The queue did not take the event: nothing was accepted, retry."),
}


def _publish(event: ProcessorEvent, request: Request) -> tuple[str, str]:
    """Put ``event`` on the main queue now; its deduplication id and its SQS message id once
    SQS accepted it. The message (``processor_event_outgoing``, as every path that queues a
    processor event builds it) carries the request's id and trace (``callbacks.tracing``) to
    the worker.

    With ``CALLBACK_SEND_COALESCE_SECONDS`` above zero, the callbacks this process receives at
    the same time share one ``SendMessageBatch`` (far less CPU per callback than a SendMessage
    each, see docs/benchmarks.md), and each is answered from SQS's answer for its own entry.
    At zero, each is sent alone.
    """
    message = processor_event_outgoing(
        event,
        attributes=tracing.outgoing_attributes(
            request_id=request_id_of(request), headers=request.headers
        ),
    )
    window = callbacks_conf.CALLBACK_SEND_COALESCE_SECONDS
    if window > 0:
        message_id = sqs.send_message_coalesced_now(
            body=message.body,
            group_id=message.group_id,
            deduplication_id=message.deduplication_id,
            window=window,
            attributes=message.attributes,
        )
    else:
        message_id = sqs.send_message_now(
            body=message.body,
            group_id=message.group_id,
            deduplication_id=message.deduplication_id,
            attributes=message.attributes,
        )
    return message.deduplication_id, message_id


# The endpoint writes nothing to the database and sends to SQS, which the gateway refuses inside a
# transaction: a host's ATOMIC_REQUESTS must not wrap it.
@method_decorator(transaction.non_atomic_requests, name="dispatch")
class ProcessorCallbackApi(ModuleErrorsMixin, APIView):
    authentication_classes = [ProcessorSignatureAuthentication]
    permission_classes = [IsAuthenticated]
    parser_classes = [StrictJSONParser]
    renderer_classes = [JSONRenderer]
    content_negotiation_class = JSONOnlyNegotiation
    # Never throttled: a refused callback is a money event the processor must send again.
    throttle_classes: list = []
    versioning_class = None
    metadata_class = SimpleMetadata
    schema = AutoSchema()

    def dispatch(self, request, *args, **kwargs):
        if callbacks_conf.CALLBACK_SEND_COALESCE_SECONDS <= 0:
            return super().dispatch(request, *args, **kwargs)
        # Announced from the start: a batch opened meanwhile by another request knows how many
        # callers may still join it (see _publish).
        with sqs.coalesced_send_expected():
            return super().dispatch(request, *args, **kwargs)

    def initial(self, request: Request, *args, **kwargs) -> None:
        if request.method != "POST":
            raise exceptions.MethodNotAllowed(request.method)
        read_body_limited(request._request, callbacks_conf.CALLBACK_MAX_BODY_BYTES)
        media_type = request.content_type.split(";")[0].strip().lower()
        if media_type != JSON:
            raise exceptions.UnsupportedMediaType(
                request.content_type,
                detail=f"Content-Type must be application/json, got {request.content_type!r}.",
            )
        super().initial(request, *args, **kwargs)  # authentication (401) and permission

    def handle_exception(self, exc: Exception) -> Response:
        outcome = next((o for t, o in _OUTCOMES.items() if isinstance(exc, t)), None)
        if outcome is not None:
            CALLBACKS_RECEIVED.labels(outcome=outcome).inc()
        response = super().handle_exception(exc)
        if isinstance(exc, QueueUnavailable):
            response["Retry-After"] = str(RETRY_AFTER_SECONDS)
        return response

    @extend_schema(
        operation_id="processor_callback",
        request=ProcessorEventSerializer,
        responses=_RESPONSES,
        parameters=[
            OpenApiParameter(
                REQUEST_ID_HEADER,
                str,
                OpenApiParameter.HEADER,
                response=True,
                description="This request's id (req_...), also an error's request_id.",
            ),
            OpenApiParameter(
                "Retry-After",
                int,
                OpenApiParameter.HEADER,
                response=[503],
                description="Seconds to wait before retrying.",
            ),
        ],
        description=(
            "A processor event, signed over the raw body. Checked in this order: size (413), "
            "media type (415), signature (401), body (400); then queued (202) or not (503)."
        ),
    )
    def post(self, request: Request) -> HttpResponse:
        if not request._request.body:
            raise InvalidEvent({"non_field_errors": ["Body is empty; expected a JSON object."]})
        try:
            event = get_backend().callback_parse(request.data, _callback_request(request))
        except InvalidCallback as exc:
            raise InvalidEvent(exc.errors) from None
        try:
            deduplication_id, message_id = _publish(event, request)
        except sqs.QueueUnavailable as exc:
            logger.error(
                "callback not accepted, queue unavailable: %s",
                exc,
                extra={
                    "payment_id": str(event.payment_id),
                    "processor_event_id": event.processor_event_id,
                    "outcome": "queue_unavailable",
                },
            )
            raise QueueUnavailable() from exc

        if _recent_sends.is_repeat(deduplication_id, message_id):
            DEDUP_HITS.labels(layer="sqs").inc()
        CALLBACKS_RECEIVED.labels(outcome="accepted").inc()
        logger.info(
            "callback accepted",
            extra={
                "payment_id": str(event.payment_id),
                "processor_event_id": event.processor_event_id,
                "event_type": event.event_type,
                "message_id": message_id,
                "request_id": request_id_of(request),
                "outcome": "accepted",
            },
        )
        return _accepted(event.processor_event_id)


processor_callback = ProcessorCallbackApi.as_view()
