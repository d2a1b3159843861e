"""The values the SQS gateway (``callbacks.sqs``) takes and returns, and the errors it raises.

Apart from the gateway so that what builds on them without calling SQS (the coalescing
sender, ``callbacks.sqs_coalescing``) needs no import of the gateway; ``callbacks.sqs``
names every one of them too, and callers import them from there.
"""

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property
from typing import Generic, Protocol, TypeVar

from callbacks.models import sequence_key
from payments.messages import message_kind

BATCH_LIMIT = 10  # entries per SQS batch call


class QueueUnavailable(Exception):
    """SQS (or the local server) could not be reached or refused the call."""


class QueueRefused(QueueUnavailable):
    """SQS answered, with an error: ``code`` is SQS's error code."""

    def __init__(self, message: str, *, code: str, detail: str) -> None:
        super().__init__(message)
        self.code = code
        self.detail = detail


class SqsCallInTransaction(RuntimeError):
    """SQS was called inside a database transaction that can still roll back."""


# Error classes are recorded by name (ProcessingError.error_class, QueueMessage.last_error_class)
# and shown to operators: they keep the module they were recorded under, the gateway's.
for _error in (QueueUnavailable, QueueRefused, SqsCallInTransaction):
    _error.__module__ = "callbacks.sqs"


@dataclass(frozen=True)
class OutgoingMessage:
    body: dict
    group_id: str
    deduplication_id: str
    # SQS MessageAttributes (the request id and trace it was sent in: callbacks.tracing).
    attributes: dict = field(default_factory=dict, compare=False)

    @cached_property
    def text(self) -> str:
        """The body as sent: compact JSON, encoded once however often it is measured or sent."""
        return json.dumps(self.body, separators=(",", ":"))

    @cached_property
    def size(self) -> int:
        """The bytes SQS counts against a message's and a batch's limit: the body, and each
        attribute's name, type and value."""
        return len(self.text.encode()) + sum(
            len(f"{name}{a['DataType']}{a.get('StringValue', '')}".encode())
            for name, a in self.attributes.items()
        )


@dataclass(frozen=True)
class ReceivedMessage:
    """One message as SQS delivered it, with the attributes the product relies on."""

    message_id: str
    receipt_handle: str
    raw_body: str
    body: dict | None  # None when the body is not a JSON object
    group_id: str
    deduplication_id: str
    sequence_number: str  # zero-padded (see models.sequence_key)
    enqueued_at: datetime | None
    receive_count: int
    # Every attribute as SQS gave it (kept with a dead letter for the person who reads it).
    attributes: dict = field(default_factory=dict, compare=False)
    # Its MessageAttributes: the request id and trace it was sent in (callbacks.tracing).
    message_attributes: dict = field(default_factory=dict, compare=False)

    @classmethod
    def from_sqs(cls, message: dict) -> "ReceivedMessage":
        """The one parser of a raw ``ReceiveMessage`` entry."""
        attributes = message.get("Attributes") or {}
        raw_body = message.get("Body") or ""
        try:
            body = json.loads(raw_body)
        except ValueError:
            body = None
        if not isinstance(body, dict):
            body = None
        sent = attributes.get("SentTimestamp")
        return cls(
            message_id=message["MessageId"],
            receipt_handle=message["ReceiptHandle"],
            raw_body=raw_body,
            body=body,
            group_id=attributes.get("MessageGroupId", ""),
            deduplication_id=attributes.get("MessageDeduplicationId", ""),
            sequence_number=sequence_key(attributes.get("SequenceNumber")),
            enqueued_at=datetime.fromtimestamp(int(sent) / 1000, tz=UTC) if sent else None,
            receive_count=int(attributes.get("ApproximateReceiveCount") or 1),
            attributes=attributes,
            message_attributes=message.get("MessageAttributes") or {},
        )

    @property
    def kind(self) -> str:
        return message_kind(self.body)

    @property
    def payment_id(self) -> str:
        # The group id is the payment id by contract; the body is checked against it later.
        return self.group_id


class HasReceiptHandle(Protocol):
    @property
    def receipt_handle(self) -> str: ...


T = TypeVar("T")
R = TypeVar("R", bound=HasReceiptHandle)


@dataclass
class BatchOutcome(Generic[T]):
    """What became of each entry of a batch call, in the order given."""

    done: list[T] = field(default_factory=list)
    refused: list[tuple[T, str]] = field(default_factory=list)  # SQS's ``Failed``, with why
    # Of ``refused``, those SQS marks ``SenderFault``: the message itself is at fault (too long,
    # characters SQS refuses), so sending it again as it is is refused again.
    sender_fault: list[T] = field(default_factory=list)
    unreachable: list[tuple[T, str]] = field(default_factory=list)  # its chunk's call failed
    results: list[dict] = field(default_factory=list)  # SQS's ``Successful`` entry per done one
