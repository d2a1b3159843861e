"""Creating a payment: input checks, then the payment, its audit row and its submit command in
one transaction."""

import re
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from functools import partial
from typing import Any

from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.db.models import Model, QuerySet

from payments import conf as payments_conf
from payments import originator
from payments.exceptions import SecCodeNotAllowed
from payments.insert_sql import rows_insert
from payments.kernel import propagation
from payments.kernel.bank_numbers import BANK_NUMBER_MESSAGE, looks_like_bank_number
from payments.kernel.locks import LockSql, exposure_lock_sql
from payments.kernel.reads import AfterLocks, PreparedRead, Read, locked_read, querysets_read
from payments.messages import MessageKind, submit_payment_body
from payments.models import (
    AccountBlock,
    AccountValidation,
    EventKind,
    EventOutcome,
    ExposureLimit,
    LedgerEntry,
    LedgerEntryStatus,
    NotificationOfChange,
    OriginatorProfile,
    OutboxMessage,
    Payment,
    PaymentDirection,
    PaymentEvent,
    PaymentPurpose,
    PaymentState,
)
from payments.processor.backend import get_backend
from payments.services.credits import ENTRY_KINDS, ledger_account
from payments.services.fraud import (
    Hold,
    account_block_check,
    account_blocks_queryset,
    fraud_rules,
    hold_apply,
    hold_decide,
)
from payments.services.limits import exposure_limits_queryset
from payments.services.nocs import noc_debit_check, nocs_open_queryset
from payments.services.transitions import money_out_count
from payments.services.validation_rule import (
    validation_debit_check,
    validation_hold,
    validation_hold_confirm,
    validation_queryset,
    validation_required,
)
from payments.signals import outbox_committed
from payments.webhooks.events import payment_event_new

SUPPORTED_CURRENCIES = ("USD",)
SUBMIT_PAYMENT = MessageKind.SUBMIT_PAYMENT

_TOKEN_RE = re.compile(r"^[A-Za-z0-9_\-]{8,128}$")


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


