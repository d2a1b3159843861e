"""Writes of triage: the human decisions about dead letters.

(Taking them out of the DLQ is ``triage.ingestion``.)

The actions (``dead_letter_redrive``, ``dead_letter_resolve``, ``dead_letter_discard``) act only
on an open dead letter, need the ``triage.act_on_deadletter`` permission and a note, and leave a
``TriageAction`` audit row and an admin ``LogEntry``. When the payment's last open dead letter is
handled, its hold is released: the parked messages are republished in their original order
behind the redriven message (``callbacks.services.hold_release``).
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass, field

from django.contrib.admin.models import CHANGE, LogEntry
from django.db import transaction
from django.db.models.functions import Now

from callbacks import sqs
from callbacks.models import PaymentHold
from callbacks.selectors import payment_active_hold
from callbacks.services import hold_release, message_republish
from payments.messages import DEAD_LETTER_KEY
from triage.exceptions import (
    DeadLetterNotOpen,
    HoldReleaseFailed,
    NotAllowed,
    NoteRequired,
    RedrivePublishFailed,
    TriageError,
)
from triage.models import (
    BulkTriageJob,
    DeadLetter,
    DeadLetterStatus,
    TriageAction,
    TriageActionKind,
)
from triage.selectors import hold_release_blockers

logger = logging.getLogger(__name__)

ACT_PERMISSION = "triage.act_on_deadletter"


class ActionOutcome(enum.StrEnum):
    """What an action did, as recorded in its audit row's ``details["outcome"]``."""

    PUBLISHED = "published"
    PUBLISH_FAILED = "publish_failed"
    DEDUPLICATED_CONCURRENT_REDRIVE = "deduplicated_concurrent_redrive"
    PUBLISHED_AFTER_CONCURRENT_ACTION = "published_after_concurrent_action"
    RESOLVED = "resolved"
    DISCARDED = "discarded"
    RELEASED = "released"
    RELEASE_FAILED = "release_failed"


# --- Actions -----------------------------------------------------------------------------------


def _audit_unchanged(
    dead_letter: DeadLetter,
    action: TriageActionKind,
    *,
    user,
    note: str,
    details: dict,
    bulk_job: BulkTriageJob | None = None,
) -> TriageAction:
    """An audit row for an action that left the dead letter's status as it was (a failed
    publish, a release of its hold, a race lost to another operator)."""
    return TriageAction.objects.create(
        dead_letter=dead_letter,
        action=action,
        user=user,
        note=note,
        status_before=dead_letter.status,
        status_after=dead_letter.status,
        details=details,
        bulk_job=bulk_job,
    )


@dataclass
class ActionResult:
    """What an action did: the dead letter after it, its audit row, and the hold's fate."""

    dead_letter: DeadLetter
    action: TriageAction
    released: int | None = None  # messages republished by the release; None = not released
    release_note: str = ""  # why the hold was not released, or why the release failed
    release_failed: bool = False


def note_clean(note: str | None) -> str:
    """The operator's note, stripped; every decision needs one (``NoteRequired``)."""
    note = (note or "").strip()
    if not note:
        raise NoteRequired()
    return note


def operator_check(user) -> None:
    """Only an active user with ``triage.act_on_deadletter`` may decide (else ``NotAllowed``)."""
    if user is None or not user.is_active or not user.has_perm(ACT_PERMISSION):
        raise NotAllowed(user)


def _log_entry(user, dead_letter: DeadLetter, message: str) -> None:
    LogEntry.objects.log_actions(
        user_id=user.pk,
        queryset=[dead_letter],
        action_flag=CHANGE,
        change_message=message[:2000],
        single_object=True,
    )


def _lock_open(dead_letter_id: int, verb: str) -> DeadLetter:
    locked = DeadLetter.objects.select_for_update().get(pk=dead_letter_id)
    if locked.status != DeadLetterStatus.OPEN:
        raise DeadLetterNotOpen(locked, verb)
    return locked


