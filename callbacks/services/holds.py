"""Payment holds: putting a payment on hold, and releasing it in its messages' order.

A hold keeps a payment's messages in the database (``ParkedMessage``), off the queue, until it
is released: a triage hold by a person, an outage hold by the workers once the processor takes
calls again. Releasing sends the parked messages back one at a time (``republish``), so the
queue keeps their order; the start lets those copies through the still-active hold
(``hold_passes``). Each service owns its transaction; a release sends to SQS between its
transactions, never inside one.
"""

import logging
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.db.models import CharField, Exists, F, OuterRef, Q
from django.db.models.functions import Cast, Now
from django.utils import timezone

from callbacks.models import HoldKind, ParkedMessage, PaymentHold, QueueMessage
from callbacks.services.republish import (
    parked_message_republish,
    redrive_original,
    release_copies_room,
    released_by_round,
    released_original_id,
)
from callbacks.sqs import ReceivedMessage
from payments.kernel.locks import single_flight
from payments.models import AttemptOutcome, ProcessorAttempt

logger = logging.getLogger(__name__)


def hold_passes(message: ReceivedMessage, hold: PaymentHold) -> bool:
    """A held payment still takes the messages meant to end the hold: the parked ones its own
    release republishes, and a redrive of a dead letter (a person chose to apply it now; it is
    the head of the line, since a dead letter is what stopped the payment)."""
    if released_original_id(message.deduplication_id):
        # Only a copy of the release's current round: an earlier round's copy is parked again
        # (its round started over because a copy before it was parked again).
        return released_by_round(message.deduplication_id) == (hold.pk, hold.release_round)
    return bool(redrive_original(message))


def payment_hold(
    *,
    payment_id: str,
    reason: str,
    caused_by: QueueMessage | None = None,
    kind: str = HoldKind.TRIAGE,
    supersede: bool = False,
    release_in: float | None = None,
) -> PaymentHold:
    """Put a payment on hold, or return its active hold (pointed at the newest cause).
    ``release_in``: a new outage hold is released no sooner than this many seconds from now.

    An outage hold that a person is now needed for (a message of it was dead-lettered)
    becomes a triage hold; a triage hold stays one whatever else comes. ``supersede``: the
    caller is a copy the active hold's release sent, which must wait again; the release may
    not have marked that copy's row sent yet, so the hold is superseded whatever its rows say.

    A payment has at most one active hold (a conditional unique constraint). When one exists
    and its release has not started (e.g. its redriven cause failed again), it stays and records
    the new cause. When its release is under way (some parked messages already republished), a
    republished message failed: the old hold is closed as superseded and a new one takes its
    unsent parked messages, so the copies still on the queue (marked for the old hold) are
    parked again, behind the failure, instead of being applied ahead of it.
    """
    payment_id = str(payment_id)
    with transaction.atomic():
        hold = (
            PaymentHold.objects.select_for_update()
            .filter(payment_id=payment_id, released_at__isnull=True)
            .first()
        )
        if hold is not None:
            if not supersede and not hold.parked.exclude(republished_message_id="").exists():
                return _hold_add_cause(hold, reason=reason, caused_by=caused_by, kind=kind)
            if kind == HoldKind.OUTAGE and hold.kind == HoldKind.OUTAGE:
                return _hold_start_over(hold, release_in=release_in)
            return _hold_supersede(
                hold, reason=reason, caused_by=caused_by, kind=kind, release_in=release_in
            )
        try:
            with transaction.atomic():
                return hold_create(
                    payment_id=payment_id,
                    reason=reason,
                    caused_by=caused_by,
                    kind=kind,
                    release_in=release_in,
                )
        except IntegrityError:
            # A concurrent transaction created the active hold first: that one stands.
            return PaymentHold.objects.get(payment_id=payment_id, released_at__isnull=True)


def _hold_add_cause(
    hold: PaymentHold, *, reason: str, caused_by: QueueMessage | None, kind: str
) -> PaymentHold:
    """Record a new cause on the active (locked) hold whose release has not started."""
    changed = []
    if caused_by is not None and hold.caused_by_id != caused_by.pk:
        hold.caused_by = caused_by
        hold.reason = f"{hold.reason}\n{reason}"
        changed += ["caused_by", "reason"]
    if kind == HoldKind.TRIAGE and hold.kind != HoldKind.TRIAGE:
        hold.kind = HoldKind.TRIAGE
        changed.append("kind")
        if "reason" not in changed:
            hold.reason = f"{hold.reason}\n{reason}"
            changed.append("reason")
    if changed:
        hold.save(update_fields=changed)
    return hold


