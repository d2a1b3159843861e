"""Submitting a pending payment to the processor: two short transactions around one HTTP call
made outside any transaction."""

import enum
import logging
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime
from functools import cache

from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.utils import timezone

from payments.alerts import AlertSeverity, alert_raise
from payments.exceptions import ProcessorCircuitOpen, ProcessorUnavailable
from payments.models import (
    AttemptOutcome,
    CircuitBreaker,
    EventKind,
    EventOutcome,
    Payment,
    PaymentEvent,
    PaymentState,
    ProcessorAttempt,
    ReviewStatus,
)
from payments.processor.backend import DebitQueued
from payments.processor.backends.http import (
    DebitAccepted,
    ProcessorAuthFailed,
    ProcessorCallRejected,
    ProcessorCallUnavailable,
    get_client,
)
from payments.processor.breaker import PROCESSOR as PROCESSOR_BREAKER
from payments.processor.breaker import Admission, processor_breaker_admit_read
from payments.services.calls import (
    SUBMIT_OPERATION,
    alert_auth_failed,
    attempt_new,
    attempt_record,
    attempt_recorded,
    breaker_admit,
    breaker_record,
    breaker_record_called_again,
    breaker_recovered,
    call_again_worth,
    log_attempt,
    transfer_create,
)
from payments.services.transitions import (
    transition_announce,
    transition_count,
    transition_move,
)
from payments.services.writes import move_save, payment_lock
from payments.signals import payment_transitioned
from payments.submission_sql import move_written_whole, submission_write

logger = logging.getLogger(__name__)


class SubmitOutcome(enum.StrEnum):
    """What a submission did; the values are the words logs, metrics and queue records use."""

    SUBMITTED = "submitted"
    REJECTED = "rejected"
    SKIPPED = "skipped"
    # The backend submits it itself later (a bank file's delivery queues the submission that
    # answers it): the payment stays pending and the message is done.
    QUEUED = "queued"
    RETRYABLE = "retryable"  # never returned: ``ProcessorUnavailable`` is raised instead


@dataclass(frozen=True)
class SubmitResult:
    outcome: SubmitOutcome  # submitted, rejected, skipped or queued
    payment: Payment


@dataclass(frozen=True)
class _SubmitRule:
    """What a final answer of the processor does to the payment found after the call.

    A pending payment moves to ``target`` and the submission reports ``outcome``. A payment no
    longer pending was moved by someone else (another worker's submission, or an event): the
    answer is logged as stale, and the submission reports ``outcome`` when the payment's state
    agrees with the answer, else ``skipped``.
    """

    target: PaymentState
    outcome: SubmitOutcome
    agreeing_states: frozenset[PaymentState]


# The processor's answer (as the attempt row names it) -> what it does. A retryable answer
# changes nothing and has no rule.
_SUBMIT_RULES = {
    AttemptOutcome.ACCEPTED: _SubmitRule(
        target=PaymentState.SUBMITTED,
        outcome=SubmitOutcome.SUBMITTED,
        agreeing_states=frozenset(
            {PaymentState.SUBMITTED, PaymentState.CONFIRMED, PaymentState.RETURNED}
        ),
    ),
    AttemptOutcome.REJECTED: _SubmitRule(
        target=PaymentState.FAILED,
        outcome=SubmitOutcome.REJECTED,
        agreeing_states=frozenset({PaymentState.FAILED}),
    ),
}


@dataclass(frozen=True)
class _SubmissionRecorded:
    """The second transaction's work, acted on after its commit."""

    payment: Payment
    attempt: ProcessorAttempt
    outcome: SubmitOutcome
    alert: dict | None = None


