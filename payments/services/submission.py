"""Writes to payments. Each service owns its transaction."""

import enum
import logging
import re
from dataclasses import dataclass
from datetime import date, timedelta
from decimal import Decimal

from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.utils import timezone

from payments import conf as payments_conf
from payments import event_sql
from payments.alerts import AlertSeverity, alert_raise
from payments.events import PAYMENT_DIRECTION, ProcessorEvent, event_target_state
from payments.exceptions import (
    AmountMismatch,
    CurrencyMismatch,
    DirectionMismatch,
    EventConflict,
    EventMismatch,
    InvalidTransition,
    PaymentNotFound,
    ProcessorCircuitOpen,
    ProcessorIdMismatch,
    ProcessorUnavailable,
)
from payments.metrics import TRANSITIONS as TRANSITIONS_TOTAL
from payments.models import (
    STATE_RANK,
    AttemptOutcome,
    BreakerState,
    EventKind,
    EventOutcome,
    LedgerEntry,
    LedgerEntryKind,
    OutboxMessage,
    Payment,
    PaymentEvent,
    PaymentReturn,
    PaymentState,
    ProcessedEvent,
    ProcessorAttempt,
)
from payments.processor.breaker import (
    STATUS_READ,
    SUBMISSION,
    Admission,
    call_outcome,
    max_pause_seconds,
    processor_breaker_admit,
    processor_breaker_record,
    processor_breaker_wait,
)
from payments.processor.client import (
    DebitAccepted,
    DebitStatus,
    ProcessorAuthFailed,
    ProcessorCallRejected,
    ProcessorCallUnavailable,
    get_client,
)
from payments.retention import batched_delete
from payments.return_codes import ReturnCategory, ReturnCode, return_code_get
from payments.signals import (
    outbox_committed,
    payment_transition_committed,
    payment_transitioned,
)

logger = logging.getLogger(__name__)

SUPPORTED_CURRENCIES = ("USD",)
SUBMIT_PAYMENT = "submit_payment"

# (current state, target state) -> the model transition that gets there.
TRANSITIONS = {
    (PaymentState.PENDING, PaymentState.SUBMITTED): "submit",
    (PaymentState.PENDING, PaymentState.FAILED): "reject",
    (PaymentState.SUBMITTED, PaymentState.CONFIRMED): "confirm",
    (PaymentState.SUBMITTED, PaymentState.FAILED): "fail",
    (PaymentState.CONFIRMED, PaymentState.RETURNED): "return_after_settlement",
}
# Processor events may only use these; ``reject`` belongs to a 4xx answer to our submission.
EVENT_TRANSITIONS = {
    (PaymentState.PENDING, PaymentState.SUBMITTED),
    (PaymentState.SUBMITTED, PaymentState.CONFIRMED),
    (PaymentState.SUBMITTED, PaymentState.FAILED),
    (PaymentState.CONFIRMED, PaymentState.RETURNED),
}

_TOKEN_RE = re.compile(r"^[A-Za-z0-9_\-]{8,128}$")
# ABA routing numbers have 9 digits and account numbers 4 to 17: a long digit run means someone
# pasted a bank number instead of the processor's token, or into a free-text field. The rule:
# 8 or more consecutive digits anywhere; or groups of digits joined by single spaces or dashes
# ("0210 0002 1", "021-000-021") holding 8 or more digits together, when the groups stand on
# their own (not glued to letters, as the digit groups of a UUID are). Any script's decimal
# digits count. It also refuses a date written 2026-11-30 (8 digits): write 2026/11/30.
_DIGIT_RUN_RE = re.compile(r"\d{8,}")
_DIGIT_GROUPS_RE = re.compile(r"(?<!\w)(?<!\w-)\d+(?:[ -]\d+)+(?!\w)(?!-\w)")
BANK_NUMBER_MESSAGE = (
    "looks like a raw bank account or routing number (8 or more digits, together or in groups "
    "joined by spaces or dashes); raw bank numbers are never accepted or stored"
)


def looks_like_bank_number(value: str) -> bool:
    if not value:
        return False
    if _DIGIT_RUN_RE.search(value):
        return True
    return any(
        len(match) - match.count(" ") - match.count("-") >= 8
        for match in _DIGIT_GROUPS_RE.findall(value)
    )


def validate_source_token(value: str) -> None:
    if looks_like_bank_number(value):
        raise ValidationError(
            f"{BANK_NUMBER_MESSAGE}: send the processor's token for the account instead",
            code="raw_bank_number",
        )
    if not _TOKEN_RE.match(value or ""):
        raise ValidationError(
            "must be the processor's account token: 8-128 characters of A-Z, a-z, 0-9, _ or -",
            code="invalid_token",
        )