def _hold_start_over(hold: PaymentHold, *, release_in: float | None) -> PaymentHold:
    """The processor is unavailable again while the (locked) outage hold's release is under
    way: the same hold waits again, its release one round further. The copies the round sent
    no longer pass it: each is parked again on its own row (``message_park``), in its place,
    and the next round sends them with new deduplication ids. An outage of N payments thus
    keeps N holds and N parked rows however often the processor comes and goes; superseding
    (a new hold and new rows each time) made that N times the reopenings."""
    hold.release_round += 1
    changed = ["release_round"]
    if release_in is not None:
        hold.release_after = Now() + timedelta(seconds=release_in)
        changed.append("release_after")
    hold.save(update_fields=changed)
    if release_in is not None:
        hold.refresh_from_db(fields=["release_after"])
    return hold


def outage_hold_reopen(
    *, message: ReceivedMessage, reason: str, release_in: float | None = None
) -> PaymentHold | None:
    """The outage hold whose release sent ``message``, open again for it to wait in once more,
    if that hold was lifted meanwhile and its payment has no active hold; else None. Call in
    the deferral's transaction (it takes the hold's lock)."""
    released = released_by_round(message.deduplication_id)
    if released is None:
        return None
    hold = (
        PaymentHold.objects.select_for_update()
        .filter(
            pk=released[0],
            payment_id=message.payment_id,
            kind=HoldKind.OUTAGE,
            released_at__isnull=False,
        )
        .first()
    )
    if hold is None:
        return None
    try:
        with transaction.atomic():
            PaymentHold.objects.filter(pk=hold.pk).update(
                released_at=None,
                released_by="",
                release_round=F("release_round") + 1,
                release_after=None if release_in is None else Now() + timedelta(seconds=release_in),
                note=f"Reopened: {reason}"[:2000],
            )
    except IntegrityError:
        return None  # another hold of the payment became active first: the copy waits there
    hold.refresh_from_db()
    logger.info(
        "outage hold %s on payment %s reopened: %s",
        hold.pk,
        hold.payment_id,
        reason,
        extra={"payment_id": hold.payment_id, "hold_id": hold.pk, "hold_kind": hold.kind},
    )
    return hold


def _hold_supersede(
    hold: PaymentHold,
    *,
    reason: str,
    caused_by: QueueMessage | None,
    kind: str,
    release_in: float | None = None,
) -> PaymentHold:
    """Close the active (locked) hold whose release is under way, and move its unsent parked
    messages to a new hold for the new cause."""
    hold.released_at = timezone.now()
    hold.released_by = "run_sqs_worker"
    hold.save(update_fields=["released_at", "released_by"])
    new_hold = hold_create(
        payment_id=hold.payment_id,
        reason=reason,
        caused_by=caused_by,
        kind=kind,
        release_in=release_in,
    )
    moved = ParkedMessage.objects.filter(hold=hold, republished_message_id="").update(hold=new_hold)
    hold.note = (
        f"Superseded by hold {new_hold.pk}: a message republished by this hold's "
        f"release failed; {moved} unsent parked message(s) moved there."
    )
    hold.save(update_fields=["note"])
    return new_hold


def hold_create(
    *,
    payment_id: str,
    reason: str,
    caused_by: QueueMessage | None,
    kind: str,
    release_in: float | None = None,
) -> PaymentHold:
    """Create the payment's active hold (the caller knows it has none) and log it;
    ``release_in``: seconds before the workers may release it (the database's clock)."""
    hold = PaymentHold.objects.create(
        payment_id=payment_id,
        reason=reason,
        caused_by=caused_by,
        kind=kind,
        release_after=None if release_in is None else Now() + timedelta(seconds=release_in),
    )
    if release_in is not None:
        hold.refresh_from_db(fields=["release_after"])
    # An outage hold is routine (the workers release it); a triage hold needs a person.
    logger.log(
        logging.INFO if kind == HoldKind.OUTAGE else logging.ERROR,
        "payment %s put on %s hold: %s",
        payment_id,
        kind,
        reason,
        extra={"payment_id": payment_id, "hold_id": hold.pk, "hold_kind": kind},
    )
    return hold


