"""One received batch: groups in order, the group heads in one transaction, the rest one by one.

First the batch's group heads whose work is atomic (processor events) are started in one
statement (``start_heads``) and applied in one transaction (``apply_started``): together, with
no savepoint each, where their handlers allow it; a batch where anything failed is rolled back
whole, the message that failed fails with its error and the others are applied again, a
savepoint each: a failure still fails only its own message. Then every other message, in group
order, takes the per-message path (``callbacks.worker.message``): started alone, its work in its
own transaction, or none for work that calls the network (a submission), so no network call
ever runs inside the batch's transaction. A group whose head
failed goes no further. Messages not started (a group stopped at a failure, a stop request, the
message limit) are made visible again at once; they were never started, so no attempt is
counted: the bulk start counts only group heads, which always run.

A group holding a message whose start never finished before (the worker died while it ran)
runs after the rest of the batch is applied and deleted, on its own; one that never finished
too often is dead-lettered, not started again (``callbacks.worker.crashes``).

The partial-batch path: a server that returns several messages of one group per receive (AWS,
LocalStack; fauxqs returns at most one) gives the head to the batch transaction and the later
ones to the per-message path, behind it, unless the head failed.

Every receive writes its start before the work, the first one too. Written only from a second
receive, a start the worker died in would leave no trace: a message that kills every worker
would kill one more of them, be received once more, and with the RedrivePolicy set to the
receives the worker needs, reach the DLQ through SQS instead of the worker's own dead letter
and error rows (tests/callbacks/test_worker_crash_loop.py); and that first death cannot be told
from a message released untouched without writing down every release. Measured on a drain of
settlements (scripts/worker_batch_cost.py), the start costs 0.26 ms of CPU per message, of about
3: 0.12 for its one statement per batch, 0.14 for its rows' values, which a done mark written
without a start would have to build too; leaving it out saved one statement of 24 per batch and
no CPU the runs' noise could show. The done marks are one statement in the batch's transaction.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass

from django.db import DatabaseError, connection, transaction

import callbacks.worker.crashes as crashes
import callbacks.worker.outcomes as outcomes
from callbacks import conf as callbacks_conf
from callbacks import tracing
from callbacks.handlers import Handler
from callbacks.metrics import WORKER_BATCH_MESSAGES
from callbacks.models import QueueMessage
from callbacks.services import ReceivedMessage, queue_messages_complete, queue_messages_start_batch
from callbacks.worker.hand import Hand
from callbacks.worker.message import process_message
from callbacks.worker.outage import DatabaseDown, is_outage
from callbacks.worker.outcomes import Result
from callbacks.worker.rules import Rules

# The worker's one logger name (see callbacks.worker.loop).
logger = logging.getLogger("callbacks.worker")


class BatchRolledBack(Exception):
    """The batch's transaction was left unusable (a savepoint could not be rolled back)."""


def group_in_order(messages: Iterable[ReceivedMessage]) -> list[list[ReceivedMessage]]:
    """The batch split by message group, each group in sequence-number order."""
    groups: dict[str, list[ReceivedMessage]] = {}
    for m in messages:
        groups.setdefault(m.group_id, []).append(m)
    return [sorted(g, key=lambda m: m.sequence_number) for g in groups.values()]


def process_batch(hand: Hand, rules: Rules, messages: list[ReceivedMessage]) -> None:
    """Handle one received batch (see the module docstring); finished messages are deleted in
    batches after their commits, the ones not started released at once. A database outage
    holds back whatever of the batch is left, then goes on up (``DatabaseDown``) for the loop
    to wait it out. A group with a message whose start never finished before runs last, on
    its own (``callbacks.worker.crashes``), after what finished before it is deleted."""
    pending = {m.message_id: m for m in messages}
    finished: list[ReceivedMessage] = []
    with hand.holding(messages):
        WORKER_BATCH_MESSAGES.observe(len(messages))
        try:
            suspects = crashes.suspects_find(messages, limit=rules.max_failed_starts)
            clear, suspected = crashes.suspect_groups(group_in_order(messages), suspects)
            results = apply_started(hand, rules, start_heads(hand, rules, clear))
            for group in clear:
                _process_group(hand, rules, group, results, {}, pending, finished)
            for group in suspected:
                # A crash from here on must not bring back what is done already.
                if finished:
                    hand.delete(finished)
                    finished.clear()
                _process_group(hand, rules, group, {}, suspects, pending, finished)
        except DatabaseDown:
            # Nothing more of this batch can be started or recorded: hold back what is left.
            hand.hold_back(list(pending.values()))
            pending.clear()
            raise
        finally:
            hand.release(pending.values())
            hand.delete(finished)


