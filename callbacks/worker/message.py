"""One message on its own: its handler's gates, its start, its work in its own transaction.

The path of every message the batch transaction does not take: submissions (whose work calls
the processor, so no transaction may stay open across it), a group's later messages, and any
message whose bulk start failed. A start that cannot be recorded runs no work.
"""

from __future__ import annotations

import logging
import time

from django.db import DatabaseError, transaction

import callbacks.worker.outcomes as outcomes
from callbacks import tracing
from callbacks.handlers import InvalidBody, UnknownMessageKind
from callbacks.models import QueueMessage
from callbacks.services import (
    ReceivedMessage,
    StartAction,
    queue_message_complete,
    queue_message_start,
)
from callbacks.worker.hand import Hand
from callbacks.worker.outage import DatabaseDown, is_outage, refused_content
from callbacks.worker.outcomes import Outcome, Result
from callbacks.worker.rules import Rules

# The worker's one logger name (see callbacks.worker.loop).
logger = logging.getLogger("callbacks.worker")


def process_message(hand: Hand, rules: Rules, message: ReceivedMessage) -> Result:
    """Handle one message on its own; the caller lets it go as the result says (deleted once
    finished: the result's ``delete``)."""
    # Every record written for the message carries its request id and trace, in its span.
    with tracing.message_in_hand(message):
        return _process(hand, rules, message)


def _process(hand: Hand, rules: Rules, message: ReceivedMessage) -> Result:
    started = time.monotonic()
    deferred = _gated(hand, rules, message, started)
    if deferred is not None:
        return deferred
    hand.started()
    try:
        decision = queue_message_start(message=message)
    except (DatabaseError, UnicodeError) as exc:
        # The start could not be recorded, so no work ran. A database that answered with a
        # data error refused this body, not an outage: no retry will change that, so after
        # a few receives (SQS counts them; we could not) it goes to a person with its body
        # kept as text. Otherwise let it come back after a short pause, and keep the
        # group's later messages behind it.
        if is_outage(exc):
            raise DatabaseDown(exc) from exc
        logger.error("could not record the start of message %s: %s", message.message_id, exc)
        if refused_content(exc) and message.receive_count >= rules.max_failed_starts:
            return outcomes.quarantine(hand, rules, message, exc, started)
        return outcomes.retry_unstarted(hand, rules, message, started)

    queue_message = decision.queue_message
    if decision.action == StartAction.FINISHED:
        return outcomes.finish(
            hand, rules, message, queue_message, Result.of(Outcome.DUPLICATE), started
        )
    if decision.action == StartAction.PARKED:
        return outcomes.finish(
            hand, rules, message, queue_message, Result.of(Outcome.PARKED), started
        )
    return _run_handler(hand, rules, message, queue_message, started)


def _gated(hand: Hand, rules: Rules, message: ReceivedMessage, started: float) -> Result | None:
    """Ask the handler's gates before the message starts; the first that says its dependency
    cannot take it now defers it, unstarted: no attempt counted, no error row."""
    handler = rules.handlers.get(message.kind)
    for gate in handler.gates if handler is not None else ():
        deferral = gate(message)
        if deferral is not None:
            return outcomes.defer(hand, rules, message, None, started, deferral)
    return None


def _run_handler(
    hand: Hand,
    rules: Rules,
    message: ReceivedMessage,
    queue_message: QueueMessage,
    started: float,
) -> Result:
    """Do a started message's work and mark it done (in one transaction when the handler is
    atomic); a failure becomes a retry, a dead letter or a deferral."""
    handler = rules.handlers.get(message.kind)
    try:
        if message.body is None:
            raise InvalidBody("the message body is not a JSON object")
        if handler is None:
            raise UnknownMessageKind(
                f"no handler for message kind {message.kind!r}; known kinds: "
                f"{', '.join(sorted(rules.handlers))}"
            )
        if handler.atomic:
            with transaction.atomic():
                outcome = handler.func(message)
                queue_message_complete(queue_message=queue_message, outcome=outcome)
        else:
            outcome = handler.func(message)
            queue_message_complete(queue_message=queue_message, outcome=outcome)
    except Exception as exc:  # noqa: BLE001 - the one place failures become retry/dead letter
        if is_outage(exc):
            # Whatever the work did rolled back (or, for a submission, the processor keeps
            # the idempotency key): it is done again once the database answers.
            raise DatabaseDown(exc) from exc
        return outcomes.fail(hand, rules, message, queue_message, exc, started)
    outcomes.observe_applied(message)
    return outcomes.finish(hand, rules, message, queue_message, Result.handled(outcome), started)
