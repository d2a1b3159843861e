"""Account validation before the first WEB debit (NACHA's rule), and the debits it holds.

One ``AccountValidation`` row per account token moves ``unvalidated -> pending -> validated |
failed`` under its row lock, by a method of ``payments.validation_methods``. A debit of a class
``PAYMENTS["ACCOUNT_VALIDATION_REQUIRED"]`` names, from an account that is not validated, is
refused (``AccountNotValidated``, 409 ``account_not_validated``) or, with
``PAYMENTS["UNVALIDATED_WEB_DEBITS"] = "hold"``, created held (``review_status =
validation``, no submit command). The validation's end decides each held debit once, in its
own transaction under the payment's lock: validated, its submit command is enqueued; failed,
the payment fails with the reason. A reinitiation is not a first use of the account: the rule
does not hold it back.

A change of the account's number (a NOC C01, C03, C06 or C07, recorded or applied) makes it a
new account: its row goes back to ``unvalidated``, and debits held on it stay held. The create's
check and the NOC's reset live in ``payments.services.validation_rule``, which the create path
and the NOCs import without this lifecycle.
"""

from __future__ import annotations

import hmac
import logging
import re
from datetime import date, datetime, timedelta
from decimal import Decimal

from django.db import IntegrityError, transaction
from django.utils import timezone

from payments import conf as payments_conf
from payments.exceptions import AmountsInvalid, ValidationRefused
from payments.messages import MessageKind, submit_payment_body
from payments.models import (
    AccountValidation,
    EventKind,
    EventOutcome,
    Payment,
    PaymentDirection,
    PaymentEvent,
    PaymentState,
    ReviewStatus,
    ValidationMethod,
    ValidationState,
)
from payments.processor.backend import get_backend
from payments.services.create import outbox_enqueue
from payments.services.transitions import payment_transition, transition_announce
from payments.services.validation_rule import THEN_REVIEW
from payments.validation_methods import (
    Outcome,
    method_for,
    micro_entries_digest,
    prenote_live_from,
)
from payments.webhooks.catalogue import ACCOUNT_VALIDATED, ACCOUNT_VALIDATION_FAILED
from payments.webhooks.events import event_record, validation_shape

logger = logging.getLogger(__name__)

# The event log's words for a held debit's end.
RELEASED_EVENT = "account_validated"
FAILED_EVENT = "account_validation_failed"
# Every rule a refusal names, as the error envelope's code (409): a start's, a verification's.
START_RULES = (
    "validation_method_unavailable",
    "account_validation_in_progress",
    "account_already_validated",
)
VERIFY_RULES = ("micro_entries_mismatch", "micro_entries_expired", "validation_not_verifiable")
RULES = START_RULES + VERIFY_RULES
EXPIRED_REASON = "the micro-entries expired unverified"
UNSENT_REASON = "a micro-entry credit failed and was not sent"
# A micro-entry amount as the receiver reads it from the statement: 0.01 to 0.99, two decimals.
_AMOUNT_RE = re.compile(r"0\.[0-9]{2}", re.ASCII)


def account_validation_of_merchant(*, account_token: str, merchant_id: str):
    """The account's validation row if it is ``merchant_id``'s, else None (another merchant's
    and a made-up token alike)."""
    return AccountValidation.objects.filter(
        account_token=account_token, merchant_id=merchant_id
    ).first()