def payment_submit(*, payment_id, caused_by: str = "") -> SubmitResult:
    """Submit a pending payment to the processor with its idempotency key.

    No transaction or row lock is held across the HTTP call: a first short transaction locks the
    row, checks the payment is pending and marks it as being submitted (``submission_started_at``:
    a cancel is refused from then on, and a cancel that locked the row first leaves it
    ``canceled``, which is skipped); the call runs outside any transaction; a second short
    transaction locks the row again, records the attempt and applies the outcome (one
    statement while the row is the version the mark wrote, ``_submission_recorded``). Whatever
    the outcome, the attempt row is committed before anything is raised.

    Accepted -> ``submitted``; queued by the backend (``DebitQueued``) -> still ``pending``,
    the message done; rejected (4xx) -> ``failed`` and a medium alert; retryable ->
    state unchanged and ``ProcessorUnavailable`` (with ``retry_after`` when the processor gave
    one). A payment that is not pending is skipped: it is never submitted again. Two workers may
    submit the same pending payment at once; the processor charges the key once, and the second
    one to record sees the state the first one left (see ``_SUBMIT_RULES``).
    """
    marked = _submission_mark_sent(payment_id)
    if marked is None:
        started = _submission_start(payment_id)
        if isinstance(started, SubmitResult):
            return started
        marked = started
    payment, mark = marked.payment, marked.mark

    # Read right before the call, never earlier: a stale "closed" (the worker's gate's) once
    # let a call out past a breaker another worker had just opened.
    admission = marked.admission
    if admission is None:
        try:
            admission = breaker_admit(payment, SUBMIT_OPERATION)
        except ProcessorCircuitOpen:
            if mark is not None:  # no call was made: the payment may still be canceled
                _submission_unmark(payment_id, mark)
            raise
    result = _debit_create(payment)
    recorded = _submission_recorded(marked, result, caused_by)
    if call_again_worth(admission, recorded.attempt, result):
        admission, result, recorded = _submission_call_again(admission, recorded, marked, caused_by)
    # After commit: the attempt and the state change are durable before anyone hears of them.
    payment, attempt = recorded.payment, recorded.attempt
    if recorded.alert is not None:
        alert_raise(**recorded.alert)
    if isinstance(result, ProcessorAuthFailed):
        alert_auth_failed(payment, attempt)
    log_attempt(payment, attempt, recorded.outcome)
    breaker_record(admission, payment, attempt, result)
    if recorded.outcome == SubmitOutcome.RETRYABLE:
        raise ProcessorUnavailable(
            f"payment {payment.id} attempt {attempt.attempt_number}: {result}",
            retry_after=attempt.retry_after_seconds,
        ) from result
    return SubmitResult(recorded.outcome, payment)


def _submission_call_again(
    admission: Admission, failed: _SubmissionRecorded, marked: "_Marked", caused_by: str
) -> tuple[Admission, object, _SubmissionRecorded]:
    """Make a failed call again at once on a new connection (``breaker.degraded``: a
    balancer's dead backend), under the same idempotency key; its own attempt row. Returns
    the admission counting the failure, and what the call again gave and recorded."""
    payment = failed.payment
    log_attempt(payment, failed.attempt, "called again on a new connection")
    admission = breaker_record_called_again(admission, failed.attempt)
    get_client().connections_renew()
    result = _debit_create(payment)
    recorded = _submission_recorded(marked, result, caused_by)
    if recorded.outcome != SubmitOutcome.RETRYABLE:
        breaker_recovered(recorded.payment, recorded.attempt)
    return admission, result, recorded


# One statement (its own transaction, or in the caller's): the payment's row locked, the mark
# set only on a pending payment no one holds, and the row as it is then, with the mark it had
# before; and the processor's breaker row with the database's clock, for the admission right
# before the call, with how long the statement took (a wait on the row lock makes the breaker's
# read, taken at the statement's start, that much older).
_MARK_SQL = """
WITH prior AS (
    SELECT id, submission_started_at FROM {table}
    WHERE id = %s AND state = %s AND review_status NOT IN (%s, %s)
    FOR NO KEY UPDATE
), marked AS (
    UPDATE {table} AS p SET submission_started_at = %s, updated_at = %s
    FROM prior WHERE p.id = prior.id
    RETURNING {payment_columns}, prior.submission_started_at, p.xmin::text
)
SELECT marked.*, {breaker_columns}, STATEMENT_TIMESTAMP(),
    EXTRACT(EPOCH FROM CLOCK_TIMESTAMP() - STATEMENT_TIMESTAMP())
FROM marked LEFT JOIN {breaker} AS b ON b.{breaker_key} = %s
"""
# A mark that took longer than this (it waited on the payment's row lock: another submission's
# or a cancel's transaction) has a breaker read too old to let a call out on: the admission
# reads the breaker again, as it does when the breaker is not plainly closed.
MARK_BREAKER_FRESH_SECONDS = 0.01


@dataclass(frozen=True)
class _MarkStatement:
    """The mark's statement, built once, and how to read its row: the payment's columns (their
    attribute names, and the fields' own converters from the database's value, a JSON column's,
    applied as the ORM applies them), the mark it had before and its row's version, then the
    breaker's columns, the database's clock and the statement's duration."""

    sql: str
    payment_fields: tuple[str, ...]
    converters: tuple[tuple[int, tuple, object], ...]
    breaker_fields: tuple[str, ...]


