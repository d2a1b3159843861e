"""Notifications of change (NOCs): the record of each, the debits an overdue one blocks, and
the operator's closing of one.

A NOC is recorded in the transaction that claims its processor event (``payment_apply_event``),
per payment and per ``source_token``, with its code's title and its deadline: 6 banking days
after it was received, or before the next entry, whichever is later. So a debit created before
the deadline goes out (its answer warns), and one created after it, while the NOC is still
open, is refused: that debit would be the next entry, and the deadline has passed.
It moves no payment state and no money. An unknown change code is recorded and flagged (an
alert after commit), never dropped; a refused NOC (C61-C69) is recorded with nothing to apply.

A NOC of an account's prenote (the bank backend's, ``noc_record_of_prenote``) answers no
payment: it is kept the same way, naming the account's validation, and obeyed the same way by
the debits on its token.
"""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from payments.alerts import AlertSeverity, alert_raise
from payments.banking_days import add_banking_days
from payments.change_codes import NOC_DEADLINE_BANKING_DAYS, change_code_get
from payments.events import ProcessorEvent
from payments.exceptions import EventConflict, NocPastDeadline, PaymentError
from payments.models import (
    AccountValidation,
    NocAction,
    NocStatus,
    NotificationOfChange,
    Payment,
)
from payments.services.event_handlers import ApplyOutcome, Decision, EventHandler
from payments.services.validation_rule import account_number_changed
from payments.webhooks.catalogue import NOC_APPLIED, NOC_RECEIVED
from payments.webhooks.events import event_record, noc_shape


class NocNotOpen(PaymentError):
    """Only an open NOC can be marked applied."""


class NocNoteRequired(PaymentError):
    """Closing a NOC needs a note saying what was done at the processor."""


class NocHandler(EventHandler):
    """A notification of change: recorded once beside the payment, in its current state. A
    repeat is judged by its NOC, which outlives the dedup record: a resend months later is
    still one NOC."""

    def earlier(self, event: ProcessorEvent, payment: Payment) -> bool:
        recorded = noc_recorded_before(event)
        if recorded is None:
            return False
        if recorded.payment_id != payment.id or not noc_same(recorded, event):
            raise EventConflict(
                f"processor_event_id {event.processor_event_id} was recorded before as another "
                f"notification of change (NOC {recorded.id} for payment {recorded.payment_id})"
            )
        return True

    def decide(self, event: ProcessorEvent, payment: Payment) -> Decision:
        return Decision(ApplyOutcome.RECORDED)

    def record(self, *, event, payment, decision, log) -> None:
        noc_record(payment=payment, event=event)


def noc_record(*, payment: Payment, event: ProcessorEvent) -> NotificationOfChange:
    """Record the NOC ``event`` carries for ``payment`` and its token. Called in the
    transaction that claimed the event, so it is written exactly once."""
    return _noc_write(
        payment=payment,
        validation=None,
        merchant_id=payment.merchant_id,
        source_token=payment.source_token,
        processor_event_id=event.processor_event_id,
        change_code=event.change_code,
        corrected_data=event.corrected_data,
        received_at=event.timestamp,
        source="noc_received",
    )


def noc_record_of_prenote(
    *,
    validation: AccountValidation,
    processor_event_id: str,
    change_code: str,
    corrected_data: dict,
    received_at: datetime,
) -> tuple[NotificationOfChange, bool]:
    """Record the NOC of the account's prenote (its validation's, no payment's) as any other
    NOC: its title and deadline, the account made new by a change of its number, the
    merchant's ``noc.received`` event, the alert of an unknown code. Called in the
    transaction that reads the bank's file; the NOC already recorded under
    ``processor_event_id`` (the same NOC read again) is returned as it is, with False."""
    recorded = NotificationOfChange.objects.filter(processor_event_id=processor_event_id).first()
    if recorded is not None:
        return recorded, False
    noc = _noc_write(
        payment=None,
        validation=validation,
        merchant_id=validation.merchant_id,
        source_token=validation.account_token,
        processor_event_id=processor_event_id,
        change_code=change_code,
        corrected_data=corrected_data,
        received_at=received_at,
        source="prenote_noc",
    )
    return noc, True


def _noc_write(
    *,
    payment: Payment | None,
    validation: AccountValidation | None,
    merchant_id: str,
    source_token: str,
    processor_event_id: str,
    change_code: str,
    corrected_data: dict,
    received_at: datetime,
    source: str,
) -> NotificationOfChange:
    code = change_code_get(change_code)
    refused = code is not None and code.refused
    noc = NotificationOfChange.objects.create(
        payment=payment,
        account_validation=validation,
        merchant_id=merchant_id,
        source_token=source_token,
        processor_event_id=processor_event_id,
        change_code=change_code,
        change_title=code.title if code is not None else "",
        corrected_data=corrected_data,
        unknown_code=code is None,
        status=NocStatus.REFUSED if refused else NocStatus.OPEN,
        received_at=received_at,
        deadline=None if refused else noc_deadline(received_at),
    )
    if not refused:
        # A corrected account number is another account: validated again before a WEB debit.
        account_number_changed(
            account_token=noc.source_token,
            change_code=noc.change_code,
            source=source,
            noc_id=noc.pk,
        )
    event_record(
        type=NOC_RECEIVED,
        merchant_id=noc.merchant_id,
        obj=noc_shape(noc),
        object_id=noc_event_object_id(noc),
    )
    if code is None:
        details = {"change_code": change_code, "processor_event_id": processor_event_id}
        subject = noc_subject(noc)
        summary = (
            f"notification of change for {subject} of {merchant_id} carries change code "
            f"{change_code!r}, which is not a NACHA change code; recorded as open NOC "
            f"{noc.id}, check it with the {'bank' if payment is None else 'processor'}"
        )
        key = (
            f"payment.noc_unknown_code:{payment.id}"
            if payment is not None
            else f"payment.noc_unknown_code:validation-{validation.pk}"
        )
        transaction.on_commit(
            lambda: alert_raise(
                severity=AlertSeverity.MEDIUM,
                key=key,
                summary=summary,
                details=details,
                payment_id=payment.id if payment is not None else None,
            ),
            robust=True,
        )
    return noc