class ApplyOutcome(enum.StrEnum):
    """What applying a processor event did; the values are the event log's (``EventOutcome``)."""

    APPLIED = EventOutcome.APPLIED.value  # the state changed
    # Kept without a state change: a return for a payment that had already failed.
    RECORDED = EventOutcome.RECORDED.value
    STALE = EventOutcome.STALE.value  # the target equals or lies behind the current state
    DUPLICATE = EventOutcome.DUPLICATE.value  # this processor_event_id was processed before


@dataclass(frozen=True)
class ApplyResult:
    outcome: ApplyOutcome
    payment: Payment
    from_state: str
    to_state: str

    @property
    def changed(self) -> bool:
        return self.outcome == ApplyOutcome.APPLIED


def payment_create(
    *,
    merchant_id: str,
    amount: Decimal,
    source_token: str,
    currency: str = "USD",
    description: str = "",
    caused_by: str = "",
) -> Payment:
    """Write the payment (pending, new idempotency key) and its submit command in one transaction.

    The commit is the promise: the outbox row guarantees the submission is published even if
    the queue is down right now.
    """
    if currency not in SUPPORTED_CURRENCIES:
        raise ValidationError({"currency": f"unsupported currency {currency!r}; use USD"})
    if amount <= 0:
        raise ValidationError({"amount": "must be greater than zero"})
    validate_source_token(source_token)
    # Every text field, not only the token: a bank number in a description is stored otherwise.
    bank_numbers = {
        name: BANK_NUMBER_MESSAGE
        for name, value in (("merchant_id", merchant_id), ("description", description))
        if looks_like_bank_number(value)
    }
    if bank_numbers:
        raise ValidationError(bank_numbers)
    with transaction.atomic():
        payment = Payment.objects.create(
            merchant_id=merchant_id,
            amount=amount,
            currency=currency,
            source_token=source_token,
            description=description,
        )
        PaymentEvent.objects.create(
            payment=payment,
            kind=EventKind.CREATED,
            outcome=EventOutcome.APPLIED,
            to_state=payment.state,
            payload={"amount": f"{amount:.2f}", "currency": currency, "merchant_id": merchant_id},
            caused_by=caused_by,
        )
        outbox_enqueue(
            kind=SUBMIT_PAYMENT,
            group_id=str(payment.id),
            body={"kind": SUBMIT_PAYMENT, "payment_id": str(payment.id)},
        )
    return payment


def outbox_enqueue(*, kind: str, group_id: str, body: dict) -> OutboxMessage:
    """Add a message to the outbox inside the caller's transaction; announce it after commit."""
    message = OutboxMessage.objects.create(kind=kind, group_id=group_id, body=body)
    transaction.on_commit(
        lambda: outbox_committed.send(sender=OutboxMessage, message_ids=[message.id]),
        robust=True,
    )
    return message


@dataclass(frozen=True, kw_only=True)
class _Move:
    """A transition made in memory, and the rows it writes besides the payment (unsaved)."""

    from_state: str
    to_state: str
    ledger: LedgerEntry | None = None
    debits_day: date | None = None  # the merchant's day counting one more settled debit


def payment_transition(*, payment: Payment, target: str) -> tuple[str, str]:
    """Move a payment locked by the caller to ``target`` and save it; return (from, to).

    Call inside ``transaction.atomic()`` on a row fetched with ``select_for_update()``.
    Confirmation writes the merchant's credit, a return after settlement its reversal (a debit
    of the same amount); both count in the merchant's daily return-rate counters.
    """
    move = _transition_move(payment, target)
    _move_save(payment, move)
    _transition_count(move)
    return move.from_state, move.to_state


def _transition_move(payment: Payment, target: str) -> _Move:
    """Run the state machine's transition to ``target`` on ``payment`` (in memory only) and
    build the ledger row it writes: a credit on confirmation, its reversal on a return."""
    current = payment.state
    name = TRANSITIONS.get((current, target))
    if name is None:
        raise InvalidTransition(
            f"no transition from {current} to {target} for payment {payment.id}"
        )
    getattr(payment, name)()
    payment.state_changed_at = timezone.now()
    entry = {"payment": payment, "merchant_id": payment.merchant_id, "currency": payment.currency}
    if target == PaymentState.CONFIRMED:
        return _Move(
            from_state=current,
            to_state=target,
            ledger=LedgerEntry(kind=LedgerEntryKind.CREDIT, amount=payment.amount, **entry),
            debits_day=payment.state_changed_at.date(),
        )
    if target == PaymentState.RETURNED:
        return _Move(
            from_state=current,
            to_state=target,
            ledger=LedgerEntry(kind=LedgerEntryKind.REVERSAL, amount=-payment.amount, **entry),
        )
    return _Move(from_state=current, to_state=target)


