"""What a queue message carries of the request that caused it: its request id and its trace.

A message is sent with SQS message attributes (never in its body, which is the schema's):
``request_id``, the id of the request that sent it (``payments.api.errors``), and the W3C
``traceparent`` (and ``tracestate``) of the trace it belongs to when one is current. A message
that waits in the database first (the outbox row of a created payment, a message parked behind a
hold) keeps the same values in a column and is sent with them, so the request that created a
payment and the worker's submission of it are one trace however long the message waited.

OpenTelemetry is optional (the ``otel`` extra). Installed, ``propagate.inject`` writes the
current context; without it, a ``traceparent`` the request arrived with is passed on as it
came, when well formed. ``callbacks.tracing`` reads the values back in the worker.
"""

import re
from collections.abc import Mapping

try:
    from opentelemetry import propagate, trace
    from opentelemetry.baggage.propagation import W3CBaggagePropagator
    from opentelemetry.propagators.composite import CompositePropagator
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the otel extra is not installed
    propagate = trace = None

REQUEST_ID = "request_id"
TRACEPARENT = "traceparent"
CARRIED = (REQUEST_ID, TRACEPARENT, "tracestate")
# version-traceid-parentid-flags, trace and parent ids not all zeros (W3C Trace Context).
TRACEPARENT_RE = re.compile(r"^00-(?!0{32})([0-9a-f]{32})-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}$")
VALUE_MAX = 256  # a header is the caller's: no value longer than this is passed on


def outgoing_values(*, request_id: str | None, headers: Mapping[str, str]) -> dict[str, str]:
    """The values a message sent while handling a request whose id is ``request_id`` and whose
    headers are ``headers`` (Django's, whose names match in any case) carries, by name."""
    carrier: dict[str, str] = {}
    if propagate is not None and trace.get_current_span().get_span_context().is_valid:
        propagate.inject(carrier)
    elif propagate is not None and (headers.get(TRACEPARENT) or not _w3c_only()):
        propagate.inject(carrier, context=propagate.extract(headers))
    elif TRACEPARENT_RE.match(headers.get(TRACEPARENT) or ""):
        carrier[TRACEPARENT] = headers.get(TRACEPARENT)
    if request_id:
        carrier[REQUEST_ID] = request_id
    return bounded(carrier)


# What ``_w3c_only`` found for the global propagator it last saw.
_w3c_only_of: tuple[object, bool] = (None, False)


def _w3c_only() -> bool:
    """Whether the global propagator is W3C Trace Context and Baggage only (OpenTelemetry's
    default, ``OTEL_PROPAGATORS=tracecontext,baggage``). Then a request without a
    ``traceparent`` header has no trace to pass on: extracting from it and injecting what came
    out writes nothing that is carried (baggage is not), so both are skipped. Any other
    propagator (B3, Jaeger, a host's own) may read other headers: those are always extracted."""
    global _w3c_only_of
    textmap = propagate.get_global_textmap()
    if _w3c_only_of[0] is not textmap:
        members = (
            getattr(textmap, "_propagators", None)
            if type(textmap) is CompositePropagator
            else [textmap]
        )
        known = (TraceContextTextMapPropagator, W3CBaggagePropagator)
        _w3c_only_of = (textmap, bool(members) and all(type(m) in known for m in members))
    return _w3c_only_of[1]


def bounded(values: Mapping) -> dict[str, str]:
    """The carried names of ``values`` whose value is a string short enough to be an id: what
    came from outside (a header, a message sent around the endpoint) may hold anything."""
    return {
        name: value
        for name, value in values.items()
        if name in CARRIED and isinstance(value, str) and value and len(value) <= VALUE_MAX
    }


def message_attributes(values: Mapping[str, str]) -> dict:
    """``values`` as SQS ``MessageAttributes``."""
    return {
        name: {"DataType": "String", "StringValue": value}
        for name, value in bounded(values).items()
    }


def outgoing_attributes(*, request_id: str | None, headers: Mapping[str, str]) -> dict:
    """The SQS ``MessageAttributes`` of a message sent while handling a request."""
    return message_attributes(outgoing_values(request_id=request_id, headers=headers))


def carried(message_attributes: Mapping[str, dict]) -> dict[str, str]:
    """The carried values of a received message's ``MessageAttributes``, by name."""
    return bounded(
        {
            name: attribute.get("StringValue")
            for name, attribute in message_attributes.items()
            if isinstance(attribute, Mapping)
        }
    )


def trace_id_of(values: Mapping[str, str]) -> str | None:
    match = TRACEPARENT_RE.match(values.get(TRACEPARENT, ""))
    return match.group(1) if match else None