@cache
def _mark_sql() -> _MarkStatement:
    quote = connection.ops.quote_name
    payment_fields = Payment._meta.concrete_fields
    breaker_fields = CircuitBreaker._meta.concrete_fields
    converters = []
    for index, field in enumerate(payment_fields):
        column = field.cached_col
        functions = (
            *connection.ops.get_db_converters(column),
            *column.get_db_converters(connection),
        )
        if functions:
            converters.append((index, functions, column))
    sql = _MARK_SQL.format(
        table=quote(Payment._meta.db_table),
        payment_columns=", ".join(f"p.{quote(field.column)}" for field in payment_fields),
        breaker=quote(CircuitBreaker._meta.db_table),
        breaker_key=quote(CircuitBreaker._meta.pk.column),
        breaker_columns=", ".join(f"b.{quote(field.column)}" for field in breaker_fields),
    )
    return _MarkStatement(
        sql=sql,
        payment_fields=tuple(field.attname for field in payment_fields),
        converters=tuple(converters),
        breaker_fields=tuple(field.attname for field in breaker_fields),
    )


@dataclass(frozen=True)
class _Marked:
    payment: Payment
    mark: datetime | None  # set by this submission where there was none (see _submission_mark)
    admission: Admission | None = None  # decided from the mark's breaker read, if it could be
    # The version of the payment's row the mark wrote (its ``xmin``), which ``payment`` is: the
    # record writes in one statement while the row is still that one (``submission_write``).
    version: str | None = None


def _submission_mark_sent(payment_id) -> _Marked | None:
    """Mark a pending payment that nothing holds as being submitted, in one statement (the row
    lock, the check and the mark that ``_submission_start`` takes a transaction of four for),
    and read the breaker for the call's admission in it: the payment, its mark and the
    admission when the read decides it; None when the payment is not one to send (not pending,
    held, unknown), for ``_submission_start`` to say why."""
    if connection.vendor != "postgresql":
        return None
    try:
        pk = Payment._meta.pk.get_db_prep_value(payment_id, connection)
    except ValidationError:
        return None
    now = timezone.now()
    statement = _mark_sql()
    params = [
        pk,
        PaymentState.PENDING,
        ReviewStatus.HELD,
        ReviewStatus.VALIDATION,
        now,
        now,
        PROCESSOR_BREAKER,
    ]
    # The row read straight from the cursor: a raw queryset maps its columns to the model's
    # fields again on every call, most of the mark's CPU.
    with connection.cursor() as cursor:
        cursor.execute(statement.sql, params)
        row = cursor.fetchone()
    if row is None:
        return None
    count = len(statement.payment_fields)
    values = list(row[:count])
    for index, functions, column in statement.converters:
        for convert in functions:
            values[index] = convert(values[index], column, connection)
    payment = Payment.from_db(connection.alias, statement.payment_fields, values)
    marked_before, version = row[count], row[count + 1]
    *breaker_values, read_at, seconds = row[count + 2 :]
    mark = now if marked_before is None else None
    admission = _admission_read(statement.breaker_fields, breaker_values, read_at, seconds)
    return _Marked(payment, mark, admission, version=version)


def _admission_read(
    fields: tuple[str, ...], values: list, read_at: datetime, seconds: float
) -> Admission | None:
    """The admission the mark's breaker read decides (a closed breaker that lets the call go,
    read by a mark that did not wait ``seconds`` long), else None: ``breaker_admit`` reads it
    again."""
    if values[fields.index(CircuitBreaker._meta.pk.attname)] is None:
        return None  # no breaker row yet
    if seconds > MARK_BREAKER_FRESH_SECONDS:
        return None
    breaker = CircuitBreaker.from_db(connection.alias, list(fields), values)
    return processor_breaker_admit_read(breaker, read_at, operation=SUBMIT_OPERATION)