def _move_save(payment: Payment, move: _Move) -> None:
    """Save a transition made in memory: the payment's state and the rows the move writes."""
    payment.save(update_fields=["state", "state_changed_at", "updated_at"])
    if move.ledger is not None:
        move.ledger.save()
    if move.debits_day is not None:
        merchant_return_day_add(merchant_id=payment.merchant_id, day=move.debits_day, debits=1)


def _transition_count(move: _Move) -> None:
    transaction.on_commit(
        lambda: TRANSITIONS_TOTAL.labels(move.from_state, move.to_state).inc(), robust=True
    )


def merchant_return_day_add(
    *,
    merchant_id: str,
    day,
    debits: int = 0,
    returns: int = 0,
    unauthorized_returns: int = 0,
    administrative_returns: int = 0,
) -> None:
    """Add to the merchant's counters of ``day`` inside the caller's transaction.

    One ``INSERT ... ON CONFLICT DO UPDATE`` adding to the stored values: two transitions of the
    same merchant committing at once both count, without a read-modify-write race.
    """
    values = (debits, returns, unauthorized_returns, administrative_returns)
    with connection.cursor() as cursor:
        cursor.execute(
            event_sql.merchant_day_add_sql("VALUES (%s, %s, %s, %s, %s, %s)"),
            [merchant_id, day, *values],
        )


def payment_apply_event(*, event: ProcessorEvent, caused_by: str = "") -> ApplyResult:
    """Apply one processor event exactly once, under a row lock on the payment.

    Outcomes: applied (state changed), stale (target equals or lies behind the current state),
    duplicate (this processor_event_id was processed before with the same payload). Raises
    ``EventConflict`` for a known id with another payload, ``AmountMismatch``,
    ``InvalidTransition`` (no valid transition and not stale) and ``PaymentNotFound``; nothing is
    written then, and the caller records the error. A repeat is a duplicate before it is
    anything else: a refused event whose id was processed before is judged as a repeat.

    The state machine decides in memory; then the dedup record is claimed with ``INSERT ... ON
    CONFLICT DO NOTHING`` and everything else is written only if that claim inserted it (on
    PostgreSQL in the same statement, ``payments.event_sql``): the unique key decides whether
    this is the first time the event is seen (a concurrent claim for another payment waits on
    the key and then finds it taken).
    """
    with transaction.atomic():
        try:
            payment = event_sql.payment_locked(event.payment_id)
        except Payment.DoesNotExist:
            raise PaymentNotFound(f"payment {event.payment_id} does not exist") from None
        current = payment.state
        settled_at = payment.state_changed_at if current == PaymentState.CONFIRMED else None
        target = event_target_state(event.event_type, current)
        stale = target == current or STATE_RANK[target] < STATE_RANK[current]
        recorded = stale and _return_after_failure(event, payment)
        refusal = _apply_refusal(event, payment, target, stale=stale)
        if refusal is None:
            move = None if stale else _transition_move(payment, target)
            if recorded:
                outcome = ApplyOutcome.RECORDED
            else:
                outcome = ApplyOutcome.STALE if stale else ApplyOutcome.APPLIED
            log = _event_row(
                payment, event, outcome, current, move.to_state if move else current, caused_by
            )
            if _event_rows_write(payment, event, move, log):
                if move is not None:
                    _transition_count(move)
                if event.event_type == "returned" and (recorded or not stale):
                    _return_record(
                        payment=payment, event=event, settled_at=settled_at, after_failure=recorded
                    )
                _transition_announce(log)
                return ApplyResult(log.outcome, payment, current, log.to_state)
            if move is not None:  # nothing was written: the event was claimed before
                payment.refresh_from_db(fields=["state", "state_changed_at", "updated_at"])
        return _apply_repeat(event, payment, caused_by, refusal)


def _return_after_failure(event: ProcessorEvent, payment: Payment) -> bool:
    """A return for a payment that failed (rejected with a 4xx, or a ``failed`` event) and has
    no return recorded yet: the debit reached the network after all. It is recorded and counted
    like any return, though the state stays ``failed`` and there is no credit to reverse. A
    failed payment that has its return (it failed *by* a return, or one was recorded after the
    failure) takes a second one with a new id as stale, as a returned payment does."""
    return (
        event.event_type == "returned"
        and payment.state == PaymentState.FAILED
        and not PaymentReturn.objects.filter(payment=payment).exists()
    )