def _close(
    *,
    dead_letter_id: int,
    user,
    note: str,
    kind: TriageActionKind,
    status: DeadLetterStatus,
    verb: str,
    details: dict,
    redrive_message_id: str = "",
    bulk_job: BulkTriageJob | None = None,
) -> tuple[DeadLetter, TriageAction]:
    """Mark an open dead letter with its new status and write the audit rows, in one
    transaction under the row lock."""
    with transaction.atomic():
        locked = _lock_open(dead_letter_id, verb)
        locked.status = status
        locked.status_changed_at = Now()  # the database's clock, as every audit time
        fields = ["status", "status_changed_at"]
        if redrive_message_id:
            locked.redrive_message_id = redrive_message_id
            fields.append("redrive_message_id")
        locked.save(update_fields=fields)
        locked.refresh_from_db(fields=["status_changed_at"])
        action = TriageAction.objects.create(
            dead_letter=locked,
            action=kind,
            user=user,
            note=note,
            status_before=DeadLetterStatus.OPEN,
            status_after=status,
            details=details,
            bulk_job=bulk_job,
        )
        _log_entry(user, locked, f"{kind}: {note}")
    logger.warning(
        "dead letter %s %s by %s: %s",
        locked.pk,
        verb,
        user,
        note,
        extra={"payment_id": locked.group_id, "message_id": locked.original_message_id},
    )
    return locked, action


def redrive_deduplication_id(dead_letter: DeadLetter) -> str:
    # Only an open dead letter can be redriven, so each is redriven at most once ("1"); a
    # redriven message that dies again comes back as a new dead letter with its own message id.
    return f"{dead_letter.original_message_id}:redrive:1"


def dead_letter_redrive(
    *, dead_letter: DeadLetter, user, note: str, bulk_job: BulkTriageJob | None = None
) -> ActionResult:
    """Publish the dead message again to the main FIFO queue (same group, new deduplication id),
    mark the dead letter redriven, and release the payment's hold if nothing else blocks it.

    Order: publish first, then commit. The publish never runs inside a transaction that could
    roll back, and its deduplication id is deterministic, so:

    - if the publish fails, nothing changed: the dead letter stays open, the failed attempt is
      recorded as an audit row and ``RedrivePublishFailed`` tells the operator;
    - if the process dies after the publish and before the commit, the dead letter is still
      open; redriving it again within SQS's 5-minute window is dropped by SQS, and after it the
      worker's own dedup (processed event ids, the processor's idempotency key) makes a second
      copy harmless;
    - if another operator closed it in the meantime (the send takes milliseconds), the publish
      already happened: it is recorded on an audit row and reported, never hidden.

    Then, after the commit, ``hold_release`` republishes the parked messages behind it.
    """
    note = note_clean(note)
    operator_check(user)
    current = _redrivable(dead_letter)
    deduplication_id = redrive_deduplication_id(current)
    new_message_id = _redrive_publish(
        current, deduplication_id, user=user, note=note, bulk_job=bulk_job
    )
    details = {
        "outcome": ActionOutcome.PUBLISHED,
        "deduplication_id": deduplication_id,
        "redrive_message_id": new_message_id,
    }
    try:
        closed, action = _close(
            dead_letter_id=current.pk,
            user=user,
            note=note,
            kind=TriageActionKind.REDRIVE,
            status=DeadLetterStatus.REDRIVEN,
            verb="redriven",
            details=details,
            redrive_message_id=new_message_id,
            bulk_job=bulk_job,
        )
    except DeadLetterNotOpen as exc:
        raise _redrive_race_lost(
            exc.dead_letter, details, user=user, note=note, bulk_job=bulk_job
        ) from exc
    return _release_if_last(closed, action, user=user, note=note, bulk_job=bulk_job)


def _redrivable(dead_letter: DeadLetter) -> DeadLetter:
    """The dead letter as stored now, if it is open and has a body and a group to publish."""
    current = DeadLetter.objects.get(pk=dead_letter.pk)
    if current.status != DeadLetterStatus.OPEN:
        raise DeadLetterNotOpen(current, "redriven")
    body_fields = set(current.body) - {DEAD_LETTER_KEY}
    if body_fields == {"raw_body"} or not current.group_id:
        raise TriageError(
            f"Dead letter {current.pk} has no JSON body or no message group: it cannot be "
            "redriven. Resolve it (if fixed elsewhere) or discard it."
        )
    return current


