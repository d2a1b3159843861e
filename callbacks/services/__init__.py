"""Writes of the queue layer, one module per concern; every name is importable from here.

- ``starts``: the start of an attempt, one statement for one message or a batch, the ORM's
  locking path for holds, redrives and gaps.
- ``outcomes``: what becomes of a started attempt: done, an error row and a retry, a deferral
  for an outage, a dead letter, or a start that never finished (the worker died).
- ``holds``: payment holds, and their release in the messages' order.
- ``republish``: sends back to the main queue, and the marks the queue layer adds to a body.

Each service owns its transaction, except ``queue_message_complete`` and
``queue_messages_complete``, which must commit in the caller's transaction together with the
messages' work. Services whose names end in ``_now`` or that document a send act on SQS
immediately and are never called inside a transaction. The purges are in
``callbacks.retention`` (``queue_messages_purge`` is named here too, for its callers).
"""

from callbacks.retention import queue_messages_purge
from callbacks.services.holds import (
    hold_release,
    outage_holds_release,
    outage_holds_waiting,
    payment_hold,
)
from callbacks.services.outcomes import (
    dead_letter_body,
    message_dead_letter,
    message_defer,
    processing_error_record,
    queue_message_complete,
    queue_message_defer,
    queue_message_never_finished,
    queue_messages_complete,
    queue_messages_interrupted,
)
from callbacks.services.republish import (
    BEHIND_MARK,
    DEAD_LETTER_KEY,
    REDRIVE_KEY,
    RELEASE_MARK,
    message_republish,
    message_send_behind,
    moves_behind,
    parked_message_republish,
    released_original_id,
)
from callbacks.services.starts import (
    StartAction,
    StartDecision,
    queue_message_mark_redrive_policy_dead_letter,
    queue_message_start,
    queue_messages_start_batch,
    storable_text,
)
from callbacks.sqs import ReceivedMessage

__all__ = [
    "BEHIND_MARK",
    "DEAD_LETTER_KEY",
    "REDRIVE_KEY",
    "RELEASE_MARK",
    "ReceivedMessage",
    "StartAction",
    "StartDecision",
    "dead_letter_body",
    "hold_release",
    "message_dead_letter",
    "message_defer",
    "message_republish",
    "message_send_behind",
    "moves_behind",
    "outage_holds_release",
    "outage_holds_waiting",
    "parked_message_republish",
    "payment_hold",
    "processing_error_record",
    "queue_message_complete",
    "queue_message_defer",
    "queue_message_mark_redrive_policy_dead_letter",
    "queue_message_never_finished",
    "queue_message_start",
    "queue_messages_complete",
    "queue_messages_interrupted",
    "queue_messages_purge",
    "queue_messages_start_batch",
    "released_original_id",
    "storable_text",
]
