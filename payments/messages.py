"""The queue message contract: the one module that builds and reads every body the module puts
on its queues.

Two kinds of message travel on the main queue, each in the FIFO group of its payment:

- ``submit_payment``: ``{"kind", "payment_id"}``, the command to submit the payment (the outbox
  relay sends it after the payment's transaction commits);
- ``processor_event``: ``{"kind", "event", "received_at"}``, the processor's event *nested*
  under ``event``, as validated (the contract's fields and the members beyond it), so nothing
  the processor sends lands beside the queue layer's own markers.

The queue layer marks a body it sends again: a dead letter's copy carries ``dead_letter`` (the
original message id, the attempts, the error), a redrive carries ``redrive`` (the id it
replaces). Both are taken off before a body is sent again (``republishable``). A parked message
is the body as it arrived, kept whole.

It lives in payments, the lowest app, so every sender uses it: the outbox relay and the
payment's creation, the callback endpoint, the events pull, reconciliation, the bank files'
import and delivery, the worker's dead-lettering and triage's redrive.
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any


class MessageKind(enum.StrEnum):
    SUBMIT_PAYMENT = "submit_payment"
    PROCESSOR_EVENT = "processor_event"


KIND_KEY = "kind"
EVENT_KEY = "event"  # a processor event's fields, nested
RECEIVED_AT_KEY = "received_at"
DEAD_LETTER_KEY = "dead_letter"  # a dead letter's copy: why it was dead-lettered
REDRIVE_KEY = "redrive"  # a redrive: the message id it replaces
RAW_BODY_KEY = "raw_body"  # a body that was not JSON, kept as text in its dead letter's copy
# The marks the queue layer adds to a body; taken off before the body is sent again.
MARK_KEYS = (DEAD_LETTER_KEY, REDRIVE_KEY)


# --- building ----------------------------------------------------------------------------------


def submit_payment_body(payment_id) -> dict:
    return {KIND_KEY: MessageKind.SUBMIT_PAYMENT.value, "payment_id": str(payment_id)}


def processor_event_body(fields: Any, *, received_at: datetime) -> dict:
    """A processor event's envelope: ``fields`` (as validated, or as stored by a producer of
    ours; as listed, for a malformed one on its way to the dead-letter queue) nested under
    ``event``."""
    return {
        KIND_KEY: MessageKind.PROCESSOR_EVENT.value,
        EVENT_KEY: dict(fields) if isinstance(fields, dict) else fields,
        RECEIVED_AT_KEY: received_at.isoformat(),
    }


def dead_letter_marked(
    body: dict | None,
    *,
    original_message_id: str,
    attempts: int,
    error_class: str,
    error: str,
    first_started_at: datetime,
    dead_lettered_at: datetime,
    raw_body: str | None = None,
) -> dict:
    """A copy of ``body`` for the dead-letter queue, marked with why it went there. A body that
    was not JSON (``body`` None) travels as its text under ``raw_body``."""
    marked = dict(body) if body is not None else {RAW_BODY_KEY: raw_body}
    marked[DEAD_LETTER_KEY] = {
        "original_message_id": original_message_id,
        "attempts": attempts,
        "error_class": error_class,
        "error": error,
        "first_started_at": first_started_at.isoformat(),
        "dead_lettered_at": dead_lettered_at.isoformat(),
    }
    return marked


def redrive_marked(body: dict, *, original_message_id: str, republished_at: datetime) -> dict:
    """``body`` sent again by an operator's redrive: its marks taken off, the redrive's put on
    (the start lets a redrive through its payment's hold)."""
    marked = republishable(body)
    if original_message_id:
        marked[REDRIVE_KEY] = {
            "original_message_id": original_message_id,
            "republished_at": republished_at.isoformat(),
        }
    return marked


def republishable(body: dict) -> dict:
    """``body`` without the queue layer's marks."""
    return {key: value for key, value in body.items() if key not in MARK_KEYS}


# --- reading -----------------------------------------------------------------------------------


def message_kind(body: Any) -> str:
    """The body's ``kind`` ("" for a body without one, or not an object)."""
    kind = body.get(KIND_KEY) if isinstance(body, dict) else None
    return kind if isinstance(kind, str) else ""


def event_fields(body: Any) -> dict:
    """A processor event message's event fields; a body parked or dead-lettered before the
    envelope nested the event has them at its top level. Any other message: its own fields."""
    if not isinstance(body, dict):
        return {}
    if message_kind(body) == MessageKind.PROCESSOR_EVENT:
        nested = body.get(EVENT_KEY)
        if isinstance(nested, dict):
            return nested
    return body


def nested_event(body: Any) -> dict | None:
    """The event nested in a processor event's envelope, or None when there is none (a body
    not written by us: its top level cannot be trusted)."""
    nested = body.get(EVENT_KEY) if isinstance(body, dict) else None
    return nested if isinstance(nested, dict) else None


def dead_letter_mark(body: Any) -> dict | None:
    """The mark a dead letter's copy carries, when it carries one with an original id."""
    mark = body.get(DEAD_LETTER_KEY) if isinstance(body, dict) else None
    if isinstance(mark, dict) and mark.get("original_message_id"):
        return mark
    return None


def redrive_original(body: Any) -> str:
    """The message id a redrive replaces ("" when ``body`` is no redrive)."""
    redrive = body.get(REDRIVE_KEY) if isinstance(body, dict) else None
    if isinstance(redrive, dict) and isinstance(redrive.get("original_message_id"), str):
        return redrive["original_message_id"]
    return ""