def _process_group(
    hand: Hand,
    rules: Rules,
    group: list[ReceivedMessage],
    results: dict[str, Result],
    suspects: dict[str, crashes.Suspect],
    pending: dict[str, ReceivedMessage],
    finished: list[ReceivedMessage],
) -> None:
    """One group's messages in order, each applied already (``results``) or handled now, until
    one stops the group, a stop is requested or the message limit is reached."""
    for message in group:
        result = results.get(message.message_id)
        if result is None:
            if not hand.may_start():
                return
            suspect = suspects.get(message.message_id)
            if suspect is not None and suspect.given_up:
                result = crashes.dead_letter(hand, rules, message, suspect)
            else:
                result = process_message(hand, rules, message)
        del pending[message.message_id]
        hand.let_go([message])
        if result.delete:
            finished.append(message)
        if result.stop_group:
            return


def start_heads(
    hand: Hand, rules: Rules, groups: list[list[ReceivedMessage]]
) -> list[tuple[ReceivedMessage, QueueMessage]]:
    """Start the group heads the batch path can take, in one statement (see
    ``queue_messages_start_batch``); the rest keep the per-message path. A database that cannot
    take the start leaves them all to the per-message path, which records why. The bulk
    statement is PostgreSQL's; on another database (SQLite, the quick start) every message
    takes the per-message path."""
    if not hand.may_start() or connection.vendor != "postgresql":
        return []
    heads = [
        group[0]
        for group in groups
        if group[0].body is not None
        and (handler := rules.handlers.get(group[0].kind)) is not None
        and handler.atomic
    ]
    left = hand.starts_left()
    if left is not None:
        heads = heads[:left]
    if not heads:
        return []
    try:
        started = queue_messages_start_batch(messages=heads)
    except (DatabaseError, UnicodeError) as exc:
        logger.warning("could not start the batch in bulk (%s); one at a time instead", exc)
        return []
    hand.started(len(started))
    return [(m, started[m.message_id]) for m in heads if m.message_id in started]


def apply_started(
    hand: Hand, rules: Rules, started: list[tuple[ReceivedMessage, QueueMessage]]
) -> dict[str, Result]:
    """Apply started atomic messages in ONE transaction (``_apply_in_one_transaction``); then,
    after the commit, record each failure (error row, retry or dead letter: SQS is never called
    inside the transaction)."""
    if not started:
        return {}
    began = time.monotonic()
    outcomes_by_id, failures = _apply_in_one_transaction(rules, started)
    results = {}
    for message, queue_message in started:
        with tracing.message_in_hand(message, span=False):
            if message.message_id in failures:
                results[message.message_id] = outcomes.fail(
                    hand, rules, message, queue_message, failures[message.message_id], began
                )
            else:
                outcomes.observe_applied(message)
                results[message.message_id] = outcomes.finish(
                    hand,
                    rules,
                    message,
                    queue_message,
                    Result.handled(outcomes_by_id[message.message_id]),
                    began,
                )
    return results


def _apply_in_one_transaction(
    rules: Rules, started: list[tuple[ReceivedMessage, QueueMessage]]
) -> tuple[dict[str, str], dict[str, Exception]]:
    """Apply the started messages in one transaction: together, with no savepoint each, when
    their handlers allow it (``Handler.together``). When that fails, the whole of it is rolled
    back; the message whose work raised fails with its error, as it would in its own savepoint
    (recorded, retried or dead-lettered: it is not run again now), and the others are applied
    again one savepoint each. Returns (outcomes, failures) by id."""
    contexts = {rules.handlers[message.kind].together for message, _ in started}
    if None not in contexts:
        together = _apply_together(rules, started, contexts)
        if together.done is not None:
            return together.done, {}
        if together.failed is not None:
            failed_id, error = together.failed
            rest = [(m, qm) for m, qm in started if m.message_id != failed_id]
            done, failures = _apply_each_in_savepoint(rules, rest) if rest else ({}, {})
            return done, {**failures, failed_id: error}
    return _apply_each_in_savepoint(rules, started)


@dataclass
class _Together:
    """What a batch applied together came to: the outcomes by id once committed, or (when it
    rolled back) the message whose work raised and its error, if one message was to blame."""

    done: dict[str, str] | None = None
    failed: tuple[str, Exception] | None = None


