"""The SQS FIFO consumer behind ``run_sqs_worker``.

One loop: relay the outbox, long-poll a batch, handle it, delete what committed. A batch's
processor events (the group heads) start in one statement and apply in one transaction,
together (a batch where one fails is rolled back: that one fails, the others are applied
again, a savepoint each);
everything else (submissions, which call the processor, and later messages of
a group) goes one message at a time in sequence order. The guarantees and where they come from:

- in order per payment: SQS FIFO delivers a group's messages in order and never hands out a
  later one while an earlier one is in flight; within a batch (AWS may return several of one
  group, fauxqs at most one) we stop a group at its first failure and release the rest
  untouched, so nothing overtakes a message that is waiting for its retry;
- exactly once: the work and the "done" mark commit in one transaction (the batch's, or the
  message's own), the SQS delete comes after; a failure fails only its own message (its
  batch is rolled back and the others applied again, a savepoint each) and is recorded
  after the commit; a commit that fails leaves every message of it to be retried; a
  redelivery of a done message is only deleted, and the payments services deduplicate
  processor events by id on top;
- nothing lost: every failure is written in its own transaction; a message is dead-lettered
  (a copy in the DLQ, its payment on hold) before it is deleted; a message that crashes the
  process is recorded when it comes back, run on its own, and dead-lettered once it has done
  so a few times, its group's later messages in hand parked behind its hold, before the
  queue's RedrivePolicy counts them out; the RedrivePolicy stays the safety net, and
  ``queue_message_start`` notices the gap it leaves and holds the payment.

One job per module, and calls that go one way, down: ``loop`` (the ``Worker``: signals, the
relay and the handlers' ticks, the receive, the database outage mode) is the top; it builds the
two things it hands down, ``hand`` (the messages in hand: taking them, the heartbeat, deleting,
releasing, hiding, holding back) and ``rules`` (the handlers, attempts and backoff). Below it
the runners: ``batch`` (the batch transaction and its savepoints), ``message`` (one message on
its own: gates, start, its transaction), ``crashes`` (messages that came back unfinished: the
worker died while they ran), ``outcomes`` (the one retry / dead-letter / defer decision, and the
log line of every message); at the bottom ``outage`` (a database outage told from a failure).
No module of the package imports ``loop`` (tests/test_dependency_direction.py holds it). What a
kind of message depends on (the processor's circuit breaker, for submissions) is declared on its
handler (``callbacks.handlers``); the worker names no message kind.

The batch path, counted by following the calls by hand from ``Worker.process_batch`` (each
function walked once, in source order; a call into a module outside the package is a visit, not
followed further; plain attribute reads and calls into Django, prometheus or the standard
library not counted). Before the hand (the runners took the ``Worker`` and called it back:
``in_hand``, ``let_go``, ``release``, ``delete``, ``hide``, ``hold_back``, ``database_down``,
``expect_back``, ``stats.count``, ``stopping``, ``limit_reached``, ``process_message``): 14
modules visited, 18 calls back into a module the walk had left on its way down and not yet
returned to (all of them into ``loop``). Now: 16 modules (``hand`` and ``rules`` added), 0 such
returns. Counted instead as calls from a module into any module entered before (each ordered
pair once), the shared lower modules (``outage``, the services, ``tracing``, ``hand``) make it 16
before and 18 now: several runners calling one module below them, not a call back up.
"""

from callbacks.handlers import AttemptNeverFinished, InvalidBody, UnknownMessageKind, UnstorableBody
from callbacks.worker.hand import Hand, WorkerStats
from callbacks.worker.loop import MAX_LINGER_SECONDS, Worker
from callbacks.worker.outage import DatabaseDown, database_answers
from callbacks.worker.outcomes import Outcome, Result

# The error classes are recorded as callbacks.worker.<name> (see callbacks.handlers).
__all__ = [
    "MAX_LINGER_SECONDS",
    "AttemptNeverFinished",
    "DatabaseDown",
    "Hand",
    "InvalidBody",
    "Outcome",
    "Result",
    "UnknownMessageKind",
    "UnstorableBody",
    "Worker",
    "WorkerStats",
    "database_answers",
]