def payment_create(
    *,
    merchant_id: str,
    amount: Decimal,
    source_token: str,
    currency: str = "USD",
    description: str = "",
    metadata: dict | None = None,
    caused_by: str = "",
    reinitiation_of: Payment | None = None,
    reinitiation_number: int | None = None,
    authorization_reference: str = "",
    carried: Mapping[str, str] | None = None,
    sec_code: str = "",
    entry_description: str = "",
) -> Payment:
    """Write the payment (pending, new idempotency key) and its submit command in one transaction.

    Its standard entry class is ``sec_code``, else the account's class as the backend knows it
    (the bank's vault account), else ``PAYMENTS["DEFAULT_SEC_CODE"]``; ``SecCodeNotAllowed``
    when the merchant's originator profile does not allow it. Its description is
    ``entry_description`` (the merchant's own, or ``PURCHASE`` for a WEB debit for goods), else
    the profile's default, else "" (the originator's); a reinitiation always goes as
    ``RETRY PYMT`` in its original entry's class (``payments.originator``).

    The commit is the promise: the outbox row guarantees the submission is published even if
    the queue is down right now. ``carried`` (the creating request's id and trace,
    ``payments.kernel.propagation``) goes with the submit command to the worker. Raises
    ``NocPastDeadline`` when the token has an open notification of change past its deadline,
    and ``ValidationError`` naming ``source_token`` for a token the processor backend refuses
    for ``merchant_id`` (``source_token_refused``: the bank's, a vault token it does not hold
    for the merchant, missing or another merchant's alike), and ``ExposureLimitExceeded`` when
    the debit would take the merchant past one of its exposure limits
    (``payments.services.limits``, checked under the merchant's exposure lock), or, with
    ``PAYMENTS["OVER_LIMIT"] = "hold"``, writes it held for review without its submit command,
    as it does when a fraud rule flags it (``payments.services.fraud.hold_decide``); and
    ``AccountBlocked`` when a return blocked the account (``account_block_check``).
    A debit of a class that needs its account validated first (``payments.services.validation``)
    from an account that is not raises ``AccountNotValidated``, or with
    ``PAYMENTS["UNVALIDATED_WEB_DEBITS"] = "hold"`` is written held until the validation ends.
    The payment's ``nocs_open`` are the token's open notifications of change within their
    deadline, as the check read them: the API's answer warns of them without reading them again.
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
    # The backend's own rule for its tokens (the bank's: a vault token held for the merchant),
    # and the account's class when it knows it, in one look.
    checked = get_backend().source_token_check(token=source_token, merchant_id=merchant_id)
    if checked.refused is not None:
        raise ValidationError({"source_token": checked.refused})
    first_use = reinitiation_of is None
    if not first_use:
        # NACHA's reinitiation rule: the same entry again, described RETRY PYMT whatever the
        # original said.
        sec_code = reinitiation_of.sec_code or sec_code
        entry_description = originator.RETRY_PYMT
    else:
        sec_code = sec_code or checked.sec_code or payments_conf.DEFAULT_SEC_CODE
        _entry_class_problems(sec_code=sec_code, entry_description=entry_description)
    new_authorization = not first_use and bool(authorization_reference)
    # The exposure lock goes with the reads when the fraud rules take it anyway, unless the
    # debit may be held for its account's validation: that row's lock comes first.
    lock_first = bool(fraud_rules()) and not (first_use and validation_required(sec_code))
    with create_transaction():
        known = _debit_facts_read(
            merchant_id=merchant_id,
            source_token=source_token,
            currency=currency,
            sec_code=sec_code,
            first_use=first_use,
            new_authorization=new_authorization,
            exposure_lock=lock_first,
        )
        if first_use:
            entry_description = _entry_under_profile(
                merchant_id=merchant_id,
                sec_code=sec_code,
                entry_description=entry_description,
                profile=known.profile,
            )
        # NACHA's account validation rule: a reinitiation is not the account's first use.
        held_for_validation = first_use and (
            validation_debit_check(
                source_token=source_token, sec_code=sec_code, validations=known.validations
            )
            is not None
        )
        # An open notification of change past its deadline blocks the token's next entry.
        nocs_open = noc_debit_check(source_token=source_token, nocs=known.nocs)
        # A return blocked the account (R17 QUESTIONABLE, or unauthorized for this merchant).
        account_block_check(
            merchant_id=merchant_id,
            account_token=source_token,
            new_authorization=new_authorization,
            blocks=known.blocks,
        )
        # Its own savepoint only when it writes before it may still refuse (the account's
        # validation row, written for a debit held for it).
        with create_transaction(savepoint=held_for_validation):
            if held_for_validation:
                # Under the validation's row lock: one ending now cannot miss this debit.
                held_for_validation = validation_hold_confirm(
                    source_token=source_token, merchant_id=merchant_id, sec_code=sec_code
                )
            hold = hold_decide(
                merchant_id=merchant_id,
                direction=PaymentDirection.DEBIT,
                purpose=PaymentPurpose.COLLECTION,
                currency=currency,
                amount=amount,
                account_token=source_token,
                account_changed_at=checked.changed_at,
                limit_rows=known.limits,
                exposure_locked=lock_first,
            )
            payment = payment_build(
                merchant_id=merchant_id,
                amount=amount,
                currency=currency,
                account_token=source_token,
                sec_code=sec_code,
                entry_description=entry_description,
                description=description,
                metadata=metadata,
                reinitiation_of=reinitiation_of,
                reinitiation_number=reinitiation_number,
                authorization_reference=authorization_reference,
                hold=hold,
                held_for_validation=held_for_validation,
                audit=_debit_audit(
                    sec_code, entry_description, reinitiation_of, reinitiation_number
                ),
                caused_by=caused_by,
                carried=carried,
            )
    payment.nocs_open = nocs_open
    return payment


def _debit_audit(
    sec_code: str,
    entry_description: str,
    reinitiation_of: Payment | None,
    reinitiation_number: int | None,
) -> dict[str, Any]:
    """A debit's fields of its audit row, beside every payment's."""
    audit: dict[str, Any] = {"sec_code": sec_code, "entry_description": entry_description}
    if reinitiation_of is not None:
        audit.update(
            reinitiation_of=str(reinitiation_of.id), reinitiation_number=reinitiation_number
        )
    return audit


def create_transaction(*, savepoint: bool = False) -> AbstractContextManager:
    """The transaction a create decides and writes in: its own, or the caller's when there is
    one (the API's, which holds the Idempotency-Key's row), without a savepoint of its own.

    None is needed: a create refuses (raises) before it writes anything, and writes its rows in
    one statement (``payment_build``), so there is nothing to roll back to, and a refusal leaves
    the caller's transaction usable (the locks the create took are held until it ends). A
    create that writes before it may still refuse asks for its ``savepoint``."""
    if connection.in_atomic_block and not savepoint:
        return nullcontext()
    return transaction.atomic()


@dataclass(frozen=True)
class CreateLocks:
    """What ``create_locks_take`` took and read: the merchant's own limits of the direction
    and currency, and whether the exposure lock is held already."""

    limits: list[ExposureLimit]
    exposure_locked: bool
    also: list[list] = field(default_factory=list)
    after: list = field(default_factory=list)


def create_locks_take(
    *,
    merchant_id: str,
    direction: str,
    currency: str,
    first: LockSql | None = None,
    also: Sequence[QuerySet | Read] = (),
    after_locks: Sequence[AfterLocks] = (),
) -> CreateLocks:
    """A money-out create's locks in one statement, in the one lock order: ``first`` (the
    merchant's money-out lock, exclusive or shared), then its exposure lock, the create's last,
    when the fraud rules take it anyway; with the merchant's limits, which need no lock, and the
    rows of ``also`` (the caller's reads that these locks need not protect: a refund's sum of
    what its debit's refunds hold, which the debit's row lock, taken before, protects). The
    values of ``after_locks`` (``after``) are read once the locks are held and are protected by
    them (a payout's available balance)."""
    exposure_locked = bool(fraud_rules())
    locks = [first]
    if exposure_locked:
        locks.append(exposure_lock_sql(merchant_id, direction, currency))
    limits = _LIMITS_READ.read(merchant_id=merchant_id, direction=direction, currency=currency)
    after, (rows, *also_rows) = locked_read([limits, *also], locks=locks, after_locks=after_locks)
    return CreateLocks(limits=rows, exposure_locked=exposure_locked, also=also_rows, after=after)


def payment_build(
    *,
    merchant_id: str,
    amount: Decimal,
    currency: str,
    account_token: str,
    sec_code: str,
    entry_description: str,
    direction: str = PaymentDirection.DEBIT,
    purpose: str = PaymentPurpose.COLLECTION,
    description: str = "",
    metadata: Mapping | None = None,
    refund_of: Payment | None = None,
    reinitiation_of: Payment | None = None,
    reinitiation_number: int | None = None,
    authorization_reference: str = "",
    account_validation: AccountValidation | None = None,
    hold: Hold | None = None,
    held_for_validation: bool = False,
    hold_until: datetime | None = None,
    audit: Mapping[str, Any] | None = None,
    caused_by: str = "",
    carried: Mapping[str, str] | None = None,
) -> Payment:
    """Build a new payment of any direction and purpose, decided by its caller (a debit's
    ``payment_create``, a ``refund_create``, a ``payout_create``), and write it in the caller's
    transaction: the payment, a credit's pending ledger entry (its money leaves the balance when
    it is made), its audit row, its merchant's event and, when nothing holds it, its submit
    command, in one statement (``payment_created_record``).

    ``account_token`` is the account the money comes from (a debit) or goes to (a credit). It
    waits, without its submit command, when ``held_for_validation`` (its account's validation;
    then for ``hold`` too, once validated), when a fraud rule or a limit ``hold`` it for a
    person's review, or until ``hold_until`` (a refund's debit's window). ``audit`` adds the
    caller's fields to the audit row's payload."""
    payment = Payment(
        merchant_id=merchant_id,
        amount=amount,
        currency=currency,
        source_token=account_token,
        description=description,
        metadata=dict(metadata or {}),
        direction=direction,
        purpose=purpose,
        refund_of=refund_of,
        reinitiation_of=reinitiation_of,
        reinitiation_number=reinitiation_number,
        authorization_reference=authorization_reference,
        account_validation=account_validation,
        sec_code=sec_code,
        entry_description=entry_description,
    )
    payload = {"amount": f"{amount:.2f}", "currency": currency, "merchant_id": merchant_id}
    payload.update(audit or {})
    rows: tuple[Model, ...] = ()
    if direction == PaymentDirection.CREDIT:
        held, _ = ENTRY_KINDS[purpose]
        rows = (
            LedgerEntry(
                payment=payment,
                merchant_id=ledger_account(payment),
                kind=held,
                amount=-amount,
                currency=currency,
                status=LedgerEntryStatus.PENDING,
            ),
        )
        money_out_count(purpose, PaymentState.PENDING)
    if held_for_validation:
        # Released or failed by the validation (payments.services.validation); flagged for
        # review too, it is held for review once validated, never approved unvalidated.
        payload.update(validation_hold(payment, then_review=hold))
    elif hold is not None:
        payload.update(hold_apply(payment, hold))
    if hold_until is not None:
        # Its submit command once the window has passed (``refunds_release``).
        payment.hold_until = hold_until
        payload["hold_until"] = hold_until.isoformat()
    payment_created_record(
        payment,
        payload=payload,
        caused_by=caused_by,
        carried=carried,
        submit=hold is None and not held_for_validation and hold_until is None,
        rows=rows,
    )
    return payment


@dataclass(frozen=True)
class _DebitFacts:
    """What a new debit's checks read, in one statement (``payments.kernel.reads``)."""

    profile: OriginatorProfile | None
    validations: list[AccountValidation] | None  # None: its class needs no validation
    nocs: list[NotificationOfChange]
    blocks: list[AccountBlock]
    limits: list[ExposureLimit]


def _profile_queryset(*, merchant_id: str) -> QuerySet[OriginatorProfile]:
    return (
        OriginatorProfile.objects.filter(merchant_id=merchant_id)
        .order_by("pk")
        .only("allowed_sec_codes", "default_entry_description")[:1]
    )


# A create's reads have the same shape on every request: compiled once per process.
_NOCS_READ = PreparedRead(nocs_open_queryset, slots=("source_token",))
_BLOCKS_READ = PreparedRead(account_blocks_queryset, slots=("merchant_id", "account_token"))
_LIMITS_READ = PreparedRead(
    exposure_limits_queryset, slots=("merchant_id", "direction", "currency")
)
_PROFILE_READ = PreparedRead(_profile_queryset, slots=("merchant_id",))
_VALIDATION_READ = PreparedRead(validation_queryset, slots=("source_token",))


def _debit_facts_read(
    *,
    merchant_id: str,
    source_token: str,
    currency: str,
    sec_code: str,
    first_use: bool,
    new_authorization: bool,
    exposure_lock: bool,
) -> _DebitFacts:
    """The merchant's originator profile (a first use's), the account's validation (a first
    use of a class that needs it), its open notifications of change and its open block, and the
    merchant's debit limits: independent indexed reads, one round trip; with the merchant's
    exposure lock taken first (``exposure_lock``: what it guards is read after it)."""
    reads = {
        "nocs": _NOCS_READ.read(source_token=source_token),
        "blocks": _BLOCKS_READ.read(
            merchant_id=merchant_id,
            account_token=source_token,
            new_authorization=new_authorization,
        ),
        "limits": _LIMITS_READ.read(
            merchant_id=merchant_id, direction=PaymentDirection.DEBIT, currency=currency
        ),
    }
    if first_use:
        reads["profile"] = _PROFILE_READ.read(merchant_id=merchant_id)
        if validation_required(sec_code):
            reads["validations"] = _VALIDATION_READ.read(source_token=source_token)
    locks = (
        [exposure_lock_sql(merchant_id, PaymentDirection.DEBIT, currency)] if exposure_lock else []
    )
    rows = dict(zip(reads, querysets_read(list(reads.values()), locks=locks), strict=True))
    profile = rows.get("profile") or [None]
    return _DebitFacts(
        profile=profile[0],
        validations=rows.get("validations"),
        nocs=rows["nocs"],
        blocks=rows["blocks"],
        limits=rows["limits"],
    )


def _entry_class_problems(*, sec_code: str, entry_description: str) -> None:
    """``ValidationError`` naming the field for a class or a description the rules refuse."""
    if problem := originator.sec_code_problem(sec_code):
        raise ValidationError({"sec_code": problem})
    if entry_description and (
        problem := originator.entry_description_problem(
            entry_description, entry="debit", sec_code=sec_code
        )
    ):
        raise ValidationError({"entry_description": problem})


def _entry_under_profile(
    *,
    merchant_id: str,
    sec_code: str,
    entry_description: str,
    profile: OriginatorProfile | None,
) -> str:
    """A new debit's description under the merchant's originator ``profile``;
    ``SecCodeNotAllowed`` for a class the profile does not allow."""
    if profile is None:
        return entry_description
    if sec_code not in profile.allowed_sec_codes:
        raise SecCodeNotAllowed(
            merchant_id=merchant_id, sec_code=sec_code, allowed=profile.allowed_sec_codes
        )
    return entry_description or profile.default_entry_description


def payment_created_record(
    payment: Payment,
    *,
    payload: dict,
    caused_by: str,
    carried: Mapping[str, str] | None = None,
    submit: bool = True,
    rows: tuple[Model, ...] = (),
) -> None:
    """Write the new, unsaved ``payment``, the ``rows`` that go with it (a refund's or a
    payout's ledger entry), its audit row, (unless it is held, ``submit=False``) its submit
    command and its merchant's event, in the caller's transaction and in one statement
    (``payments.insert_sql``): a debit, a refund or a payout alike. The payment's
    ``created_shape`` is then its object in that event (None without one)."""
    event = PaymentEvent(
        payment=payment,
        kind=EventKind.CREATED,
        outcome=EventOutcome.APPLIED,
        to_state=payment.state,
        payload=payload,
        caused_by=caused_by,
    )
    # The merchant's event (``payment.created``, ``refund.created``, ``payout.created``) is made
    # once the payment's insert is built: its shape reads what that fills in (``created_at``).
    merchant_event = partial(payment_event_new, payment=payment, state=payment.state)
    # A micro-entry's amount is its validation's secret: no event of it reaches the merchant.
    events = [] if payment.purpose == PaymentPurpose.MICRO_ENTRY else [merchant_event]
    if not submit:
        made = rows_insert([payment, *rows, event, *events])
    else:
        message = _outbox_message(
            kind=SUBMIT_PAYMENT,
            group_id=str(payment.id),
            body=submit_payment_body(payment.id),
            carried=carried,
        )
        made = rows_insert([payment, *rows, event, message, *events])
        _outbox_announce(message)
    # The payment as its merchant's event shows it, which is how the API shows it: the
    # create's answer is that shape, not the payment rendered a second time.
    payment.created_shape = made[-1].data["object"] if events else None


def outbox_enqueue(
    *, kind: str, group_id: str, body: dict, carried: Mapping[str, str] | None = None
) -> OutboxMessage:
    """Add a message to the outbox inside the caller's transaction; announce it after commit.
    ``carried`` is the request id and trace it is sent with (``payments.kernel.propagation``)."""
    message = _outbox_message(kind=kind, group_id=group_id, body=body, carried=carried)
    message.save(force_insert=True)
    _outbox_announce(message)
    return message


def _outbox_message(
    *, kind: str, group_id: str, body: dict, carried: Mapping[str, str] | None
) -> OutboxMessage:
    return OutboxMessage(
        kind=kind, group_id=group_id, body=body, carried=propagation.bounded(carried or {})
    )


def _outbox_announce(message: OutboxMessage) -> None:
    """Once the caller's transaction commits, the relay publishes the saved ``message``."""
    transaction.on_commit(
        lambda: outbox_committed.send(sender=OutboxMessage, message_ids=[message.id]),
        robust=True,
    )