def account_validation_start(
    *, account_token: str, merchant_id: str, method: str, now: datetime | None = None
) -> AccountValidation:
    """Start validating the account by ``method``: its row created (or taken again after a
    failure or a change of number) and moved to ``pending``, then the method's network part
    outside the transaction, and its answer recorded. ``ValidationRefused`` naming the rule:
    ``validation_method_unavailable``, ``account_validation_in_progress``,
    ``account_already_validated``; ``LookupError`` for another merchant's token."""
    now = now or timezone.now()
    handler = method_for(method)
    if problem := handler.unavailable(get_backend()):
        raise ValidationRefused("validation_method_unavailable", problem, param="method")
    _row_ensure(account_token=account_token, merchant_id=merchant_id)
    with transaction.atomic():
        validation = _lock(account_token)
        if validation.merchant_id != merchant_id:
            raise LookupError(account_token)
        if validation.state == ValidationState.VALIDATED:
            raise ValidationRefused("account_already_validated", "the account is validated already")
        if validation.state == ValidationState.PENDING:
            raise ValidationRefused(
                "account_validation_in_progress",
                f"a validation by {validation.method} is under way",
            )
        # The evidence of the account's earlier rounds is kept, the newest last.
        earlier = _earlier_rounds(validation)
        earlier_nocs = validation.evidence.get("nocs")
        validation.start()
        validation.method = method
        validation.attempts = 0
        validation.retry_at = None
        validation.secret_digest = ""
        validation.failure_reason = ""
        validation.started_at = now
        validation.validated_at = validation.failed_at = None
        handler.begin(validation, now=now)
        if earlier_nocs:
            # The account's changes of number stay on its record across validations.
            validation.evidence["nocs"] = earlier_nocs
        if earlier:
            validation.evidence["earlier"] = earlier
        validation.save()
    logger.info(
        "account validation %s started by %s",
        validation.id,
        method,
        extra={"merchant_id": merchant_id},
    )
    outcome = handler.after_commit(validation)
    if outcome is not None:
        validation = _outcome_record(validation.id, outcome, method=method)
    return validation


# How many earlier rounds an account's evidence keeps (the newest).
EARLIER_ROUNDS_KEPT = 20


def _earlier_rounds(validation: AccountValidation) -> list[dict]:
    """The rounds the (locked) validation's evidence keeps, with the one about to be replaced
    (its method, how it ended and its evidence) appended."""
    earlier = list(validation.evidence.get("earlier", []))
    if not validation.method:
        return earlier
    ended = validation.validated_at or validation.failed_at
    earlier.append(
        {
            "method": validation.method,
            "state": validation.state,
            "started_at": validation.started_at.isoformat() if validation.started_at else None,
            "ended_at": ended.isoformat() if ended else None,
            "failure_reason": validation.failure_reason,
            "evidence": {
                key: value
                for key, value in validation.evidence.items()
                if key not in ("nocs", "earlier")
            },
        }
    )
    return earlier[-EARLIER_ROUNDS_KEPT:]


def _row_ensure(*, account_token: str, merchant_id: str) -> None:
    if AccountValidation.objects.filter(account_token=account_token).exists():
        return
    try:
        with transaction.atomic():
            AccountValidation.objects.create(account_token=account_token, merchant_id=merchant_id)
    except IntegrityError:
        pass  # another start made it: its merchant is checked under the lock


def _lock(account_token: str) -> AccountValidation:
    return AccountValidation.objects.select_for_update().get(account_token=account_token)


def _outcome_record(
    validation_id: int, outcome: Outcome, *, method: str, now: datetime | None = None
) -> AccountValidation:
    """A method's answer: a service's yes or no, or no answer yet (``outcome.retry``: asked
    again later, at most ``SERVICE_MAX_TRIES`` times)."""
    with transaction.atomic():
        validation = AccountValidation.objects.select_for_update().get(pk=validation_id)
        if validation.state != ValidationState.PENDING or validation.method != method:
            return validation
        if outcome.retry:
            _service_retry_schedule(validation, outcome.reason, now=now or timezone.now())
            return validation
        evidence = dict(validation.evidence)
        evidence["answer"] = {**evidence.get("answer", {}), **outcome.evidence}
        validation.evidence = evidence
        _complete(validation, validated=outcome.validated, reason=outcome.reason)
    return validation


# A validation service that cannot answer (connection, timeout, 5xx) is asked this many times
# in all, the waits between doubling from the base, before the validation fails.
SERVICE_MAX_TRIES = 5
SERVICE_RETRY_BASE = timedelta(minutes=1)
# A retry claimed by a round is not due again for this long (a round that died mid-call).
SERVICE_RETRY_CLAIM = timedelta(minutes=5)


