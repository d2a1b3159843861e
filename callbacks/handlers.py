"""The work behind each kind of queue message, what may keep it from running now, and the errors
a message's content can cause.

A handler takes a received message and returns its outcome (a string recorded on the message's
``QueueMessage`` row and used as a metric label). ``DEFAULT_HANDLERS`` maps the body's ``kind``
to its handler; the worker (``callbacks.worker``) decides when and in which transaction to run it.
Whatever the work depends on is declared on its handler, so the worker names no message kind and
no dependency: gates asked before a message starts, a test that turns a failure of the work into
a deferral, and ticks the loop runs between receives. Submissions declare the processor's circuit
breaker that way (the end of this module).
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass

from django.db import DatabaseError, transaction

from callbacks import conf as callbacks_conf
from callbacks import sqs
from callbacks.metrics import DEDUP_HITS
from callbacks.schema import PROCESSOR_EVENT, processor_event_from_message
from callbacks.services import outage_holds_release, outage_holds_waiting
from callbacks.sqs import ReceivedMessage
from payments.exceptions import InvalidTransition, ProcessorCircuitOpen, ProcessorDegraded
from payments.models import BreakerState
from payments.processor.breaker import (
    processor_breaker_close_when_trials_done,
    processor_breaker_degraded_end,
    processor_breaker_incident_end,
    processor_breaker_trial_start,
    processor_breaker_wait,
    trial_calls,
)
from payments.services import SUBMIT_PAYMENT, ApplyOutcome, events_share_transaction

# Gates and ticks run inside the worker's loop: their lines carry the worker's logger name, as
# every other line of a worker does.
logger = logging.getLogger("callbacks.worker")

# Seconds between looks at the processor's breaker from the loop (trial due? release held?).
BREAKER_TICK_INTERVAL = 1.0

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


class AttemptNeverFinished(Exception):
    """An attempt of the message was started and never finished: the worker died while it ran
    (killed, out of memory, a crash) or held it past its visibility timeout. Recorded when the
    message comes back; a message that keeps doing it is dead-lettered without running again."""


for _error in (UnknownMessageKind, InvalidBody, UnstorableBody, AttemptNeverFinished):
    _error.__module__ = _RECORDED_MODULE


@dataclass(frozen=True, kw_only=True)
class Deferral:
    """A dependency cannot take the message now, through no fault of the message: the worker
    parks it off the queue behind an outage hold of its payment (``message_defer``), spends no
    attempt on it, and a tick releases it when the dependency takes calls again.

    ``wait``: the seconds the dependency asked for (at least one when the work failed).
    ``label``: the ``reason`` label of the deferred-messages metric. ``due_in``: seconds until a
    tick releases it when the pause has a known end, so ``--until-empty`` stays to run it;
    None for an outage nobody knows the end of. ``keep_error``: the work made a real call that
    failed, which stays in the message's error history.

    ``backoff_attempt``: the dependency is degraded, not down: it takes calls, so the message
    waits the backoff a retry after this attempt would (``backed_off``), and its hold is
    released only after that (``release_in``), by the ticks that release outage holds.
    """

    wait: float
    reason: str
    label: str
    due_in: float | None
    keep_error: bool = False
    backoff_attempt: int | None = None
    release_in: float | None = None

    def backed_off(self, delay: float) -> Deferral:
        """This deferral waiting ``delay`` seconds (at least its own ``wait``) before release."""
        delay = max(delay, self.wait)
        return dataclasses.replace(
            self, wait=delay, release_in=delay, due_in=delay + BREAKER_TICK_INTERVAL
        )


@dataclass(frozen=True)
class Tick:
    """Work the worker loop does between receives, at most every ``interval`` seconds, and once
    more before an ``--until-empty`` run stops. ``func`` returns how many messages it put back
    on the queue (such a run then goes round again); ``name`` names it in the log when it fails.
    ``pending``: True while work is waiting that a later turn will do (a paced release), so an
    ``--until-empty`` run stays for it. ``awaited``: True while the tick's turns must come on
    time (asked after each turn): the worker then long-polls no longer than ``interval``, since
    a worker waiting 20 s on an empty queue takes no turn meanwhile.
    """

    name: str
    func: Callable[[], int]
    interval: float
    pending: Callable[[], bool] | None = None
    awaited: Callable[[], bool] | None = None


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

    ``together``: the work of several messages of this kind may run in one transaction with
    no savepoint each inside this context (for processor events, ``events_share_transaction``):
    the batch path tries a batch that way first and, when one of its messages fails, rolls the
    whole of it back: that message fails with its error and the others run again, each in its
    own savepoint. None: always a savepoint each.

    ``locks``: a context the worker enters first in a transaction that applies several of
    these messages (the worker's batch), for the rest of it: it takes the row locks their work
    will take, in the one lock order (``payments.services.payments_lock``), so that a batch and
    a service locking the same rows one by one never wait on each other in a circle, and may
    keep what it read for their work. None: the work takes its own locks only.

    ``gates``: asked in order before a message starts; the first that returns a ``Deferral``
    defers it unstarted (no attempt counted, no error row). ``defers``: turns a failure of the
    started work into a ``Deferral`` (the attempt is given back), or None for an ordinary
    failure. ``waits_behind``: for a retryable failure, why the message must wait for a later
    message of its group (which a retry would keep behind it), or None: the worker then sends
    it to the back of its group instead of hiding it (``outcomes.move_behind``). ``ticks``: what
    the loop runs between receives for this kind's sake.
    """

    func: Callable[[ReceivedMessage], str]
    atomic: bool = True
    own_savepoint: bool = False
    together: Callable[[], AbstractContextManager] | None = None
    locks: Callable[[list[ReceivedMessage]], AbstractContextManager] | None = None
    gates: tuple[Callable[[ReceivedMessage], Deferral | None], ...] = ()
    defers: Callable[[Exception], Deferral | None] | None = None
    waits_behind: Callable[[ReceivedMessage, Exception], str | None] | None = None
    ticks: tuple[Tick, ...] = ()


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
        # Counted once committed: a batch applied together and then again one by one (see
        # ``Handler.together``) counts its duplicates once.
        transaction.on_commit(lambda: DEDUP_HITS.labels(layer="app").inc(), robust=True)
    return str(result.outcome)