def _event_mismatch(event: ProcessorEvent, payment: Payment) -> EventMismatch | None:
    """The first field of the payment the event restates with another value (see
    ``payments.events.RESTATED_FIELDS`` for which fields, and why the others are not)."""
    what = f"{event.event_type} event {event.processor_event_id}"
    if event.amount != payment.amount:
        return AmountMismatch(
            f"{what} reports {event.amount} but payment {payment.id} is for {payment.amount}"
        )
    if event.currency and event.currency != payment.currency:
        return CurrencyMismatch(
            f"{what} reports currency {event.currency} but payment {payment.id} is in "
            f"{payment.currency}"
        )
    if event.direction and event.direction != PAYMENT_DIRECTION:
        return DirectionMismatch(
            f"{what} reports a {event.direction} but payment {payment.id} is a {PAYMENT_DIRECTION}"
        )
    if event.processor_id and payment.processor_id and event.processor_id != payment.processor_id:
        return ProcessorIdMismatch(
            f"{what} names the processor's debit {event.processor_id[:128]!r} but payment "
            f"{payment.id} is the processor's {payment.processor_id!r}"
        )
    return None


def _apply_refusal(
    event: ProcessorEvent, payment: Payment, target: str, *, stale: bool
) -> EventMismatch | InvalidTransition | None:
    """Why ``event`` cannot be applied to the locked ``payment``, if it cannot. Checked before
    anything is written, so both write paths (one statement or statement by statement) refuse
    alike, stale events and recorded returns included."""
    mismatch = _event_mismatch(event, payment)
    if mismatch is not None:
        return mismatch
    if not stale and (payment.state, target) not in EVENT_TRANSITIONS:
        return InvalidTransition(
            f"{event.event_type} event {event.processor_event_id} cannot move payment "
            f"{payment.id} from {payment.state} to {target}"
        )
    return None


def _event_rows_write(
    payment: Payment, event: ProcessorEvent, move: _Move | None, log: PaymentEvent
) -> bool:
    """Claim the event's dedup record and, only if it is new, write the move and ``log``.
    True when written; False (nothing written) when the id was processed before."""
    claim = ProcessedEvent(
        processor_event_id=event.processor_event_id,
        payment=payment,
        event_type=event.event_type,
        payload_hash=event.fingerprint,
        outcome=log.outcome,
    )
    if _event_rows_in_one_statement():
        return event_sql.event_rows_insert(
            claim=claim,
            log=log,
            payment=payment if move else None,
            ledger=move.ledger if move else None,
            debits_day=move.debits_day if move else None,
        )
    if not event_sql.processed_event_claim(claim):
        return False
    if move is not None:
        _move_save(payment, move)
    log.save()
    return True


def _event_rows_in_one_statement() -> bool:
    """PostgreSQL writes an event's rows in one statement; other databases (the quick start's
    SQLite) statement by statement, in the same order and under the same claim."""
    return connection.vendor == "postgresql"


def _apply_repeat(
    event: ProcessorEvent,
    payment: Payment,
    caused_by: str,
    refusal: EventMismatch | InvalidTransition | None,
) -> ApplyResult:
    """The event's id was processed before, or the event was refused: the same payload again
    is logged as a duplicate, another payload under a known id is a conflict; an unknown id
    keeps its refusal."""
    try:
        seen = ProcessedEvent.objects.get(pk=event.processor_event_id)
    except ProcessedEvent.DoesNotExist:
        if refusal is None:
            raise
        raise refusal from None
    if seen.payload_hash != event.fingerprint or seen.payment_id != payment.id:
        raise EventConflict(
            f"processor_event_id {event.processor_event_id} was processed before with a "
            f"different payload (first seen {seen.processed_at.isoformat()} as "
            f"{seen.event_type} for payment {seen.payment_id})"
        )
    current = payment.state
    log = _event_row(payment, event, ApplyOutcome.DUPLICATE, current, current, caused_by)
    log.save()
    _transition_announce(log)
    return ApplyResult(ApplyOutcome.DUPLICATE, payment, current, current)