def _service_retry_schedule(validation: AccountValidation, reason: str, *, now: datetime) -> None:
    """One more try of the (locked, pending) validation's service failed for a reason that may
    pass: ask again later, or, at the last try, fail it with the reason."""
    validation.attempts += 1
    tries = list(validation.evidence.get("unavailable", []))
    tries.append({"at": now.isoformat(), "reason": reason})
    validation.evidence = {**validation.evidence, "unavailable": tries[-SERVICE_MAX_TRIES:]}
    if validation.attempts >= SERVICE_MAX_TRIES:
        _complete(
            validation,
            validated=False,
            reason=f"no answer after {validation.attempts} tries: {reason}",
        )
        return
    validation.retry_at = now + SERVICE_RETRY_BASE * 2 ** (validation.attempts - 1)
    validation.save(update_fields=["attempts", "retry_at", "evidence", "updated_at"])


def service_validations_retry(*, now: datetime | None = None, limit: int = 100) -> int:
    """Ask the validation service again about each pending validation whose retry is due; how
    many ended. Each is claimed under its row lock (its ``retry_at`` moved on) before the call,
    which is made outside any transaction, and its answer recorded as the first one is."""
    now = now or timezone.now()
    due = list(
        AccountValidation.objects.filter(
            method=ValidationMethod.SERVICE, state=ValidationState.PENDING, retry_at__lte=now
        )
        .order_by("retry_at")
        .values_list("pk", flat=True)[:limit]
    )
    handler = method_for(ValidationMethod.SERVICE)
    ended = 0
    for pk in due:
        with transaction.atomic():
            validation = AccountValidation.objects.select_for_update().get(pk=pk)
            if (
                validation.state != ValidationState.PENDING
                or validation.method != ValidationMethod.SERVICE
                or validation.retry_at is None
                or validation.retry_at > now
            ):
                continue
            validation.retry_at = now + SERVICE_RETRY_CLAIM
            validation.save(update_fields=["retry_at", "updated_at"])
        if problem := handler.unavailable(get_backend()):
            outcome = Outcome(False, reason=problem)
        else:
            outcome = handler.after_commit(validation)
        recorded = _outcome_record(pk, outcome, method=ValidationMethod.SERVICE, now=now)
        ended += recorded.state != ValidationState.PENDING
    return ended


def micro_entries_verify(
    *, account_token: str, merchant_id: str, amounts: object, now: datetime | None = None
) -> AccountValidation:
    """Check the amounts the account's holder read, in constant time, under the row's lock so
    at most ``MICRO_ENTRY_MAX_ATTEMPTS`` tries are ever counted. Right: validated. Wrong: one
    try spent, and ``ValidationRefused("micro_entries_mismatch")`` (the last one fails the
    validation). Malformed amounts spend no try (``AmountsInvalid``). ``LookupError``
    when the merchant has no validation of the token."""
    now = now or timezone.now()
    parsed = micro_amounts_parse(amounts)
    with transaction.atomic():
        validation = (
            AccountValidation.objects.select_for_update()
            .filter(account_token=account_token, merchant_id=merchant_id)
            .first()
        )
        if validation is None:
            raise LookupError(account_token)
        refusal = _verifiable_refusal(validation, now)
        if refusal is None:
            right = hmac.compare_digest(
                micro_entries_digest(account_token, parsed), validation.secret_digest
            )
            if right:
                _complete(validation, validated=True)
                return validation
            validation.attempts += 1
            left = payments_conf.MICRO_ENTRY_MAX_ATTEMPTS - validation.attempts
            if left <= 0:
                _complete(validation, validated=False, reason="micro-entry amounts wrong too often")
            else:
                validation.save(update_fields=["attempts", "updated_at"])
            tail = f"{left} tries left" if left > 0 else "no tries left, the validation failed"
            refusal = ValidationRefused(
                "micro_entries_mismatch", f"the amounts do not match; {tail}", param="amounts"
            )
    # Raised after the commit: the try spent (or the expiry) is written either way.
    raise refusal


