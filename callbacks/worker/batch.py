"""One received batch: groups in order, the group heads in one transaction, the rest one by one.

First the batch's group heads whose work is atomic (processor events) are started in one
statement and applied in one transaction (``_heads_apply``): together, with no savepoint each,
where their handlers allow it; a batch where anything failed is rolled back whole, the message
that failed fails with its error and the others are applied again, a savepoint each: a failure
still fails only its own message. The transaction first takes the row locks the handlers
declare, in the one lock order (``Handler.locks``); the processor events' lock reads their
payments' rows in the same statement, and each event takes its payment from there instead of
locking it again (``payments.services.payments_locked``). Then every other message, in group
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

The path of a batch of processor events, walked from ``Worker.process_batch`` as a reader walks
it: the functions of the worker's runners it passes through (``loop``'s entry, this module's,
the two of ``crashes`` it calls), every statement in them and every ``return``, all branches
read; calls into ``hand``, ``outcomes``, ``message`` and outside the package are visits, not
followed. Before: 13 functions (``process_batch``, ``group_in_order``, ``start_heads``,
``apply_started``, ``_apply_in_one_transaction``, ``_apply_together``,
``_apply_each_in_savepoint``, ``_lock_in_order``, ``_process_group``, ``_pause_at``,
``suspects_find``, ``suspect_groups`` and the loop's entry), 162 statements, 20 returns. Now 7
functions, 126 statements, 8 returns: ``_heads_apply`` starts and applies the heads,
``_transaction`` is the one transaction whether together or a savepoint each, and a group's
messages are walked in ``process_batch`` itself. Traced as it runs instead (ten first receives
applied together; the named functions of the whole package entered, the distinct statements
and ``return`` statements executed): 25 functions, 118 statements, 13 returns before; 20, 119
and 11 now.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from contextlib import ExitStack, nullcontext

from django.db import DatabaseError, connection, transaction

import callbacks.worker.crashes as crashes
import callbacks.worker.outcomes as outcomes
from callbacks import conf as callbacks_conf
from callbacks import tracing
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

Started = list[tuple[ReceivedMessage, QueueMessage]]


class BatchRolledBack(Exception):
    """The batch's transaction was left unusable: a message's work swallowed its error, or a
    savepoint could not be rolled back."""


def group_in_order(messages: Iterable[ReceivedMessage]) -> list[list[ReceivedMessage]]:
    """The batch split by message group, each group in sequence-number order."""
    groups: dict[str, list[ReceivedMessage]] = {}
    for m in messages:
        groups.setdefault(m.group_id, []).append(m)
    return [sorted(g, key=lambda m: m.sequence_number) for g in groups.values()]


def process_batch(hand: Hand, rules: Rules, messages: list[ReceivedMessage]) -> None:
    """Handle one received batch (see the module docstring): the group heads applied together
    (``_heads_apply``), then each group's messages in order, each one applied already or
    handled now on its own, until one stops its group, a stop is requested or the message
    limit is reached. Finished messages are deleted after their commits, the ones not started
    released at once. A database outage holds back whatever of the batch is left, then goes
    on up (``DatabaseDown``) for the loop to wait it out. A group with a message whose start
    never finished before runs last, on its own (``callbacks.worker.crashes``), after what
    finished before it is deleted, so that a crash from there on brings none of it back."""
    pending = {m.message_id: m for m in messages}
    finished: list[ReceivedMessage] = []
    with hand.holding(messages):
        WORKER_BATCH_MESSAGES.observe(len(messages))
        try:
            suspects = crashes.suspects_find(messages, limit=rules.max_failed_starts)
            clear, suspected = crashes.suspect_groups(group_in_order(messages), suspects)
            results = _heads_apply(hand, rules, clear)
            for group in (*clear, *suspected):
                if finished and any(m.message_id in suspects for m in group):
                    hand.delete(finished)
                    finished.clear()
                for message in group:
                    result = results.get(message.message_id)
                    if result is None and not hand.may_start():
                        break
                    suspect = suspects.get(message.message_id)
                    if result is None and suspect is not None and suspect.given_up:
                        result = crashes.dead_letter(hand, rules, message, suspect)
                    elif result is None:
                        result = process_message(hand, rules, message)
                    del pending[message.message_id]
                    hand.let_go([message])
                    if result.delete:
                        finished.append(message)
                    if result.stop_group:
                        break
        except DatabaseDown:
            # Nothing more of this batch can be started or recorded: hold back what is left.
            hand.hold_back(list(pending.values()))
            pending.clear()
            raise
        finally:
            hand.release(pending.values())
            hand.delete(finished)


def _heads_apply(
    hand: Hand, rules: Rules, groups: list[list[ReceivedMessage]]
) -> dict[str, Result]:
    """Start the group heads the batch path can take (their handler is atomic) in one
    statement (``queue_messages_start_batch``), apply them in one transaction, together where
    their handlers allow it (``Handler.together``), and record each one's end after the
    commit (a failure's error row, retry or dead letter: SQS is never called inside the
    transaction). A transaction applied together that rolled back is applied again one
    savepoint each, without the message whose work raised (it fails with its error, as it
    would have in its savepoint; it is not run again now). The heads not started keep the
    per-message path: those the message limit or a stop leaves out, every one when the bulk
    start fails (that path records why) and every one on another database than PostgreSQL,
    whose statement the bulk start is (SQLite, the quick start)."""
    left = hand.starts_left()
    heads = [
        group[0]
        for group in groups
        if group[0].body is not None
        and (handler := rules.handlers.get(group[0].kind)) is not None
        and handler.atomic
    ][: left if left is not None else len(groups)]
    started: dict[str, QueueMessage] = {}
    if heads and hand.may_start() and connection.vendor == "postgresql":
        try:
            started = queue_messages_start_batch(messages=heads)
        except (DatabaseError, UnicodeError) as exc:
            logger.warning("could not start the batch in bulk (%s); one at a time instead", exc)
        hand.started(len(started))
    batch = [(m, started[m.message_id]) for m in heads if m.message_id in started]
    began = time.monotonic()
    together = {rules.handlers[m.kind].together for m, _ in batch}
    done, failures = {}, {}
    if batch and None not in together:
        done, failures = _transaction(rules, batch, together)
    again = [(m, qm) for m, qm in batch if m.message_id not in done.keys() | failures.keys()]
    if again:
        done_again, failures_again = _transaction(rules, again, set())
        done, failures = {**done, **done_again}, {**failures, **failures_again}
    results = {}
    for message, queue_message in batch:
        with tracing.message_in_hand(message, span=False):
            if message.message_id in failures:
                error = failures[message.message_id]
                results[message.message_id] = outcomes.fail(
                    hand, rules, message, queue_message, error, began
                )
            else:
                outcomes.observe_applied(message)
                handled = Result.handled(done[message.message_id])
                results[message.message_id] = outcomes.finish(
                    hand, rules, message, queue_message, handled, began
                )
    return results


def _transaction(
    rules: Rules, batch: Started, together: set
) -> tuple[dict[str, str], dict[str, Exception]]:
    """Apply ``batch`` in one transaction with their done marks (one statement), after the row
    locks their handlers declare (``Handler.locks``: each handler's for all of its messages at
    once, in the one lock order, so a batch and a service locking the same rows one by one
    never wait on each other in a circle). Returns (outcomes, failures) by id.

    ``together`` (the handlers' contexts): with no savepoint each, two statements fewer per
    message. Anything that fails rolls the whole transaction back (nothing of it was written,
    and what was to follow its commit was discarded): the message whose work raised is the one
    failure returned, and none when the transaction itself failed (its done marks, its commit,
    an error a handler swallowed); the caller applies the rest again. Empty: each message's
    work in a savepoint (the handler's own when it declares one, ``Handler.own_savepoint``), so
    a failing message rolls back only its own; if the transaction itself fails, nothing of it
    committed and every message fails with that error."""
    done: dict[str, str] = {}
    failures: dict[str, Exception] = {}
    locking: dict[int, tuple] = {}
    for message, _ in batch:
        handler = rules.handlers[message.kind]
        if handler.locks is not None:
            locking.setdefault(id(handler), (handler, []))[1].append(message)
    try:
        with transaction.atomic(), ExitStack() as inside:
            for context in together:
                inside.enter_context(context())
            for handler, messages in locking.values():
                inside.enter_context(handler.locks(messages))
            for message, _ in batch:
                handler = rules.handlers[message.kind]
                alone = not together and not handler.own_savepoint
                try:
                    with (
                        tracing.message_in_hand(message),
                        transaction.atomic() if alone else nullcontext(),
                    ):
                        done[message.message_id] = handler.func(message)
                except Exception as exc:  # noqa: BLE001 - becomes this message's retry
                    failures[message.message_id] = exc
                    if together:
                        raise
                if transaction.get_rollback():
                    raise BatchRolledBack("a message's work left the transaction unusable")
            queue_messages_complete(
                done=[(qm, done[m.message_id]) for m, qm in batch if m.message_id in done]
            )
            if callbacks_conf.WORKER_PAUSE_AT == "batch_commit":
                _pause_for_good("batch_commit")
    except Exception as exc:  # noqa: BLE001 - applied again, or every message retried
        if is_outage(exc):
            raise DatabaseDown(exc) from exc  # not the messages' fault: hold them back
        done = {}
        if together:
            blamed = "".join(f" without message {m}, which failed" for m in failures)
            logger.info(
                "the batch of %s message(s) is applied again one savepoint each%s, after %s: %s",
                len(batch),
                blamed,
                type(exc).__name__,
                exc,
            )
        else:
            logger.error("the batch transaction of %s message(s) failed: %s", len(batch), exc)
            for message, _ in batch:  # those that ran, and any the failure kept from running
                failures.setdefault(message.message_id, exc)
    return done, failures


def _pause_for_good(point: str) -> None:
    """Tests only: stop here for good (``WORKER_PAUSE_AT`` names this point), so a test can
    SIGKILL the process at a known place."""
    logger.warning("paused at %s", point)
    while True:
        time.sleep(3600)