def noc_subject(noc: NotificationOfChange) -> str:
    """What the NOC answered, in words: the payment, or the prenote of an account."""
    if noc.payment_id is not None:
        return f"payment {noc.payment_id}"
    return f"the prenote of account {noc.source_token}"


def noc_event_object_id(noc: NotificationOfChange) -> str:
    """The key the NOC's events are ordered by: its payment's, or, for a prenote's, its own."""
    return str(noc.payment_id or noc.pk)


def noc_recorded_before(event: ProcessorEvent) -> NotificationOfChange | None:
    """The NOC recorded for this event id, if any: it outlives the event's dedup record."""
    return NotificationOfChange.objects.filter(processor_event_id=event.processor_event_id).first()


def noc_same(noc: NotificationOfChange, event: ProcessorEvent) -> bool:
    """Whether ``event`` says what the recorded ``noc`` says (code, corrected data, time)."""
    return (
        noc.change_code == event.change_code
        and noc.corrected_data == event.corrected_data
        and noc.received_at == event.timestamp
    )


def noc_deadline(received_at: datetime) -> datetime:
    """The end of the 6th banking day after the NOC was received."""
    return add_banking_days(received_at, NOC_DEADLINE_BANKING_DAYS)


def nocs_open_for_token(source_token: str) -> list[NotificationOfChange]:
    """The token's open NOCs, earliest deadline first."""
    return list(nocs_open_queryset(source_token))


def nocs_open_queryset(source_token: str) -> QuerySet[NotificationOfChange]:
    """The read of ``nocs_open_for_token``, for a caller that reads it with others."""
    return (
        NotificationOfChange.objects.filter(source_token=source_token, status=NocStatus.OPEN)
        .order_by("deadline", "id")
        .only("id", "change_code", "change_title", "deadline", "unknown_code")
    )


def noc_debit_check(
    *,
    source_token: str,
    now: datetime | None = None,
    nocs: list[NotificationOfChange] | None = None,
) -> list[NotificationOfChange]:
    """Before a new debit on ``source_token``: raise ``NocPastDeadline`` for an open NOC past
    its deadline; return the open ones still within it (the answer warns of them). ``nocs``:
    the token's open NOCs as the caller read them (``nocs_open_queryset``), else read here."""
    now = now or timezone.now()
    if nocs is None:
        nocs = nocs_open_for_token(source_token)
    for noc in nocs:
        if noc.deadline is not None and noc.deadline < now:
            raise NocPastDeadline(noc_id=noc.id, change_code=noc.change_code, deadline=noc.deadline)
    return nocs


def noc_warning(noc: NotificationOfChange) -> dict:
    """What a create answer says of an open NOC within its deadline: its id, code, title and
    deadline, never the corrected data (the processor holds the account's details)."""
    return {
        "code": "notification_of_change_open",
        "noc_id": noc.id,
        "change_code": noc.change_code,
        "change_title": noc.change_title,
        "deadline": noc.deadline.isoformat() if noc.deadline else None,
        "message": (
            f"the source_token has notification of change {noc.id} ({noc.change_code}) to apply "
            f"by {noc.deadline.date().isoformat() if noc.deadline else '(no deadline)'}; after "
            "that, new debits on it are refused until it is marked applied"
        ),
    }


def noc_mark_applied(*, noc_id: int, user, note: str) -> NotificationOfChange:
    """An operator applied the NOC at the processor (the token was updated): close it, with
    the note and an audit row, under the NOC's row lock so two operators close it once."""
    note = (note or "").strip()
    if not note:
        raise NocNoteRequired("a note is required: what was updated at the processor, and where")
    with transaction.atomic():
        noc = NotificationOfChange.objects.select_for_update().get(pk=noc_id)
        if noc.status != NocStatus.OPEN:
            raise NocNotOpen(f"NOC {noc.id} is {noc.status}, not open: nothing to apply")
        before = noc.status
        noc.status = NocStatus.APPLIED
        noc.applied_at = timezone.now()
        noc.applied_by = user
        noc.applied_note = note
        noc.save(update_fields=["status", "applied_at", "applied_by", "applied_note"])
        NocAction.objects.create(
            noc=noc,
            action="apply",
            user=user,
            note=note,
            status_before=before,
            status_after=noc.status,
        )
        # Applied at the processor, the token's account number is the corrected one.
        account_number_changed(
            account_token=noc.source_token,
            change_code=noc.change_code,
            source="noc_applied",
            noc_id=noc.pk,
        )
        event_record(
            type=NOC_APPLIED,
            merchant_id=noc.merchant_id,
            obj=noc_shape(noc),
            object_id=noc_event_object_id(noc),
        )
    return noc