def _submission_start(payment_id) -> SubmitResult | _Marked:
    """The first short transaction, statement by statement: the payment locked, skipped when
    it is not pending or is held (saying why), else marked (``_submission_mark``)."""
    with transaction.atomic():
        payment = payment_lock(payment_id)
        if payment.state != PaymentState.PENDING:
            # A canceled payment among them: its cancel won the row lock, nothing is sent.
            logger.info(
                "payment %s is %s, not pending: not submitted",
                payment.id,
                payment.state,
                extra={"payment_id": str(payment.id)},
            )
            return SubmitResult(SubmitOutcome.SKIPPED, payment)
        if payment.review_status in (ReviewStatus.HELD, ReviewStatus.VALIDATION):
            # Held for a person's review, or for its account's validation: the approval or the
            # validation enqueues the command that sends it.
            logger.warning(
                "payment %s is held for review: not submitted",
                payment.id,
                extra={"payment_id": str(payment.id)},
            )
            return SubmitResult(SubmitOutcome.SKIPPED, payment)
        return _Marked(payment, _submission_mark(payment))


def _submission_mark(payment: Payment) -> datetime | None:
    """Mark a pending payment locked by the caller as being submitted, before its call: a cancel
    is refused from then on (``payments.services.cancel``). Returns the mark when this call set
    it where there was none, else None (a payment whose earlier call failed retryably stays
    marked: that call may have reached the processor)."""
    first = payment.submission_started_at is None
    payment.submission_started_at = timezone.now()
    payment.save(update_fields=["submission_started_at", "updated_at"])
    return payment.submission_started_at if first else None


def _submission_unmark(payment_id, mark: datetime) -> None:
    """No call was made after all (the breaker refused it): clear the mark this submission set,
    unless another submission has marked the payment since (its call may be under way)."""
    Payment.objects.filter(
        pk=payment_id, state=PaymentState.PENDING, submission_started_at=mark
    ).update(submission_started_at=None)


def _debit_create(
    payment: Payment,
) -> DebitAccepted | DebitQueued | ProcessorCallRejected | ProcessorCallUnavailable:
    """The HTTP call of a submission, outside any transaction; a failure is returned, not
    raised, so the attempt is recorded before anything else happens."""
    try:
        return transfer_create(payment)
    except (ProcessorCallRejected, ProcessorCallUnavailable) as exc:
        return exc


def _submission_recorded(marked: _Marked, result, caused_by: str) -> _SubmissionRecorded:
    """The second transaction: record the attempt and apply the answer, committed on return.
    In one statement while the payment's row is the one the mark wrote
    (``_submission_record_written``), else statement by statement after the row lock."""
    recorded = _submission_record_written(marked, result, caused_by)
    if recorded is None:
        with transaction.atomic():
            recorded = _submission_record(marked.payment.pk, result, caused_by)
    return recorded


def _submission_record_written(
    marked: _Marked, result, caused_by: str
) -> _SubmissionRecorded | None:
    """Record the attempt and apply the answer in one statement (``payments.submission_sql``),
    committed on return, when the payment's row is still the version the mark wrote: the
    payment is then pending and as ``marked`` read it, so what the answer does is known without
    reading the row again. None, nothing written, when it is not (someone wrote the row since,
    or another submission took the attempt's number), when the answer is the backend's own
    (``DebitQueued``) or when the move writes money rows (a credit's failure): the caller
    records it statement by statement, reading the row afresh (``marked.payment`` may then have
    been moved in memory, and is not used again).

    Without a transaction of its own where nothing receives ``payment_transitioned``: the
    statement is one, and commits alone. A receiver runs inside the transaction, as on the
    other path: its error rolls the whole record back."""
    if marked.version is None:
        return None
    payment = marked.payment
    attempt = attempt_new(payment, SUBMIT_OPERATION, result)
    if attempt.outcome == AttemptOutcome.RETRYABLE:
        if not submission_write(payment=payment, version=marked.version, attempt=attempt):
            return None
        attempt_recorded(attempt)
        return _SubmissionRecorded(payment, attempt, SubmitOutcome.RETRYABLE)
    rule = _SUBMIT_RULES.get(attempt.outcome)
    if rule is None:
        return None
    # The attempt's number is the statement's to count: it fills the key in.
    details = {
        "attempt_number": None,
        "http_status": attempt.http_status,
        "error_kind": attempt.error_kind,
        "error": attempt.error,
    }
    fields = ()
    if isinstance(result, DebitAccepted):
        fields = _submission_accepted_note(payment, result, details)
    move = transition_move(payment, rule.target)
    if not move_written_whole(move):
        return None
    row = _submission_log(
        payment, str(attempt.outcome), EventOutcome.APPLIED, move.from_state, details, caused_by
    )
    announced = payment_transitioned.has_listeners(Payment)
    with transaction.atomic() if announced else nullcontext():
        if not submission_write(
            payment=payment,
            version=marked.version,
            attempt=attempt,
            move=move,
            fields=fields,
            log=row,
        ):
            return None
        attempt_recorded(attempt)
        transition_count(move)
        transition_announce(row)
    alert = None
    if attempt.outcome == AttemptOutcome.REJECTED:
        alert = _submission_rejected_alert(payment, attempt, details)
    return _SubmissionRecorded(payment, attempt, rule.outcome, alert)


