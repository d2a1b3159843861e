"""One trace from the callback to the ledger: what a message carries through SQS, and the
context the worker applies it in.

A message is sent with SQS message attributes (never in its body, which is the schema's):
``request_id``, the id of the request that sent it (``payments.api_errors``), and the W3C
``traceparent`` (and ``tracestate``) of the trace it belongs to when one is current. The worker
reads them on receive and binds ``request_id``, ``trace_id``, ``message_id`` and ``payment_id``
to every log record written while the message is in hand (``payments.logcontext``).

OpenTelemetry is optional (the ``otel`` extra). Installed, ``propagate.inject`` writes the
current context into the attributes on send, and the worker's span for a message is started as
a child of the context ``propagate.extract`` reads back, so endpoint, SQS and worker (and what
the host's instrumentations add: the processor call, the database) are one trace. Without it,
a ``traceparent`` the callback arrived with is passed on as it came, when well formed, so the
worker's log records still name its trace id. This module is the only hand-written
propagation; everything else is the instrumentation packages' (see the README).
"""

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, nullcontext

from payments import logcontext

try:
    from opentelemetry import propagate, trace
except ImportError:  # the otel extra is not installed
    propagate = trace = None

REQUEST_ID = "request_id"
TRACEPARENT = "traceparent"
_CARRIED = (REQUEST_ID, TRACEPARENT, "tracestate")
# version-traceid-parentid-flags, trace and parent ids not all zeros (W3C Trace Context).
_TRACEPARENT = re.compile(r"^00-(?!0{32})([0-9a-f]{32})-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}$")
_VALUE_MAX = 256  # a header is the caller's: no attribute value longer than this is passed on

# A proxy until the host sets its tracer provider, then that provider's tracer.
_tracer = trace.get_tracer("callbacks.worker") if trace is not None else None


def outgoing_attributes(*, request_id: str | None, headers: Mapping[str, str]) -> dict:
    """The SQS ``MessageAttributes`` for a message sent while handling a request whose id is
    ``request_id`` and whose headers are ``headers`` (Django's, whose names match in any case)."""
    carrier: dict[str, str] = {}
    if propagate is not None and trace.get_current_span().get_span_context().is_valid:
        propagate.inject(carrier)
    elif propagate is not None:
        propagate.inject(carrier, context=propagate.extract(headers))
    elif _TRACEPARENT.match(headers.get(TRACEPARENT) or ""):
        carrier[TRACEPARENT] = headers.get(TRACEPARENT)
    if request_id:
        carrier[REQUEST_ID] = request_id
    return {
        name: {"DataType": "String", "StringValue": value}
        for name, value in carrier.items()
        if name in _CARRIED and value and len(value) <= _VALUE_MAX
    }


def carried(message_attributes: Mapping[str, dict]) -> dict[str, str]:
    """The carried values of a received message's ``MessageAttributes``, by name. A message
    sent around the endpoint may hold anything: a value that is not a string, or too long to
    be an id, is left out rather than written on every record."""
    return {
        name: value
        for name, attribute in message_attributes.items()
        if name in _CARRIED
        and isinstance(value := attribute.get("StringValue"), str)
        and len(value) <= _VALUE_MAX
    }


def trace_id_of(values: Mapping[str, str]) -> str | None:
    match = _TRACEPARENT.match(values.get(TRACEPARENT, ""))
    return match.group(1) if match else None


@contextmanager
def message_in_hand(message, *, span: bool = True) -> Iterator[None]:
    """Apply ``message`` (a ``ReceivedMessage``) in its trace: its fields bound to every log
    record, and, with OpenTelemetry and ``span``, a worker span that is the child of the
    context the message carries (``span=False`` for the records written after its span)."""
    values = carried(message.message_attributes)
    opened = nullcontext()
    if span and trace is not None:
        opened = _tracer.start_as_current_span(
            f"process {message.kind or 'unknown'}",
            context=propagate.extract(values),
            kind=trace.SpanKind.CONSUMER,
            attributes={
                "messaging.system": "aws_sqs",
                "messaging.operation.type": "process",
                "messaging.message.id": message.message_id,
            },
        )
    with (
        opened as current,
        logcontext.bound(
            request_id=values.get(REQUEST_ID),
            trace_id=_span_trace_id(current) or trace_id_of(values),
            message_id=message.message_id,
            payment_id=message.payment_id or None,
        ),
    ):
        yield


def _span_trace_id(span) -> str | None:
    if span is None or not span.get_span_context().is_valid:
        return None
    return format(span.get_span_context().trace_id, "032x")
