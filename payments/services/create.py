"""Creating a payment: input checks, then the payment, its audit row and its submit command in
one transaction."""

import re
from collections.abc import Mapping
from decimal import Decimal

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Model

from payments import conf as payments_conf
from payments import originator
from payments.exceptions import SecCodeNotAllowed
from payments.insert_sql import rows_insert
from payments.kernel import propagation
from payments.kernel.bank_numbers import BANK_NUMBER_MESSAGE, looks_like_bank_number
from payments.messages import MessageKind, submit_payment_body
from payments.models import (
    EventKind,
    EventOutcome,
    OriginatorProfile,
    OutboxMessage,
    Payment,
    PaymentDirection,
    PaymentEvent,
    PaymentPurpose,
)
from payments.processor.backend import get_backend
from payments.services.fraud import account_block_check, hold_apply, hold_decide
from payments.services.nocs import noc_debit_check
from payments.services.validation_rule import (
    validation_debit_check,
    validation_hold,
    validation_hold_confirm,
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
    if reinitiation_of is not None:
        # NACHA's reinitiation rule: the same entry again, described RETRY PYMT whatever the
        # original said.
        sec_code = reinitiation_of.sec_code or sec_code
        entry_description = originator.RETRY_PYMT
    else:
        sec_code, entry_description = _entry_class_and_description(
            merchant_id=merchant_id,
            sec_code=sec_code or checked.sec_code or payments_conf.DEFAULT_SEC_CODE,
            entry_description=entry_description,
        )
    # NACHA's account validation rule: a reinitiation is not the account's first use.
    held_for_validation = reinitiation_of is None and (
        validation_debit_check(source_token=source_token, sec_code=sec_code) is not None
    )
    # An open notification of change past its deadline blocks the token's next entry.
    nocs_open = noc_debit_check(source_token=source_token)
    # A return blocked the account (R17 QUESTIONABLE, or unauthorized for this merchant).
    account_block_check(
        merchant_id=merchant_id,
        account_token=source_token,
        new_authorization=reinitiation_of is not None and bool(authorization_reference),
    )
    with transaction.atomic():
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
        )
        payment = Payment(
            merchant_id=merchant_id,
            amount=amount,
            currency=currency,
            source_token=source_token,
            description=description,
            metadata=metadata or {},
            reinitiation_of=reinitiation_of,
            reinitiation_number=reinitiation_number,
            authorization_reference=authorization_reference,
            sec_code=sec_code,
            entry_description=entry_description,
        )
        payload = {
            "amount": f"{amount:.2f}",
            "currency": currency,
            "merchant_id": merchant_id,
            "sec_code": sec_code,
            "entry_description": entry_description,
        }
        if reinitiation_of is not None:
            payload.update(
                reinitiation_of=str(reinitiation_of.id), reinitiation_number=reinitiation_number
            )
        if held_for_validation:
            # Released or failed by the validation (payments.services.validation); flagged for
            # review too, it is held for review once validated, never approved unvalidated.
            payload.update(validation_hold(payment, then_review=hold))
        elif hold is not None:
            payload.update(hold_apply(payment, hold))
        payment_created_record(
            payment,
            payload=payload,
            caused_by=caused_by,
            carried=carried,
            submit=hold is None and not held_for_validation,
        )
    payment.nocs_open = nocs_open
    return payment


def _entry_class_and_description(
    *, merchant_id: str, sec_code: str, entry_description: str
) -> tuple[str, str]:
    """A new debit's class and description under the merchant's originator profile (one read
    of it); ``ValidationError`` naming the field for a value the rules refuse."""
    if problem := originator.sec_code_problem(sec_code):
        raise ValidationError({"sec_code": problem})
    if entry_description and (
        problem := originator.entry_description_problem(
            entry_description, entry="debit", sec_code=sec_code
        )
    ):
        raise ValidationError({"entry_description": problem})
    profile = (
        OriginatorProfile.objects.filter(merchant_id=merchant_id)
        .only("allowed_sec_codes", "default_entry_description")
        .first()
    )
    if profile is None:
        return sec_code, entry_description
    if sec_code not in profile.allowed_sec_codes:
        raise SecCodeNotAllowed(
            merchant_id=merchant_id, sec_code=sec_code, allowed=profile.allowed_sec_codes
        )
    return sec_code, entry_description or profile.default_entry_description


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
    payout's ledger entry), its audit row and (unless it is held, ``submit=False``) its submit
    command, in the caller's transaction and in one statement (``payments.insert_sql``): a
    debit, a refund or a payout alike."""
    event = PaymentEvent(
        payment=payment,
        kind=EventKind.CREATED,
        outcome=EventOutcome.APPLIED,
        to_state=payment.state,
        payload=payload,
        caused_by=caused_by,
    )
    if not submit:
        rows_insert([payment, *rows, event])
        _created_event_save(payment)
        return
    message = _outbox_message(
        kind=SUBMIT_PAYMENT,
        group_id=str(payment.id),
        body=submit_payment_body(payment.id),
        carried=carried,
    )
    rows_insert([payment, *rows, event, message])
    _created_event_save(payment)
    _outbox_announce(message)


def _created_event_save(payment: Payment) -> None:
    """The merchant's event of the new payment (``payment.created``, ``refund.created``,
    ``payout.created``), once the payment's row is written: its shape reads what the insert
    filled in (``created_at``)."""
    payment_event_new(payment=payment, state=payment.state).save(force_insert=True)


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
