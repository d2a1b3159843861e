"""The work behind each kind of queue message, and the errors a message's content can cause.

A handler takes a received message and returns its outcome (a string recorded on the message's
``QueueMessage`` row and used as a metric label). ``DEFAULT_HANDLERS`` maps the body's ``kind``
to its handler; the worker (``callbacks.worker``) decides when and in which transaction to run it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass

from callbacks.metrics import DEDUP_HITS
from callbacks.schema import PROCESSOR_EVENT, processor_event_from_message
from callbacks.sqs import ReceivedMessage
from payments.services import SUBMIT_PAYMENT, ApplyOutcome

# The error classes below are recorded by their dotted name (ProcessingError.error_class,
# QueueMessage.last_error_class) and shown to operators: they keep the module they were
# recorded under when they lived in callbacks.worker, which still re-exports them.
_RECORDED_MODULE = "callbacks.worker"


class UnknownMessageKind(Exception):
    """The body's ``kind`` has no handler: no retry can fix that."""


class InvalidBody(Exception):
    """The body is not a JSON object or contradicts its message attributes."""


class UnstorableBody(InvalidBody):
    """The database refuses the body itself (a NUL, an unpaired surrogate, a NaN in JSON): the
    message was recorded with its body as escaped text and goes to a person."""


for _error in (UnknownMessageKind, InvalidBody, UnstorableBody):
    _error.__module__ = _RECORDED_MODULE


@dataclass(frozen=True)
class Handler:
    """How to do one kind of message's work.

    ``atomic``: run the work and the done mark in one transaction. Work that calls the network
    (a processor submission) must not hold a transaction open across the call; it owns its
    short transactions and is idempotent, so the done mark follows in its own transaction.

    ``own_savepoint``: every write the work makes happens inside one ``transaction.atomic()``
    block of its own, so a failure rolls back everything it wrote. The batch transaction then
    needs no savepoint of its own around it (two statements fewer per message); any other
    handler gets one.
    """

    func: Callable[[ReceivedMessage], str]
    atomic: bool = True
    own_savepoint: bool = False


def _payment_id_from_body(message: ReceivedMessage) -> str:
    body = message.body or {}
    raw = body.get("payment_id")
    if not isinstance(raw, str):
        raise InvalidBody("payment_id is missing or not a string")
    try:
        payment_id = str(uuid.UUID(raw))
    except ValueError:
        raise InvalidBody(f"payment_id {raw[:64]!r} is not a UUID") from None
    if payment_id != message.group_id:
        raise InvalidBody(
            f"payment_id {payment_id} does not match the message group {message.group_id!r}"
        )
    return payment_id


def handle_processor_event(message: ReceivedMessage) -> str:
    from payments.services import payment_apply_event

    event = processor_event_from_message(message.body)
    if str(event.payment_id) != message.group_id:
        raise InvalidBody(
            f"payment_id {event.payment_id} does not match the message group {message.group_id!r}"
        )
    result = payment_apply_event(event=event, caused_by=f"sqs:{message.message_id}")
    if result.outcome == ApplyOutcome.DUPLICATE:
        DEDUP_HITS.labels(layer="app").inc()
    return str(result.outcome)


def handle_submit_payment(message: ReceivedMessage) -> str:
    from payments.services import payment_submit

    result = payment_submit(
        payment_id=_payment_id_from_body(message), caused_by=f"sqs:{message.message_id}"
    )
    return str(result.outcome)


DEFAULT_HANDLERS: dict[str, Handler] = {
    # payment_apply_event writes only inside its own atomic block.
    PROCESSOR_EVENT: Handler(handle_processor_event, own_savepoint=True),
    SUBMIT_PAYMENT: Handler(handle_submit_payment, atomic=False),
}