def _verifiable_refusal(validation: AccountValidation, now: datetime) -> ValidationRefused | None:
    """Why the (locked) validation takes no amounts now, or None; an expiry found here fails
    it."""
    if validation.method != ValidationMethod.MICRO_ENTRIES:
        return ValidationRefused(
            "validation_not_verifiable", "the account has no micro-entries to verify"
        )
    if validation.state != ValidationState.PENDING:
        return ValidationRefused(
            "validation_not_verifiable", f"the validation is {validation.state}: nothing to verify"
        )
    if validation.expires_at is not None and validation.expires_at <= now:
        _complete(validation, validated=False, reason=EXPIRED_REASON)
        return ValidationRefused(
            "micro_entries_expired", "the micro-entries expired: start a new validation"
        )
    return None


def micro_amounts_parse(value: object) -> list[Decimal]:
    """The amounts as the API takes them: a list of one or two strings ``0.01``-``0.99`` (what
    the statement shows); ``AmountsInvalid`` (400 ``invalid_amounts``) naming the problem,
    never the value."""
    problem = "must be a list of 1 or 2 amounts written as strings like 0.07"
    if not isinstance(value, list) or not 1 <= len(value) <= 2:
        raise AmountsInvalid(problem)
    amounts = []
    for item in value:
        if not isinstance(item, str) or not _AMOUNT_RE.fullmatch(item):
            raise AmountsInvalid(problem)
        amount = Decimal(item)
        if amount <= 0:
            raise AmountsInvalid("each amount is above 0.00")
        amounts.append(amount)
    return amounts


def micro_entry_returned(
    *, payment: Payment, return_code: str, now: datetime | None = None
) -> bool:
    """A return of one of the validation's micro-entry credits (R02, R03, R04 and the like:
    the account cannot take entries): the validation fails with the return's code, and its
    held debits with it, each once. A return of the offsetting debit leaves the validation as
    it is (the credits arrived: the amounts can still be read), its cost where the ledger put
    it. Call in the return's transaction. True when it failed it."""
    now = now or timezone.now()
    return _micro_entry_fail(
        payment,
        reason=f"micro-entry returned {return_code}",
        evidence={"return": {"code": return_code, "received_at": now.isoformat()}},
    )


def micro_entries_unsent_fail(*, limit: int = 500) -> int:
    """Pending micro-entry validations one of whose current credits failed without a return
    (the processor refused it, a ``failed`` event, the bank's cut could not write it): the
    account will not show the amounts, so each fails, with its held debits, once. Periodic,
    each in its own transaction; how many failed. A returned credit failed its validation
    already, by the return's code (``micro_entry_returned``)."""
    pks = list(
        AccountValidation.objects.filter(
            method=ValidationMethod.MICRO_ENTRIES,
            state=ValidationState.PENDING,
            micro_entries__direction=PaymentDirection.CREDIT,
            micro_entries__state=PaymentState.FAILED,
        )
        .values_list("pk", flat=True)
        .distinct()[:limit]
    )
    done = 0
    for pk in pks:
        with transaction.atomic():
            validation = AccountValidation.objects.select_for_update().get(pk=pk)
            current = validation.evidence.get("micro_entries", {}).get("payments", [])
            unsent = (
                Payment.objects.filter(
                    pk__in=current,
                    direction=PaymentDirection.CREDIT,
                    state=PaymentState.FAILED,
                    ach_return__isnull=True,
                )
                .values_list("pk", flat=True)
                .first()
            )
            if (
                unsent is None
                or validation.state != ValidationState.PENDING
                or validation.method != ValidationMethod.MICRO_ENTRIES
            ):
                continue
            validation.evidence = {**validation.evidence, "failed": {"payment_id": str(unsent)}}
            _complete(validation, validated=False, reason=UNSENT_REASON)
            done += 1
    return done


def _micro_entry_fail(payment: Payment, *, reason: str, evidence: dict) -> bool:
    """Fail the validation of the micro-entry credit ``payment`` with ``reason``: only a credit
    of its current round counts, and only while it is pending."""
    if payment.direction != PaymentDirection.CREDIT or payment.account_validation_id is None:
        return False
    validation = (
        AccountValidation.objects.select_for_update()
        .filter(pk=payment.account_validation_id)
        .first()
    )
    if (
        validation is None
        or validation.state != ValidationState.PENDING
        or validation.method != ValidationMethod.MICRO_ENTRIES
        or str(payment.pk) not in validation.evidence.get("micro_entries", {}).get("payments", [])
    ):
        return False
    validation.evidence = {**validation.evidence, **evidence}
    _complete(validation, validated=False, reason=reason)
    return True