def _redrive_publish(
    dead_letter: DeadLetter,
    deduplication_id: str,
    *,
    user,
    note: str,
    bulk_job: BulkTriageJob | None,
) -> str:
    """Publish the dead message to the main queue now (outside any transaction); return the new
    message id. A refusal is audited and raised as ``RedrivePublishFailed``: nothing changed."""
    try:
        return message_republish(
            deduplication_id=deduplication_id,
            body=dead_letter.body,
            group_id=dead_letter.group_id,
            original_message_id=dead_letter.original_message_id,
        )
    except sqs.QueueUnavailable as exc:
        _audit_unchanged(
            dead_letter,
            TriageActionKind.REDRIVE,
            user=user,
            note=note,
            details={"outcome": ActionOutcome.PUBLISH_FAILED, "error": str(exc)[:2000]},
            bulk_job=bulk_job,
        )
        logger.error("redrive of dead letter %s failed: %s", dead_letter.pk, exc)
        raise RedrivePublishFailed(
            f"The main queue did not accept the redrive of dead letter {dead_letter.pk}: {exc}. "
            "Nothing changed; the dead letter is still open. Try again when the queue is back."
        ) from exc


def _redrive_race_lost(
    other: DeadLetter,
    details: dict,
    *,
    user,
    note: str,
    bulk_job: BulkTriageJob | None,
) -> DeadLetterNotOpen:
    """Someone closed the dead letter while our redrive was being published: record on an audit
    row what was sent, and return the error that tells the operator."""
    new_message_id = details["redrive_message_id"]
    if other.redrive_message_id == new_message_id:
        # Someone redrove it a moment before us: SQS dropped our copy as a duplicate (same
        # deduplication id) and answered with the first copy's id. Nothing extra was sent.
        outcome = ActionOutcome.DEDUPLICATED_CONCURRENT_REDRIVE
        text = (
            f"Dead letter {other.pk} was redriven by someone else a moment ago; SQS "
            f"dropped this second copy as a duplicate (message {new_message_id})."
        )
    else:
        outcome = ActionOutcome.PUBLISHED_AFTER_CONCURRENT_ACTION
        text = (
            f"Dead letter {other.pk} was {other.status} by someone else while this redrive "
            f"was being published: message {new_message_id} was sent anyway and the worker "
            "will apply it (processor events are deduplicated by id). Check the payment."
        )
    _audit_unchanged(
        other,
        TriageActionKind.REDRIVE,
        user=user,
        note=note,
        details={**details, "outcome": outcome},
        bulk_job=bulk_job,
    )
    logger.error("%s", text, extra={"payment_id": other.group_id})
    return DeadLetterNotOpen(other, "redriven", detail=text)


def dead_letter_resolve(
    *, dead_letter: DeadLetter, user, note: str, bulk_job: BulkTriageJob | None = None
) -> ActionResult:
    """Mark it resolved (fixed elsewhere): nothing is published or applied for the message
    itself; the payment's hold is released if this was its last open dead letter."""
    return _close_without_publishing(
        dead_letter=dead_letter,
        user=user,
        note=note,
        kind=TriageActionKind.RESOLVE,
        status=DeadLetterStatus.RESOLVED,
        outcome=ActionOutcome.RESOLVED,
        bulk_job=bulk_job,
    )


def dead_letter_discard(
    *, dead_letter: DeadLetter, user, note: str, bulk_job: BulkTriageJob | None = None
) -> ActionResult:
    """Mark it discarded: the message is never applied; the body and history stay for audit;
    the payment's hold is released if this was its last open dead letter."""
    return _close_without_publishing(
        dead_letter=dead_letter,
        user=user,
        note=note,
        kind=TriageActionKind.DISCARD,
        status=DeadLetterStatus.DISCARDED,
        outcome=ActionOutcome.DISCARDED,
        bulk_job=bulk_job,
    )


def _close_without_publishing(
    *,
    dead_letter: DeadLetter,
    user,
    note: str,
    kind: TriageActionKind,
    status: DeadLetterStatus,
    outcome: ActionOutcome,
    bulk_job: BulkTriageJob | None = None,
) -> ActionResult:
    note = note_clean(note)
    operator_check(user)
    closed, action = _close(
        dead_letter_id=dead_letter.pk,
        user=user,
        note=note,
        kind=kind,
        status=status,
        verb=outcome,  # the outcome's value is the past participle: "resolved", "discarded"
        details={"outcome": outcome},
        bulk_job=bulk_job,
    )
    return _release_if_last(closed, action, user=user, note=note, bulk_job=bulk_job)


# The decisions an operator takes on an open dead letter, one by one or in bulk.
ACTIONS = {
    TriageActionKind.REDRIVE: dead_letter_redrive,
    TriageActionKind.RESOLVE: dead_letter_resolve,
    TriageActionKind.DISCARD: dead_letter_discard,
}