def event_waits_for_submission(message: ReceivedMessage, exc: Exception) -> str | None:
    """A processor event its payment cannot take yet (``InvalidTransition``: a ``settled`` for a
    payment still ``pending``) while a submission of that payment made its call (marked before
    it, the mark kept after a call that failed retryably): the processor has the debit, and the
    submission's answer that moves the payment on is still to be applied. Its message may well
    be behind this one in the group (a hold's release sent it back after the processor's
    callback arrived), where a retry keeps it until this one is dead-lettered: this one goes
    behind it instead."""
    from callbacks.selectors import payment_submission_started

    if not isinstance(exc, InvalidTransition):
        return None
    if not payment_submission_started(message.group_id):
        return None
    return f"payment {message.group_id} is pending with its submission still to be applied"


def handle_submit_payment(message: ReceivedMessage) -> str:
    from payments.services import payment_submit

    result = payment_submit(
        payment_id=_payment_id_from_body(message), caused_by=f"sqs:{message.message_id}"
    )
    return str(result.outcome)


# --- the processor's circuit breaker, declared by submissions ---------------------------------


def _breaker_deferral(
    *, wait: float, breaker_open: bool, reason: str, keep_error: bool = False
) -> Deferral:
    """An open (or probing) breaker is an outage of unknown length; a 429 pause has a known
    end, a tick after its ``wait``."""
    return Deferral(
        wait=wait,
        reason=reason,
        label="breaker_open" if breaker_open else "paused",
        due_in=None if breaker_open else wait + BREAKER_TICK_INTERVAL,
        keep_error=keep_error,
    )


def processor_breaker_gate(message: ReceivedMessage) -> Deferral | None:
    """Before a submission starts: while the processor's breaker is open (or calls are paused
    by a 429), defer it until calls may flow."""
    try:
        gate = processor_breaker_wait()
    except DatabaseError as exc:
        # The start would fail the same way; let the usual path record and retry it.
        logger.warning("could not read the processor breaker: %s", exc)
        return None
    if gate.allowed:
        return None
    return _breaker_deferral(
        wait=gate.wait_seconds, breaker_open=gate.state != BreakerState.CLOSED, reason=gate.reason
    )