def _submission_record(payment_id, result, caused_by: str) -> _SubmissionRecorded:
    """Record the attempt and apply the answer statement by statement; call inside the second
    transaction."""
    payment = payment_lock(payment_id)
    attempt = attempt_record(payment, SUBMIT_OPERATION, result)
    if attempt.outcome == AttemptOutcome.QUEUED:
        if get_client().withdraws_debits:
            # The backend holds the debit unsent (a bank entry waiting for its file) and guards
            # it itself against a cancel (``debit_withdraw``): the payment may be canceled again.
            payment.submission_started_at = None
            payment.save(update_fields=["submission_started_at", "updated_at"])
        return _SubmissionRecorded(payment, attempt, SubmitOutcome.QUEUED)
    rule = _SUBMIT_RULES.get(attempt.outcome)
    if rule is None:
        return _SubmissionRecorded(payment, attempt, SubmitOutcome.RETRYABLE)
    details = {
        "attempt_number": attempt.attempt_number,
        "http_status": attempt.http_status,
        "error_kind": attempt.error_kind,
        "error": attempt.error,
    }
    fields = ()
    if isinstance(result, DebitAccepted):
        fields = _submission_accepted_note(payment, result, details)
    outcome = _submission_apply(payment, rule, str(attempt.outcome), details, caused_by, fields)
    alert = None
    if attempt.outcome == AttemptOutcome.REJECTED:
        alert = _submission_rejected_alert(payment, attempt, details)
    return _SubmissionRecorded(payment, attempt, outcome, alert)


def _submission_accepted_note(
    payment: Payment, result: DebitAccepted, details: dict
) -> tuple[str, ...]:
    """Keep the processor's id of the debit (the first one it gave) and log what it said; the
    payment's fields this changed, for the caller to save with its move."""
    details["processor_id"] = result.processor_id
    details["processor_status"] = result.status
    if payment.processor_id:
        return ()
    payment.processor_id = result.processor_id
    return ("processor_id",)


def _submission_apply(
    payment: Payment,
    rule: _SubmitRule,
    answer: str,
    details: dict,
    caused_by: str,
    fields: tuple[str, ...] = (),
) -> SubmitOutcome:
    """Move a pending payment as ``rule`` says, log the answer, and say what submission did.
    The payment's ``fields`` changed before are saved with it: its move's UPDATE, or its own."""
    current = payment.state
    if current == PaymentState.PENDING:
        move = transition_move(payment, rule.target)
        row = _submission_log(payment, answer, EventOutcome.APPLIED, current, details, caused_by)
        # The state and the processor's id in one UPDATE; the merchant's event and the audit
        # row in one INSERT.
        move_save(move, fields=fields, rows=(row,))
        transition_count(move)
        transition_announce(row)
        return rule.outcome
    if fields:
        payment.save(update_fields=[*fields, "updated_at"])
    row = _submission_log(payment, answer, EventOutcome.STALE, current, details, caused_by)
    row.save(force_insert=True)
    transition_announce(row)
    return rule.outcome if current in rule.agreeing_states else SubmitOutcome.SKIPPED


def _submission_rejected_alert(payment: Payment, attempt: ProcessorAttempt, details: dict) -> dict:
    """The medium alert of a rejected submission, raised after commit."""
    return {
        "severity": AlertSeverity.MEDIUM,
        "key": "payment.submission_rejected",
        "summary": (
            f"processor rejected payment {payment.id} (HTTP {attempt.http_status}): "
            f"{attempt.error}; payment is {payment.state}"
        ),
        "details": {**details, "response_body": attempt.response_body[:1000]},
        "payment_id": payment.id,
    }


def _submission_log(
    payment: Payment,
    event_type: str,
    outcome: EventOutcome,
    from_state: str,
    details: dict,
    caused_by: str,
) -> PaymentEvent:
    """The submission's audit row, unsaved."""
    return PaymentEvent(
        payment=payment,
        kind=EventKind.SUBMISSION,
        outcome=outcome,
        event_type=event_type,
        from_state=from_state,
        to_state=payment.state,
        payload=details,
        caused_by=caused_by,
    )