def _return_record(
    *, payment: Payment, event: ProcessorEvent, settled_at, after_failure: bool = False
) -> PaymentReturn:
    """Record the return with its reason code, count it, and flag what a human should see.

    Called in the transaction that applied (or, after a failure, recorded) the return. Nothing
    here refuses a return: the money has already gone back to the customer, so an unknown code,
    a late return or a return for a payment we had as failed is kept and flagged (medium alert
    after commit), never dropped.
    """
    code = return_code_get(event.reason_code)
    after_settlement = settled_at is not None
    deadline = code.deadline(settled_at) if code is not None and after_settlement else None
    record = PaymentReturn.objects.create(
        payment=payment,
        merchant_id=payment.merchant_id,
        processor_event_id=event.processor_event_id,
        reason_code=code.code if code is not None else event.reason_code[:16],
        reason_title=code.title if code is not None else "",
        category=code.category if code is not None else "",
        after_settlement=after_settlement,
        settled_at=settled_at,
        returned_at=event.timestamp,
        deadline=deadline,
        unknown_code=code is None,
        late=deadline is not None and event.timestamp > deadline,
        after_failure=after_failure,
    )
    _return_count(payment, code, after_settlement=after_settlement)
    details = {
        "reason_code": record.reason_code,
        "processor_event_id": event.processor_event_id,
        "after_settlement": after_settlement,
        "after_failure": after_failure,
        "flags": record.flags,
    }
    for alert in _return_alerts(record, code, event):
        transaction.on_commit(
            lambda alert=alert: alert_raise(
                severity=AlertSeverity.MEDIUM, details=details, payment_id=payment.id, **alert
            ),
            robust=True,
        )
    return record


def _return_count(payment: Payment, code: ReturnCode | None, *, after_settlement: bool) -> None:
    """Add the return to the merchant's counters of today, by category.

    NACHA's rates count the entries the receiving banks returned, whatever the originator's
    books say about them, so every return counts the same in whatever state it finds the
    payment: in ``returns`` (the overall rate, unknown codes included), and in its category
    (R05/R07/R10/R11/R29/R51 unauthorized, R02-R04 administrative). A return after our failure
    (a 4xx rejection, a ``failed`` event) is no exception: the bank returned the entry, so it
    was originated, and an R10 there is as unauthorized as after settlement.
    """
    category = code.category if code is not None else None
    merchant_return_day_add(
        merchant_id=payment.merchant_id,
        day=timezone.now().date(),
        # A debit returned before it settled (or after it failed) was never counted as settled:
        # it counts here, once, as the entry the network answered.
        debits=0 if after_settlement else 1,
        returns=1,
        unauthorized_returns=int(category == ReturnCategory.UNAUTHORIZED),
        administrative_returns=int(category == ReturnCategory.ADMINISTRATIVE),
    )


def _return_alerts(
    record: PaymentReturn, code: ReturnCode | None, event: ProcessorEvent
) -> list[dict]:
    """The alerts (key and summary) a late return or an unknown reason code calls for."""
    payment = record.payment
    alerts = []
    if record.after_failure:
        alerts.append(
            {
                "key": f"payment.return_after_failure:{payment.id}",
                "summary": (
                    f"return {record.reason_code or '(no code)'} for payment {payment.id} of "
                    f"{payment.merchant_id}, which had failed: the processor sent the debit to "
                    "the network after all; recorded and counted in the return rates, no credit "
                    "to reverse; check the debit with the processor"
                ),
            }
        )
    if record.late:
        alerts.append(
            {
                "key": f"payment.late_return:{payment.id}",
                "summary": (
                    f"late return {record.reason_code} for payment {payment.id} of "
                    f"{payment.merchant_id}: returned {event.timestamp.isoformat()}, due by "
                    f"{record.deadline.isoformat()} ({code.time_frame} after settlement at "
                    f"{record.settled_at.isoformat()}); applied and reversed, a dishonor may be "
                    "possible"
                ),
            }
        )
    if code is None:
        alerts.append(
            {
                "key": f"payment.return_unknown_code:{payment.id}",
                "summary": (
                    f"return for payment {payment.id} of {payment.merchant_id} carries "
                    f"reason code {event.reason_code!r}, which is not a NACHA return code; "
                    "applied, check it with the processor"
                ),
            }
        )
    return alerts


def _event_row(
    payment: Payment,
    event: ProcessorEvent,
    outcome: ApplyOutcome,
    from_state: str,
    to_state: str,
    caused_by: str,
) -> PaymentEvent:
    """The event-log row of a processor event (unsaved)."""
    return PaymentEvent(
        payment=payment,
        kind=EventKind.PROCESSOR_EVENT,
        outcome=outcome,
        event_type=event.event_type,
        processor_event_id=event.processor_event_id,
        from_state=from_state,
        to_state=to_state,
        payload=event.raw or event.as_payload(),
        caused_by=caused_by,
    )