def processor_circuit_open(exc: Exception) -> Deferral | None:
    """The submission started but the processor is down as a whole (the breaker opened, or
    was open when the call was to be made), paused every caller, or failed it while failing
    other payments too (degraded): defer it. A real call that failed stays in the error
    history; after a degraded failure the message waits its backoff before it is released."""
    if isinstance(exc, ProcessorDegraded):
        return Deferral(
            wait=exc.retry_after or 0.0,
            reason=str(exc),
            label="degraded",
            due_in=(exc.retry_after or 0.0) + BREAKER_TICK_INTERVAL,
            keep_error=True,
            backoff_attempt=exc.attempt_number,
        )
    if not isinstance(exc, ProcessorCircuitOpen):
        return None
    return _breaker_deferral(
        wait=max(exc.retry_after or 0.0, 1.0),
        breaker_open=exc.breaker_open,
        reason=str(exc),
        keep_error=exc.called,
    )


def processor_breaker_tick() -> int:
    """Start the breaker's trial when its pause is over (one process wins it) and release that
    many held submissions to make it; once calls may flow, release the outage holds at a pace.
    Returns how many messages went back to the queue."""
    try:
        gate = processor_breaker_wait()
        if gate.degraded:
            processor_breaker_degraded_end()
        if gate.state == BreakerState.CLOSED:
            if gate.incident:
                processor_breaker_incident_end()
            if gate.allowed and outage_holds_waiting():
                # A long outage's backlog goes back to the queue (and to the processor) at a
                # pace, not all at once: OUTAGE_RELEASE_PER_SECOND, all workers together.
                per_second = int(callbacks_conf.OUTAGE_RELEASE_PER_SECOND)
                return outage_holds_release(
                    limit=max(1, int(per_second * BREAKER_TICK_INTERVAL)), per_second=per_second
                )
            return 0
        if gate.allowed and processor_breaker_trial_start():
            return outage_holds_release(limit=trial_calls(), trial=True)
        if gate.state == BreakerState.HALF_OPEN and not outage_holds_waiting():
            # Nothing left to make more trial calls with: what went through decides.
            processor_breaker_close_when_trials_done()
    except sqs.QueueUnavailable as exc:
        logger.warning("could not release held submissions (%s); next tick tries again", exc)
    return 0


def outage_release_pending() -> bool:
    """Calls may flow and outage holds still wait: the paced release is not done."""
    try:
        gate = processor_breaker_wait()
        return gate.state == BreakerState.CLOSED and gate.allowed and outage_holds_waiting()
    except DatabaseError:
        return False


PROCESSOR_BREAKER_TICK = Tick(
    "processor breaker tick",
    processor_breaker_tick,
    BREAKER_TICK_INTERVAL,
    pending=outage_release_pending,
    # While submissions wait out an outage, the trial and the release must not wait for a
    # long poll of a queue that nothing else fills: the drain after an outage would start up to
    # two wait times late.
    awaited=outage_holds_waiting,
)


@contextmanager
def processor_events_locked(messages: list[ReceivedMessage]) -> Iterator[None]:
    """The payments of a batch of processor events (each message's group is its payment) and
    their refunds, then their merchants' return-rate counters of today, locked in the one lock
    order before any of their events is applied, in one statement; the payments' rows, read
    with their locks, serve their events' own row locks (``payments_locked``) for the rest of
    the block."""
    from payments.services import payments_locked

    payment_ids = [message.group_id for message in messages]
    with payments_locked(payment_ids=payment_ids, merchant_days=True):
        yield


DEFAULT_HANDLERS: dict[str, Handler] = {
    # payment_apply_event writes only inside its own atomic block.
    PROCESSOR_EVENT: Handler(
        handle_processor_event,
        own_savepoint=True,
        together=events_share_transaction,
        locks=processor_events_locked,
        waits_behind=event_waits_for_submission,
    ),
    SUBMIT_PAYMENT: Handler(
        handle_submit_payment,
        atomic=False,
        gates=(processor_breaker_gate,),
        defers=processor_circuit_open,
        ticks=(PROCESSOR_BREAKER_TICK,),
    ),
}