def _release_if_last(
    dead_letter: DeadLetter,
    action: TriageAction,
    *,
    user,
    note: str,
    bulk_job: BulkTriageJob | None = None,
):
    result = ActionResult(dead_letter=dead_letter, action=action)
    hold = payment_active_hold(dead_letter.group_id)
    if hold is None:
        result.release_note = "The payment has no active hold."
        return result
    blockers = hold_release_blockers(dead_letter.group_id)
    if blockers:
        result.release_note = "The payment's hold stays: " + "; ".join(blockers) + "."
        return result
    try:
        result.released = _hold_release_audited(
            dead_letter, hold, user=user, note=note, bulk_job=bulk_job
        )
    except HoldReleaseFailed as exc:
        result.release_failed = True
        result.release_note = str(exc)
    return result


def _hold_release_audited(
    dead_letter: DeadLetter,
    hold: PaymentHold,
    *,
    user,
    note: str,
    bulk_job: BulkTriageJob | None = None,
) -> int:
    """Release the hold through ``callbacks.services.hold_release`` and audit it either way."""
    try:
        sent = hold_release(
            payment_id=dead_letter.group_id, released_by=user.get_username(), note=note
        )
    except sqs.QueueUnavailable as exc:
        _audit_unchanged(
            dead_letter,
            TriageActionKind.RELEASE_HOLD,
            user=user,
            note=note,
            details={
                "outcome": ActionOutcome.RELEASE_FAILED,
                "hold_id": hold.pk,
                "error": str(exc)[:2000],
            },
            bulk_job=bulk_job,
        )
        logger.error("release of hold %s failed: %s", hold.pk, exc)
        raise HoldReleaseFailed(
            f"The hold on payment {dead_letter.group_id} could not be released: {exc}. Its "
            "parked messages stay parked (nothing was lost); use “Release hold” on this dead "
            "letter when the queue is back."
        ) from exc
    with transaction.atomic():
        _audit_unchanged(
            dead_letter,
            TriageActionKind.RELEASE_HOLD,
            user=user,
            note=note,
            details={"outcome": ActionOutcome.RELEASED, "hold_id": hold.pk, "republished": sent},
            bulk_job=bulk_job,
        )
        _log_entry(user, dead_letter, f"release_hold: {sent} parked message(s) republished")
    return sent


def dead_letter_hold_release(*, dead_letter: DeadLetter, user, note: str) -> int:
    """Release the payment's hold from a closed dead letter (when the automatic release after
    its action failed or was blocked then). Refused while anything still blocks it."""
    note = note_clean(note)
    operator_check(user)
    current = DeadLetter.objects.get(pk=dead_letter.pk)
    if current.status == DeadLetterStatus.OPEN:
        raise TriageError(
            f"Dead letter {current.pk} is still open: redrive, resolve or discard it; its hold "
            "is released then."
        )
    hold = payment_active_hold(current.group_id)
    if hold is None:
        raise TriageError(f"Payment {current.group_id} has no active hold to release.")
    blockers = hold_release_blockers(current.group_id)
    if blockers:
        raise TriageError("The hold cannot be released yet: " + "; ".join(blockers) + ".")
    return _hold_release_audited(current, hold, user=user, note=note)


@dataclass
class BulkResult:
    done: list[ActionResult] = field(default_factory=list)
    refused: list[tuple[int, str]] = field(default_factory=list)  # (dead letter id, reason)


def dead_letters_act(*, action: str, dead_letter_ids: list[int], user, note: str) -> BulkResult:
    """Apply one action to exactly these dead letters, each in its own transaction (one
    failure does not undo the others); report what was done and what was refused and why."""
    if action not in ACTIONS:
        raise ValueError(f"unknown triage action {action!r}; use one of {', '.join(ACTIONS)}")
    note = note_clean(note)
    operator_check(user)
    service = ACTIONS[action]
    result = BulkResult()
    dead_letters = {d.pk: d for d in DeadLetter.objects.filter(pk__in=dead_letter_ids)}
    for pk in dead_letter_ids:
        dead_letter = dead_letters.get(pk)
        if dead_letter is None:
            result.refused.append((pk, f"dead letter {pk} does not exist"))
            continue
        try:
            result.done.append(service(dead_letter=dead_letter, user=user, note=note))
        except TriageError as exc:
            result.refused.append((pk, str(exc)))
    return result
