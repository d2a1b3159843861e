"""The processor event on both sides of the queue: parsing, the queue envelope, the dedup id.

The callback endpoint validates what the processor posted with ``ProcessorEventSerializer``
(``callbacks/serializers.py``); the queue message it publishes is an envelope our code writes
(``processor_event_message``): ``kind``, the queue layer's own markers, and the processor's event
*nested* under ``event``. Nothing the processor sends lands beside our markers (``redrive``,
``dead_letter``), so no callback can pose as an operator's redrive. The worker takes the event
back out with ``processor_event_from_message``, through the same serializer.
"""

import hashlib
from datetime import UTC, datetime

from callbacks.serializers import ProcessorEventSerializer
from callbacks.sqs import OutgoingMessage
from payments.events import ProcessorEvent
from payments.messages import EVENT_KEY, MessageKind, nested_event, processor_event_body

PROCESSOR_EVENT = MessageKind.PROCESSOR_EVENT


class InvalidMessage(Exception):
    """The body breaks the contract; ``errors`` maps each bad field to what is wrong with it."""

    def __init__(self, errors: dict[str, list[str]]) -> None:
        self.errors = errors
        summary = "; ".join(f"{k}: {' '.join(v)}" for k, v in errors.items())
        super().__init__(f"invalid processor event: {summary}")


def _plain_errors(errors) -> dict[str, list[str]]:
    if isinstance(errors, list):  # a body that is not an object
        return {"non_field_errors": [str(e) for e in errors]}
    return {str(field): [str(e) for e in messages] for field, messages in errors.items()}


def parse_processor_event(data) -> ProcessorEvent:
    """Validate a processor event body and return it typed; raise ``InvalidMessage`` naming
    every bad field. Unknown fields are ignored for validation and kept in ``raw``."""
    serializer = ProcessorEventSerializer(data=data)
    if not serializer.is_valid():
        raise InvalidMessage(_plain_errors(serializer.errors))
    return ProcessorEvent.of(**serializer.validated_data, raw=dict(data))


def processor_event_message(event: ProcessorEvent, *, received_at: datetime | None = None) -> dict:
    """The queue envelope for an accepted event: ``kind``, ``received_at``, and the event under
    ``event`` (its contract fields normalised, the fields beyond the contract kept beside them,
    inside the nested object only)."""
    when = received_at or datetime.now(UTC)
    return processor_event_body({**event.raw, **event.as_payload()}, received_at=when)


def processor_event_outgoing(
    event: ProcessorEvent, *, attributes: dict | None = None, received_at: datetime | None = None
) -> OutgoingMessage:
    """The queue message of an accepted processor event, whoever accepted it (the callback
    endpoint, the events pull, reconciliation): its envelope, ``MessageGroupId`` = its payment,
    ``MessageDeduplicationId`` = its id and fingerprint. One builder, so the same event reaching
    us by two paths is one message to SQS and to the dedup record."""
    return OutgoingMessage(
        body=processor_event_message(event, received_at=received_at),
        group_id=str(event.payment_id),
        deduplication_id=event_deduplication_id(event),
        attributes=attributes or {},
    )


def processor_event_from_message(body: dict) -> ProcessorEvent:
    """The event nested in a queue envelope, parsed by the endpoint's serializer. A flat body
    (the processor's fields at the top level) is refused: its top level cannot be trusted."""
    nested = nested_event(body)
    if nested is None:
        raise InvalidMessage(
            {EVENT_KEY: ["The envelope has no nested event object; it was not written by us."]}
        )
    return parse_processor_event(nested)


# SQS limits a deduplication id to 128 characters; a processor_event_id may use all of them.
_DEDUP_ID_MAX = 128
_FINGERPRINT_CHARS = 16


def event_deduplication_id(event: ProcessorEvent) -> str:
    """The SQS ``MessageDeduplicationId`` of a processor event: its ``processor_event_id``,
    qualified by a fingerprint of its payload (``<processor_event_id>.<16 hex>``).

    A plain ``processor_event_id`` would let SQS drop a *conflicting* resend (same id, another
    amount) inside its 5-minute window, after the endpoint had answered 202: the conflict would
    vanish before anyone saw it. With the fingerprint, a true repeat (same id, same payload) is
    still dropped by SQS, while a conflict reaches the worker, where the dedup record turns it
    into an ``EventConflict`` for a human. An id too long to qualify is hashed with its payload.
    """
    fingerprint = event.fingerprint
    qualified = f"{event.processor_event_id}.{fingerprint[:_FINGERPRINT_CHARS]}"
    if len(qualified) <= _DEDUP_ID_MAX:
        return qualified
    digest = hashlib.sha256(f"{event.processor_event_id}|{fingerprint}".encode()).hexdigest()
    return f"sha256.{digest}"