def prenote_returned(
    *,
    account_token: str,
    return_code: str,
    now: datetime | None = None,
    trace_number: str = "",
) -> bool:
    """A return of the account's prenote: before ``live_from``, the validation fails with the
    return's code (and its held debits with it, each once). With ``trace_number``, only a
    return of the validation's current prenote counts (one of a prenote sent before the
    validation was started again changes nothing). True when it failed it."""
    now = now or timezone.now()
    return _prenote_fail(
        account_token=account_token,
        trace_number=trace_number,
        reason=f"prenote returned {return_code}",
        evidence={"return": {"code": return_code, "received_at": now.isoformat()}},
    )


def prenote_refused(*, account_token: str, trace_number: str, reason: str) -> bool:
    """The backend could not write the account's prenote (no such account in its vault, an
    account of another merchant): the validation fails with the reason, as a return would."""
    return _prenote_fail(
        account_token=account_token,
        trace_number=trace_number,
        reason=f"prenote not sent: {reason}",
        evidence={"refused": {"reason": reason[:255]}},
    )


def _prenote_fail(*, account_token: str, trace_number: str, reason: str, evidence: dict) -> bool:
    with transaction.atomic():
        validation = (
            AccountValidation.objects.select_for_update()
            .filter(account_token=account_token)
            .first()
        )
        if validation is None or not _prenote_pending(validation, trace_number):
            return False
        validation.evidence = {**validation.evidence, **evidence}
        _complete(validation, validated=False, reason=reason)
    return True


def _prenote_pending(validation: AccountValidation, trace_number: str) -> bool:
    """Whether the (locked) validation waits on a prenote, and on the one of ``trace_number``
    when it is given."""
    if validation.method != ValidationMethod.PRENOTE:
        return False
    if validation.state != ValidationState.PENDING:
        return False
    current = validation.evidence.get("prenote", {}).get("trace_number", "")
    return not trace_number or current == trace_number


def prenote_sent(
    *, account_token: str, trace_number: str, settlement_date: date, file_name: str
) -> bool:
    """The prenote ``trace_number`` is at the bank in a file settling on ``settlement_date``:
    the account takes live entries from the third banking day after it (``live_from``), when
    nothing came back by then (``prenotes_mature``). Call in the transaction that records the
    delivery. True when the validation waits on this prenote."""
    validation = (
        AccountValidation.objects.select_for_update().filter(account_token=account_token).first()
    )
    if validation is None or not _prenote_pending(validation, trace_number):
        return False
    validation.live_from = prenote_live_from(settlement_date)
    prenote = dict(validation.evidence.get("prenote", {}))
    prenote.update(
        {
            "file": file_name,
            "settlement_date": settlement_date.isoformat(),
            "live_from": validation.live_from.isoformat(),
        }
    )
    validation.evidence = {**validation.evidence, "prenote": prenote}
    validation.save(update_fields=["live_from", "evidence", "updated_at"])
    return True


def prenotes_mature(*, now: datetime | None = None, limit: int = 500) -> int:
    """Prenotes past ``live_from`` with no return: validated (their held debits released).
    Periodic; each in its own transaction."""
    return _due_complete(
        ValidationMethod.PRENOTE, "live_from", now=now, limit=limit, validated=True
    )


def micro_entries_expire(*, now: datetime | None = None, limit: int = 500) -> int:
    """Micro-entries past their expiry with no right answer: failed (their held debits with
    them). Periodic, each in its own transaction; a verification after the expiry fails it
    too, whichever comes first."""
    return _due_complete(
        ValidationMethod.MICRO_ENTRIES,
        "expires_at",
        now=now,
        limit=limit,
        validated=False,
        reason=EXPIRED_REASON,
    )