def processed_events_purge(
    *, older_than: timedelta | None = None, batch_size: int | None = None
) -> int:
    """Delete dedup records past their retention, in batches; returns how many went.

    Safe to forget: a redelivery of an event whose record is gone finds its payment already in
    (or past) the event's state and is recorded as stale, never applied twice."""
    cutoff = timezone.now() - (older_than or payments_conf.PROCESSED_EVENT_RETENTION)
    return batched_delete(
        ProcessedEvent.objects.filter(processed_at__lt=cutoff),
        order_by="processed_at",  # indexed; the key (the processor's id) is in random order
        batch_size=batch_size,
    )


# --- Submission to the processor -------------------------------------------------------------

# ProcessorAttempt.operation: the breaker judges the processor by its submissions.
SUBMIT_OPERATION = SUBMISSION
STATUS_OPERATION = STATUS_READ


class SubmitOutcome(enum.StrEnum):
    """What a submission did; the values are the words logs, metrics and queue records use."""

    SUBMITTED = "submitted"
    REJECTED = "rejected"
    SKIPPED = "skipped"
    RETRYABLE = "retryable"  # never returned: ``ProcessorUnavailable`` is raised instead


@dataclass(frozen=True)
class SubmitResult:
    outcome: SubmitOutcome  # submitted, rejected or skipped
    payment: Payment


@dataclass(frozen=True)
class StatusCheckResult:
    found: bool  # False: the processor has no debit under the payment's idempotency key
    processor_status: str  # the processor's word for it ("submitted", "settled", "returned")
    processor_id: str
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
    row and checks the payment is pending; the call runs outside any transaction; a second short
    transaction locks the row again, records the attempt and applies the outcome. Whatever the
    outcome, the attempt row is committed before anything is raised.

    Accepted -> ``submitted``; rejected (4xx) -> ``failed`` and a medium alert; retryable ->
    state unchanged and ``ProcessorUnavailable`` (with ``retry_after`` when the processor gave
    one). A payment that is not pending is skipped: it is never submitted again. Two workers may
    submit the same pending payment at once; the processor charges the key once, and the second
    one to record sees the state the first one left (see ``_SUBMIT_RULES``).
    """
    with transaction.atomic():
        payment = _payment_lock(payment_id)
        if payment.state != PaymentState.PENDING:
            logger.info(
                "payment %s is %s, not pending: not submitted",
                payment.id,
                payment.state,
                extra={"payment_id": str(payment.id)},
            )
            return SubmitResult(SubmitOutcome.SKIPPED, payment)

    admission = _breaker_admit(payment, SUBMIT_OPERATION)
    result = _debit_create(payment)
    with transaction.atomic():
        recorded = _submission_record(payment_id, result, caused_by)
    # After commit: the attempt and the state change are durable before anyone hears of them.
    payment, attempt = recorded.payment, recorded.attempt
    if recorded.alert is not None:
        alert_raise(**recorded.alert)
    if isinstance(result, ProcessorAuthFailed):
        _alert_auth_failed(payment, attempt)
    _log_attempt(payment, attempt, recorded.outcome)
    _breaker_record(admission, payment, attempt, result)
    if recorded.outcome == SubmitOutcome.RETRYABLE:
        raise ProcessorUnavailable(
            f"payment {payment.id} attempt {attempt.attempt_number}: {result}",
            retry_after=attempt.retry_after_seconds,
        ) from result
    return SubmitResult(recorded.outcome, payment)


def _debit_create(
    payment: Payment,
) -> DebitAccepted | ProcessorCallRejected | ProcessorCallUnavailable:
    """The HTTP call of a submission, outside any transaction; a failure is returned, not
    raised, so the attempt is recorded before anything else happens."""
    try:
        return get_client().debit_create(
            idempotency_key=payment.idempotency_key,
            payment_id=payment.id,
            amount=payment.amount,
            currency=payment.currency,
            source_token=payment.source_token,
        )
    except (ProcessorCallRejected, ProcessorCallUnavailable) as exc:
        return exc


def _submission_record(payment_id, result, caused_by: str) -> _SubmissionRecorded:
    """Record the attempt and apply the answer; call inside the second transaction."""
    payment = _payment_lock(payment_id)
    attempt = _attempt_record(payment, SUBMIT_OPERATION, result)
    rule = _SUBMIT_RULES.get(attempt.outcome)
    if rule is None:
        return _SubmissionRecorded(payment, attempt, SubmitOutcome.RETRYABLE)
    details = {
        "attempt_number": attempt.attempt_number,
        "http_status": attempt.http_status,
        "error_kind": attempt.error_kind,
        "error": attempt.error,
    }
    if isinstance(result, DebitAccepted):
        _submission_accepted_note(payment, result, details)
    outcome = _submission_apply(payment, rule, str(attempt.outcome), details, caused_by)
    alert = None
    if attempt.outcome == AttemptOutcome.REJECTED:
        alert = _submission_rejected_alert(payment, attempt, details)
    return _SubmissionRecorded(payment, attempt, outcome, alert)


def _submission_accepted_note(payment: Payment, result: DebitAccepted, details: dict) -> None:
    """Keep the processor's id of the debit (the first one it gave) and log what it said."""
    details["processor_id"] = result.processor_id
    details["processor_status"] = result.status
    if not payment.processor_id:
        payment.processor_id = result.processor_id
        payment.save(update_fields=["processor_id", "updated_at"])


