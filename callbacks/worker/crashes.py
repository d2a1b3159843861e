"""Messages that come back unfinished: started, and the worker died while they ran.

A message that kills the worker mid-apply (SIGKILL, out of memory, a segfault) comes back when
its visibility timeout runs out, and so does every message received with it: SQS counts a
receive for each of them at every crash. A server that returns several messages of one group
per receive (AWS at times, LocalStack) hands the group's later messages out with it each time,
and a batch's group heads are started and applied together; left alone, a message that kills
every worker that takes it would take its batch-mates past the RedrivePolicy's
``maxReceiveCount`` with it.

Before a batch starts, ``suspects_find`` reads the records of its messages that were received
before (one query, and none for a batch of first receives): a record still in progress is a
start that never finished, written down as an error row of its own (``AttemptNeverFinished``).
A message with such rows is a suspect. Its group waits until the rest of the batch is applied
and deleted, then runs on its own, the suspect with the fewest unfinished starts first
(``suspect_groups``): a crash then takes down only what is still in hand, and leaves its row on
the message that caused it, not on the innocent ones started with it. A suspect started
``WORKER_MAX_FAILED_STARTS`` times without finishing (the limit of starts that did no work,
which a body the database refuses counts against too) is not started again: it is dead-lettered
(``dead_letter``: a DLQ copy, its payment on hold for a person, as any dead letter), and its
group's later messages in hand are parked behind that hold in the same batch, off the queue
before SQS counts them out; the hold's release (after the dead letter is redriven, resolved or
discarded) sends them back in their order.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from django.db import DatabaseError

import callbacks.worker.outcomes as outcomes
from callbacks import tracing
from callbacks.handlers import AttemptNeverFinished
from callbacks.models import QueueMessage, QueueMessageStatus
from callbacks.selectors import queue_messages_unfinished
from callbacks.services import ReceivedMessage, queue_message_never_finished
from callbacks.worker.hand import Hand
from callbacks.worker.outage import DatabaseDown, is_outage
from callbacks.worker.outcomes import Failure, Result
from callbacks.worker.rules import Rules

# The worker's one logger name (see callbacks.worker.loop).
logger = logging.getLogger("callbacks.worker")

NEVER_FINISHED = Failure.of(AttemptNeverFinished()).error_class


@dataclass(frozen=True)
class Suspect:
    """A received message some of whose starts never finished, and how many."""

    queue_message: QueueMessage
    unfinished: int
    given_up: bool  # started its limit of times without finishing: not started again


def suspects_find(messages: list[ReceivedMessage], *, limit: int) -> dict[str, Suspect]:
    """The batch's suspects by message id; each start found never finished is recorded first.
    One started ``limit`` times without finishing is given up (the worker's
    ``WORKER_MAX_FAILED_STARTS``: well below the RedrivePolicy's ``maxReceiveCount``, since a
    batch-mate received with it at each of those starts is received once more, and parked then).

    Only a message received before can have been started; a batch of first receives costs no
    query. A database that cannot answer is an outage (``DatabaseDown``); any other error
    leaves the batch to run as it would have without this look."""
    again = {m.message_id: m for m in messages if m.receive_count > 1}
    if not again:
        return {}
    try:
        return _suspects(again, limit)
    except DatabaseError as exc:
        if is_outage(exc):
            raise DatabaseDown(exc) from exc
        logger.warning("could not read the batch's unfinished starts: %s", exc)
        return {}


def _suspects(again: dict[str, ReceivedMessage], limit: int) -> dict[str, Suspect]:
    suspects = {}
    records = queue_messages_unfinished(
        message_ids=list(again), never_finished_class=NEVER_FINISHED
    )
    for record in records:
        message = again[record.message_id]
        # The body as received: a record started in bulk stores none until a failure writes
        # it, and its error row or dead letter needs it.
        record.body = message.body
        record.raw_body = "" if message.body is not None else message.raw_body
        unfinished = record.never_finished
        if record.status == QueueMessageStatus.IN_PROGRESS and _record_never_finished(
            message, record, unfinished + 1, given_up=unfinished + 1 >= limit
        ):
            unfinished += 1
        if unfinished:
            suspects[record.message_id] = Suspect(record, unfinished, unfinished >= limit)
    return suspects


def _record_never_finished(
    message: ReceivedMessage, record: QueueMessage, count: int, *, given_up: bool
) -> bool:
    """Write the row of a start that never finished, the ``count``-th (``given_up``: the last
    one allowed); False when another worker wrote it first."""
    text = (
        f"attempt {record.attempts}, started {record.last_started_at:%Y-%m-%d %H:%M:%S} UTC, "
        "never finished: the worker died while it ran (killed, out of memory, a crash) or "
        f"held it past its visibility timeout; {count} start(s) of it never finished"
        + ("; it is not started again" if given_up else "; it runs again on its own")
    )
    with tracing.message_in_hand(message, span=False):
        recorded = queue_message_never_finished(
            queue_message=record,
            error_class=NEVER_FINISHED,
            message=text,
            delay_seconds=None if given_up else 0.0,
        )
        if recorded is not None:
            logger.error(
                "message %s came back unfinished: %s",
                message.message_id,
                text,
                extra={"payment_id": message.payment_id, "message_id": message.message_id},
            )
    return recorded is not None


def suspect_groups(
    groups: list[list[ReceivedMessage]], suspects: dict[str, Suspect]
) -> tuple[list[list[ReceivedMessage]], list[list[ReceivedMessage]]]:
    """The batch's groups split in two: those with no suspect, and those with one, in the
    order they run on their own (fewest unfinished starts first, so the message that keeps
    killing the worker runs after the innocent ones started with it)."""
    clear, suspected = [], []
    for group in groups:
        (suspected if any(m.message_id in suspects for m in group) else clear).append(group)

    def most_unfinished(group: list[ReceivedMessage]) -> int:
        return max(s.unfinished for m in group if (s := suspects.get(m.message_id)))

    return clear, sorted(suspected, key=most_unfinished)


def dead_letter(hand: Hand, rules: Rules, message: ReceivedMessage, suspect: Suspect) -> Result:
    """Dead-letter a suspect without starting it again (``outcomes.give_up``)."""
    with tracing.message_in_hand(message):
        began = time.monotonic()
        hand.started()
        problem = AttemptNeverFinished(
            f"started {suspect.unfinished} time(s) and never finished: the worker died each "
            "time it ran (killed, out of memory, a crash); not started again"
        )
        return outcomes.give_up(hand, rules, message, suspect.queue_message, problem, began)