def _due_complete(
    method: str,
    due_field: str,
    *,
    now: datetime | None,
    limit: int,
    validated: bool,
    reason: str = "",
) -> int:
    """Complete the pending validations of ``method`` whose ``due_field`` has passed, each
    checked again under its row lock in its own transaction; how many were completed."""
    now = now or timezone.now()
    tokens = list(
        AccountValidation.objects.filter(
            method=method, state=ValidationState.PENDING, **{f"{due_field}__lte": now}
        ).values_list("account_token", flat=True)[:limit]
    )
    done = 0
    for token in tokens:
        with transaction.atomic():
            validation = _lock(token)
            due = getattr(validation, due_field)
            if (
                validation.state == ValidationState.PENDING
                and validation.method == method
                and due is not None
                and due <= now
            ):
                _complete(validation, validated=validated, reason=reason)
                done += 1
    return done


def account_validations_advance(*, now: datetime | None = None) -> int:
    """The periodic round: prenotes past their wait validated, micro-entries past their expiry
    or with a credit that failed unsent failed, validation services that could not answer
    asked again; how many validations ended."""
    return (
        prenotes_mature(now=now)
        + micro_entries_expire(now=now)
        + micro_entries_unsent_fail()
        + service_validations_retry(now=now)
    )


def _complete(validation: AccountValidation, *, validated: bool, reason: str = "") -> None:
    """End the (locked, pending) validation, and decide every debit held on it, in the
    caller's transaction."""
    now = timezone.now()
    if validated:
        validation.validate()
        validation.validated_at = now
    else:
        validation.fail()
        validation.failed_at = now
        validation.failure_reason = reason[:255]
    validation.secret_digest = ""
    validation.retry_at = None
    validation.save()
    event_record(
        type=ACCOUNT_VALIDATED if validated else ACCOUNT_VALIDATION_FAILED,
        merchant_id=validation.merchant_id,
        obj=validation_shape(validation),
    )
    held_debits_decide(validation)


def held_debits_decide(validation: AccountValidation) -> int:
    """Each debit held on the account, locked and decided once: submitted (validated) or
    failed with the validation's reason."""
    held = list(
        Payment.objects.select_for_update()
        .filter(
            source_token=validation.account_token,
            review_status=ReviewStatus.VALIDATION,
            state=PaymentState.PENDING,
        )
        .order_by("created_at", "id")
    )
    for payment in held:
        payment.review_status = ReviewStatus.NONE
        if validation.state == ValidationState.VALIDATED:
            review = payment.review_reason.partition(THEN_REVIEW)[2]
            if review:
                # Past an exposure limit too: a person decides now (payments.services.review).
                payment.review_status, payment.review_reason = ReviewStatus.HELD, review
            payment.save(update_fields=["review_status", "review_reason", "updated_at"])
            _held_event(payment, RELEASED_EVENT, {"validation_id": validation.id})
            if review:
                continue
            outbox_enqueue(
                kind=MessageKind.SUBMIT_PAYMENT,
                group_id=str(payment.id),
                body=submit_payment_body(payment.id),
            )
            continue
        from_state, to_state = payment_transition(payment=payment, target=PaymentState.FAILED)
        payment.save(update_fields=["review_status", "updated_at"])
        row = PaymentEvent.objects.create(
            payment=payment,
            kind=EventKind.REVIEW,
            outcome=EventOutcome.APPLIED,
            event_type=FAILED_EVENT,
            from_state=from_state,
            to_state=to_state,
            payload={"reason": validation.failure_reason, "validation_id": validation.id},
            caused_by=f"validation:{validation.id}",
        )
        transition_announce(row)
    return len(held)


def _held_event(payment: Payment, event_type: str, payload: dict) -> None:
    PaymentEvent.objects.create(
        payment=payment,
        kind=EventKind.REVIEW,
        outcome=EventOutcome.RECORDED,
        event_type=event_type,
        from_state=payment.state,
        to_state=payment.state,
        payload=payload,
        caused_by=f"validation:{payload.get('validation_id', '')}",
    )
