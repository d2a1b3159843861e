"""The processor event body contract (DESIGN.md, "Callback endpoint"), in one place.

The callback endpoint validates what the processor posted with ``parse_processor_event``; the
queue message it publishes is built by ``processor_event_message``; the worker parses that
message back with ``parse_processor_event``. One parser on both sides of the queue means a
message that passed the endpoint can never fail validation in the worker.
"""

import hashlib
import re
import uuid
from datetime import UTC, datetime
from decimal import Decimal

from payments.events import EVENT_TYPES, ProcessorEvent

PROCESSOR_EVENT = "processor_event"

PROCESSOR_EVENT_ID_RE = re.compile(r"[A-Za-z0-9._:-]{1,128}")
# Two decimal places exactly, no sign, no exponent, no leading zeros; at most 12 integer digits
# (the payment amount column is NUMERIC(14, 2)).
AMOUNT_RE = re.compile(r"(0|[1-9][0-9]{0,11})\.[0-9]{2}")
# ISO 8601 date, "T" or space, time; fromisoformat alone also accepts forms like "20261102".
TIMESTAMP_RE = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}(:[0-9]{2}(\.[0-9]{1,6})?)?"
    r"(Z|[+-][0-9]{2}:?[0-9]{2})"
)
REASON_CODE_MAX = 64
MESSAGE_MAX = 1000

KNOWN_FIELDS = frozenset(
    {"payment_id", "event_type", "processor_event_id", "amount", "timestamp", "reason_code",
     "message"}
)  # fmt: skip


class InvalidMessage(Exception):
    """The body breaks the contract; ``errors`` maps each bad field to what is wrong with it."""

    def __init__(self, errors: dict[str, list[str]]) -> None:
        self.errors = errors
        summary = "; ".join(f"{k}: {' '.join(v)}" for k, v in errors.items())
        super().__init__(f"invalid processor event: {summary}")


def _required_string(data: dict, name: str, errors: dict[str, list[str]]) -> str | None:
    value = data.get(name)
    if value is None:
        errors[name] = ["This field is required."]
        return None
    if not isinstance(value, str):
        errors[name] = [f"Must be a string, got {type(value).__name__}."]
        return None
    return value


def _optional_string(data: dict, name: str, max_length: int, errors: dict[str, list[str]]) -> str:
    value = data.get(name)
    if value is None:
        return ""
    if not isinstance(value, str):
        errors[name] = [f"Must be a string, got {type(value).__name__}."]
        return ""
    if len(value) > max_length:
        errors[name] = [f"At most {max_length} characters, got {len(value)}."]
        return ""
    return value


def parse_processor_event(data: dict) -> ProcessorEvent:
    """Validate a processor event body and return it typed; raise ``InvalidMessage`` naming
    every bad field. Unknown fields are ignored for validation and kept in ``raw``."""
    if not isinstance(data, dict):
        raise InvalidMessage(
            {"non_field_errors": [f"Expected a JSON object, got {type(data).__name__}."]}
        )
    errors: dict[str, list[str]] = {}

    payment_id = None
    raw_payment_id = _required_string(data, "payment_id", errors)
    if raw_payment_id is not None:
        try:
            payment_id = uuid.UUID(raw_payment_id)
        except ValueError:
            errors["payment_id"] = [f"Must be a UUID, got {raw_payment_id[:64]!r}."]

    event_type = _required_string(data, "event_type", errors)
    if event_type is not None and event_type not in EVENT_TYPES:
        errors["event_type"] = [
            f"Must be one of {', '.join(EVENT_TYPES)}; got {event_type[:64]!r}."
        ]

    processor_event_id = _required_string(data, "processor_event_id", errors)
    if processor_event_id is not None and not PROCESSOR_EVENT_ID_RE.fullmatch(processor_event_id):
        errors["processor_event_id"] = [
            "Must be 1 to 128 characters of A-Z, a-z, 0-9 and . _ : - "
            f"(got {len(processor_event_id)} characters)."
        ]

    amount = None
    raw_amount = _required_string(data, "amount", errors)
    if raw_amount is not None:
        if not AMOUNT_RE.fullmatch(raw_amount):
            errors["amount"] = [
                'Must be a decimal string with exactly 2 decimal places, such as "125.00"; '
                f"got {raw_amount[:64]!r}."
            ]
        elif Decimal(raw_amount) <= 0:
            errors["amount"] = [f"Must be greater than zero; got {raw_amount!r}."]
        else:
            amount = Decimal(raw_amount)

    timestamp = None
    raw_timestamp = _required_string(data, "timestamp", errors)
    if raw_timestamp is not None:
        try:
            if not TIMESTAMP_RE.fullmatch(raw_timestamp):
                raise ValueError
            timestamp = datetime.fromisoformat(raw_timestamp)
        except ValueError:
            errors["timestamp"] = [
                "Must be an ISO 8601 date-time with a UTC offset, such as "
                f'"2026-11-02T12:00:00+00:00"; got {raw_timestamp[:64]!r}.'
            ]

    reason_code = _optional_string(data, "reason_code", REASON_CODE_MAX, errors)
    message = _optional_string(data, "message", MESSAGE_MAX, errors)

    if errors:
        raise InvalidMessage(errors)
    return ProcessorEvent(
        payment_id=payment_id,
        event_type=event_type,
        processor_event_id=processor_event_id,
        amount=amount,
        timestamp=timestamp,
        reason_code=reason_code,
        message=message,
        raw=dict(data),
    )


def processor_event_message(event: ProcessorEvent, *, received_at: datetime | None = None) -> dict:
    """The queue message body for an accepted event: ``kind``, the event fields as strings, and
    ``received_at``. Fields the processor sent beyond the contract travel along untouched, so
    the worker's ``parse_processor_event(body).raw`` still holds them."""
    extra = {k: v for k, v in event.raw.items() if k not in KNOWN_FIELDS}
    when = received_at or datetime.now(UTC)
    return {
        **extra,
        "kind": PROCESSOR_EVENT,
        **event.as_payload(),
        "received_at": when.isoformat(),
    }


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