def _apply_together(
    rules: Rules, started: list[tuple[ReceivedMessage, QueueMessage]], contexts: set
) -> _Together:
    """Every message's work and their done marks in one transaction, inside the handlers'
    ``together`` contexts, with no savepoint of their own: two statements fewer per message.
    Anything that fails rolls the whole transaction back (nothing of it was written, and what
    was to follow its commit was discarded). A message's work that raised while the transaction
    was still sound is that message's failure; a failure of the transaction itself (its done
    marks, its commit, an error a handler swallowed) is no message's."""
    done: dict[str, str] = {}
    blamed: tuple[str, Exception] | None = None
    try:
        with transaction.atomic(), ExitStack() as inside:
            for context in contexts:
                inside.enter_context(context())
            _lock_in_order(rules, started)
            for message, _ in started:
                with tracing.message_in_hand(message):
                    try:
                        done[message.message_id] = rules.handlers[message.kind].func(message)
                    except Exception as exc:
                        blamed = (message.message_id, exc)
                        raise
                if transaction.get_rollback():
                    raise BatchRolledBack("a message's work failed and its error was swallowed")
            queue_messages_complete(done=[(qm, done[m.message_id]) for m, qm in started])
            _pause_at("batch_commit")
    except Exception as exc:  # noqa: BLE001 - the batch is applied again, one savepoint each
        if is_outage(exc):
            raise DatabaseDown(exc) from exc  # not the messages' fault: hold them back
        logger.info(
            "the batch of %s message(s) is applied again one savepoint each%s, after %s: %s",
            len(started),
            f" without message {blamed[0]}, which failed" if blamed else "",
            type(exc).__name__,
            exc,
        )
        return _Together(failed=blamed)
    return _Together(done=done)


def _apply_each_in_savepoint(
    rules: Rules, started: list[tuple[ReceivedMessage, QueueMessage]]
) -> tuple[dict[str, str], dict[str, Exception]]:
    """Each message's work in a savepoint of its own (the handler's own when it declares one,
    see ``Handler.own_savepoint``), with their done marks (one statement), in one transaction.
    A failing message rolls back only its savepoint. If the transaction itself fails (at
    commit, or the connection broke so a savepoint could not be rolled back), nothing of it
    committed: every message fails with that error. Returns (outcomes, failures) by id."""
    done: dict[str, str] = {}
    failures: dict[str, Exception] = {}
    try:
        with transaction.atomic():
            _lock_in_order(rules, started)
            for message, _ in started:
                handler = rules.handlers[message.kind]
                try:
                    with (
                        tracing.message_in_hand(message),
                        transaction.atomic() if not handler.own_savepoint else nullcontext(),
                    ):
                        done[message.message_id] = handler.func(message)
                except Exception as exc:  # noqa: BLE001 - becomes this message's retry
                    failures[message.message_id] = exc
            if transaction.get_rollback():
                raise BatchRolledBack("a savepoint could not be rolled back")
            queue_messages_complete(
                done=[(qm, done[m.message_id]) for m, qm in started if m.message_id in done]
            )
            _pause_at("batch_commit")
    except Exception as exc:  # noqa: BLE001 - nothing committed: all of them are retried
        if is_outage(exc):
            raise DatabaseDown(exc) from exc  # not the messages' fault: hold them back
        logger.error("the batch transaction of %s message(s) failed: %s", len(started), exc)
        for message, _ in started:  # those that ran, and any the failure kept from running
            failures.setdefault(message.message_id, exc)
        done.clear()
    return done, failures


def _lock_in_order(rules: Rules, started: list[tuple[ReceivedMessage, QueueMessage]]) -> None:
    """Before any work of the batch: the row locks its handlers declare (``Handler.locks``),
    each handler's for all of its messages at once, in the one lock order. A failure here is
    the transaction's, no message's: the batch is applied again one savepoint each, or every
    message of it is retried."""
    by_handler: dict[int, tuple[Handler, list[ReceivedMessage]]] = {}
    for message, _ in started:
        handler = rules.handlers[message.kind]
        if handler.locks is not None:
            by_handler.setdefault(id(handler), (handler, []))[1].append(message)
    for handler, messages in by_handler.values():
        handler.locks(messages)


def _pause_at(point: str) -> None:
    """Tests only: stop here for good when ``WORKER_PAUSE_AT`` names this point, so a test can
    SIGKILL the process at a known place. A no-op unless a test sets it."""
    if point and callbacks_conf.WORKER_PAUSE_AT == point:
        logger.warning("paused at %s", point)
        while True:
            time.sleep(3600)