def _submission_apply(
    payment: Payment, rule: _SubmitRule, answer: str, details: dict, caused_by: str
) -> SubmitOutcome:
    """Move a pending payment as ``rule`` says, log the answer, and say what submission did."""
    current = payment.state
    if current == PaymentState.PENDING:
        payment_transition(payment=payment, target=rule.target)
        _log_submission(payment, answer, EventOutcome.APPLIED, current, details, caused_by)
        return rule.outcome
    _log_submission(payment, answer, EventOutcome.STALE, current, details, caused_by)
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


def payment_status_check(*, payment_id) -> StatusCheckResult:
    """Ask the processor what it knows of the payment's debit, by idempotency key.

    Read-only towards the payment (reconciliation decides what to do with the answer); leaves an
    attempt row with operation ``status``. Raises ``ProcessorUnavailable`` (retryable) or
    ``ProcessorRejected`` (the processor refused the question, e.g. a wrong API key) after the
    attempt row is committed.
    """
    try:
        payment = Payment.objects.get(pk=payment_id)
    except (Payment.DoesNotExist, ValidationError):
        raise PaymentNotFound(f"payment {payment_id} does not exist") from None
    admission = _breaker_admit(payment, STATUS_OPERATION)
    result: DebitStatus | ProcessorCallRejected | ProcessorCallUnavailable
    try:
        result = get_client().debit_get(idempotency_key=payment.idempotency_key)
    except (ProcessorCallRejected, ProcessorCallUnavailable) as exc:
        result = exc
    with transaction.atomic():
        payment = _payment_lock(payment_id)
        attempt = _attempt_record(payment, STATUS_OPERATION, result)
    _log_attempt(payment, attempt, attempt.outcome)
    if isinstance(result, ProcessorAuthFailed):
        _alert_auth_failed(payment, attempt)
    _breaker_record(admission, payment, attempt, result)
    if isinstance(result, Exception):
        raise result
    return StatusCheckResult(
        found=result.found,
        processor_status=result.status,
        processor_id=result.processor_id,
        payment=payment,
    )


def _breaker_admit(payment: Payment, operation: str) -> Admission:
    """Ask the processor's circuit breaker for a call; no call and no attempt row when it is
    open or paused (``ProcessorCircuitOpen``: the caller waits without spending an attempt)."""
    admission = processor_breaker_admit(operation=operation)
    if not admission.allowed:
        what = "submission" if operation == SUBMIT_OPERATION else "status check"
        raise ProcessorCircuitOpen(
            f"payment {payment.id}: {what} not attempted: {admission.reason}",
            retry_after=admission.wait_seconds,
            breaker_open=admission.state != BreakerState.CLOSED,
        )
    return admission


def _breaker_record(
    admission: Admission,
    payment: Payment,
    attempt: ProcessorAttempt,
    result,
) -> None:
    """Tell the breaker what the call said about the processor. A failure that finds the
    breaker open (this call opened it, or a trial call failed) or a 429 pause is raised as
    ``ProcessorCircuitOpen``: the processor is down or busy as a whole, so the message does not
    pay an attempt for it."""
    failed = isinstance(result, ProcessorCallUnavailable)
    state = processor_breaker_record(
        admission=admission,
        outcome=call_outcome(
            http_status=attempt.http_status,
            retryable=failed,
            accepted=not isinstance(result, Exception),
        ),
        operation=attempt.operation,
        error=attempt.error,
        retry_after=attempt.retry_after_seconds,
        http_status=attempt.http_status,
    )
    if not failed:
        return
    after = processor_breaker_wait(
        operation=attempt.operation
    )  # includes a 429's pause (capped by the breaker)
    paused = attempt.http_status == 429
    if not paused and (state == BreakerState.CLOSED or attempt.http_status == 409):
        return
    wait = after.wait_seconds
    if paused and attempt.retry_after_seconds is not None:
        wait = max(wait, min(attempt.retry_after_seconds, max_pause_seconds()))
    raise ProcessorCircuitOpen(
        f"payment {payment.id} attempt {attempt.attempt_number}: {result}; "
        f"{after.reason or 'calls paused'}",
        retry_after=wait,
        called=True,
        breaker_open=state != BreakerState.CLOSED,
    ) from result