def hold_release(
    *, payment_id, released_by: str, note: str, hold: PaymentHold | None = None
) -> int:
    """Republish a held payment's parked messages in arrival order, then lift the hold.

    Sends one message at a time so the queue keeps their order (group = payment id,
    deduplication id ``<message id>:release:<hold id>``, which also lets them through the
    still-active hold), and marks each parked row as it goes: a crash part-way resends only what
    was not marked, and a resend of a marked one is dropped by SQS's deduplication. The hold is
    lifted in a transaction that locks it and finds nothing left unpublished, so a message
    parked meanwhile is never stranded. If a republished message fails for good meanwhile, the
    worker supersedes the hold (see ``payment_hold``) and this release stops sending. Safe to
    call twice; returns how many this call sent. Raises ``sqs.QueueUnavailable`` if the queue
    cannot be reached (the hold then stays). Release after redriving the message that caused
    the hold, so that one is applied first.

    ``hold`` names one hold of the payment to release instead of its active one: a hold
    superseded meanwhile is then left alone (nothing sent, 0 returned).
    """
    if not released_by:
        raise ValueError("released_by is required: say who released the hold")
    payment_id = str(payment_id)
    if hold is None:
        hold = PaymentHold.objects.filter(payment_id=payment_id, released_at__isnull=True).first()
        if hold is None:
            return 0
    elif hold.payment_id != payment_id:
        raise ValueError(f"hold {hold.pk} belongs to payment {hold.payment_id}, not {payment_id}")
    sent = 0
    # One round of the release: a copy of it parked again starts a new round, which a later
    # release sends (this one stops), so a processor still unavailable is not sent the same
    # submission over and over by one call.
    release_round = PaymentHold.objects.values_list("release_round", flat=True).get(pk=hold.pk)
    while True:
        while (row := hold.parked.filter(republished_message_id="").first()) is not None:
            if not parked_message_republish(row=row, hold=hold, release_round=release_round):
                return sent  # the hold was superseded, released or started over meanwhile
            sent += 1
        with transaction.atomic():
            locked = PaymentHold.objects.select_for_update().get(pk=hold.pk)
            if locked.released_at is not None:
                return sent  # another call released it
            if locked.release_round != release_round:
                return sent  # a copy was parked again: the hold waits for the next release
            if hold.parked.filter(republished_message_id="").exists():
                continue  # parked while we were sending: send those too
            locked.released_at = timezone.now()
            locked.released_by = released_by[:255]
            locked.note = note
            locked.save(update_fields=["released_at", "released_by", "note"])
        logger.info(
            "hold %s on payment %s released by %s: %s message(s) republished",
            hold.pk,
            hold.payment_id,
            released_by,
            sent,
            extra={"payment_id": hold.payment_id, "hold_id": hold.pk},
        )
        return sent


def outage_holds_waiting() -> bool:
    return PaymentHold.objects.filter(kind=HoldKind.OUTAGE, released_at__isnull=True).exists()


# The window the release's pace is counted over.
RELEASE_WINDOW = timedelta(seconds=1)


def outage_holds_released_recently(window: timedelta = RELEASE_WINDOW) -> int:
    """Outage holds released within the last ``window``, by any process."""
    return PaymentHold.objects.filter(
        kind=HoldKind.OUTAGE, released_at__gte=timezone.now() - window
    ).count()


def outage_holds_release(*, limit: int, trial: bool = False, per_second: int | None = None) -> int:
    """Release up to ``limit`` outage holds, oldest first: their parked messages go back to the
    queue in order. Returns how many messages were sent. One process at a time releases (a
    cluster-wide guard), so two workers do not send the same copies; SQS's deduplication would
    drop them anyway. Raises ``sqs.QueueUnavailable`` when the queue cannot be reached (the
    holds stay, for the next call).

    ``per_second``: the cap on holds released in any second by all processes together; what
    was released in the last second (counted under the guard, so two workers' ticks cannot
    both take the whole allowance) is taken off ``limit``.

    ``trial``: these are the breaker's trial calls, so payments that never failed at the
    processor go first: the oldest holds are those whose failing call opened the breaker, and
    a payment that fails on its own (a bad account) would fail the trial every time.

    Outside a trial, a hold with ``release_after`` (a submission that failed while the
    processor was degraded) waits until then, on the database's clock; a trial takes any. And
    outside a trial no more are released than the workers take (``release_copies_room``): a
    trial is the breaker's few calls, and must go whatever is on the queue."""
    sent = 0
    with single_flight("callbacks.outage_holds_release") as acquired:
        if not acquired:
            return 0
        if per_second is not None:
            limit = min(limit, per_second - outage_holds_released_recently())
        if not trial:
            # No faster than the workers take the copies (a hold sends about one): copies
            # waiting on the queue are parked again, and sent again, by any pause or reopening.
            limit = min(limit, release_copies_room())
        if limit <= 0:
            return 0
        waiting = PaymentHold.objects.filter(kind=HoldKind.OUTAGE, released_at__isnull=True)
        if not trial:
            waiting = waiting.filter(Q(release_after__isnull=True) | Q(release_after__lte=Now()))
        if trial:
            failed_before = ProcessorAttempt.objects.annotate(
                payment_text=Cast("payment_id", CharField())
            ).filter(payment_text=OuterRef("payment_id"), outcome=AttemptOutcome.RETRYABLE)
            waiting = waiting.annotate(failed_before=Exists(failed_before))
        holds = list(waiting.order_by(*(["failed_before"] if trial else []), "id")[:limit])
        for hold in holds:
            sent += hold_release(
                payment_id=hold.payment_id,
                released_by="run_sqs_worker",
                note="the processor takes calls again",
                hold=hold,
            )
    if holds:
        logger.info("released %s outage hold(s): %s message(s) back on the queue", len(holds), sent)
    return sent
