"""One trace from the callback to the ledger: the context the worker applies a message in.

What a message carries (its request id and W3C ``traceparent``, as SQS message attributes) is
``payments.kernel.propagation``'s, the one hand-written propagation: every sender uses it (the
callback endpoint, the outbox relay, a parked message's release). The worker reads the values on
receive and binds ``request_id``, ``trace_id``, ``message_id`` and ``payment_id`` to every log
record written while the message is in hand (``payments.kernel.logcontext``).

OpenTelemetry is optional (the ``otel`` extra). Installed, the worker's span for a message is
started as a child of the context ``propagate.extract`` reads back, so endpoint, SQS and worker
(and what the host's instrumentations add: the processor call, the database) are one trace.
Without it, the worker's log records still name the trace id the message carried.
"""

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

from payments.kernel import logcontext
from payments.kernel.propagation import (
    REQUEST_ID,
    TRACEPARENT,
    carried,
    outgoing_attributes,
    propagate,
    trace,
    trace_id_of,
)

__all__ = ["REQUEST_ID", "TRACEPARENT", "carried", "message_in_hand", "outgoing_attributes"]

# A proxy until the host sets its tracer provider, then that provider's tracer.
_tracer = trace.get_tracer("callbacks.worker") if trace is not None else None


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