def _alert_auth_failed(payment: Payment, attempt: ProcessorAttempt) -> None:
    alert_raise(
        severity=AlertSeverity.HIGH,
        key="processor.auth_failed",
        summary=(
            f"the processor refused our credentials (HTTP {attempt.http_status}) on the "
            f"{attempt.operation} call for payment {payment.id}: check PROCESSOR_API_KEY; the "
            "payment stays as it was and is retried"
        ),
        details={"http_status": attempt.http_status, "error": attempt.error},
        payment_id=payment.id,
    )


def _payment_lock(payment_id) -> Payment:
    try:
        return Payment.objects.select_for_update().get(pk=payment_id)
    except Payment.DoesNotExist:
        raise PaymentNotFound(f"payment {payment_id} does not exist") from None
    except ValidationError:
        raise PaymentNotFound(f"payment id {payment_id!r} is not a valid UUID") from None


def _attempt_record(payment: Payment, operation: str, result) -> ProcessorAttempt:
    """Write the attempt row; the caller holds the payment's row lock, so the number is safe."""
    if isinstance(result, ProcessorCallRejected):
        outcome = AttemptOutcome.REJECTED
    elif isinstance(result, ProcessorCallUnavailable):
        outcome = AttemptOutcome.RETRYABLE
    else:
        outcome = AttemptOutcome.ACCEPTED
    call = result.call
    number = ProcessorAttempt.objects.filter(payment=payment, operation=operation).count() + 1
    return ProcessorAttempt.objects.create(
        payment=payment,
        attempt_number=number,
        operation=operation,
        idempotency_key=payment.idempotency_key,
        outcome=outcome,
        http_status=call.http_status,
        error_kind=call.error_kind,
        error=call.error,
        response_body=call.response_body,
        latency_ms=call.latency_ms,
        retry_after_seconds=call.retry_after,
        started_at=call.started_at,
    )


def _log_submission(
    payment: Payment,
    event_type: str,
    outcome: EventOutcome,
    from_state: str,
    details: dict,
    caused_by: str,
) -> None:
    row = PaymentEvent.objects.create(
        payment=payment,
        kind=EventKind.SUBMISSION,
        outcome=outcome,
        event_type=event_type,
        from_state=from_state,
        to_state=payment.state,
        payload=details,
        caused_by=caused_by,
    )
    _transition_announce(row)


def _transition_announce(row: PaymentEvent) -> None:
    """Tell the host about a state change recorded by ``row``, inside the transaction and after
    its commit (see ``payments.signals``). Not robust on purpose: a receiver's error rolls the
    transition back with it, so the host's rows and ours never disagree."""
    if row.outcome != EventOutcome.APPLIED or row.from_state == row.to_state:
        return
    signal_args = {
        "payment": row.payment,
        "from_state": row.from_state,
        "to_state": row.to_state,
        "event": row,
    }
    payment_transitioned.send(sender=Payment, **signal_args)
    transaction.on_commit(lambda: _transition_committed_send(signal_args), robust=True)


def _transition_committed_send(signal_args: dict) -> None:
    for receiver, result in payment_transition_committed.send_robust(sender=Payment, **signal_args):
        if isinstance(result, Exception):
            logger.error(
                "payment_transition_committed receiver %r failed for payment %s: %r",
                receiver,
                signal_args["payment"].pk,
                result,
                exc_info=result,
                extra={"payment_id": str(signal_args["payment"].pk)},
            )


def _log_attempt(
    payment: Payment, attempt: ProcessorAttempt, outcome: SubmitOutcome | AttemptOutcome
) -> None:
    logger.info(
        "processor %s attempt %s for payment %s: %s (%s) in %.0f ms -> %s",
        attempt.operation,
        attempt.attempt_number,
        payment.id,
        attempt.outcome,
        attempt.http_status or attempt.error_kind,
        attempt.latency_ms,
        outcome,
        extra={"payment_id": str(payment.id)},
    )
