"""Putting a message back on the main queue, and the marks that say why it came back.

The queue layer annotates a body it sends again: a dead letter's copy carries
``DEAD_LETTER_KEY``, a redrive carries ``REDRIVE_KEY`` (its original's message id), and a copy
sent by a hold's release carries the hold in its deduplication id (``RELEASE_MARK``). The
annotations are stripped before a body is republished, and read back when the copy arrives:
the start lets a redrive and a release's own copies through a hold (``holds.hold_passes``).
Every send here acts on SQS at once and is never called inside a transaction.
"""

import re
from datetime import timedelta

from django.db import transaction
from django.db.models import Count, Exists, OuterRef
from django.utils import timezone

from callbacks import sqs
from callbacks.models import HoldKind, ParkedMessage, PaymentHold, QueueMessage, QueueMessageStatus
from callbacks.sqs import ReceivedMessage
from payments import messages
from payments.kernel import propagation
from payments.messages import DEAD_LETTER_KEY, REDRIVE_KEY

__all__ = ["DEAD_LETTER_KEY", "REDRIVE_KEY"]  # and the functions below: the names callbacks uses

RELEASE_MARK = ":release:"
# A copy sent to the back of its group (``message_send_behind``): the first message's id, this
# mark, and the number of the move.
BEHIND_MARK = ":behind:"

# The room the outage holds' release always has, in copies: a receive's batch for each of two
# workers, so a release that has seen none taken yet still starts, and the pace can grow.
RELEASE_ROOM_FLOOR = 20
# What the workers took from the releases lately: within this window. It must be longer than
# the gap between two releases, or it sees none of the last release's copies taken and holds
# every release to its floor: a worker ticks every second at best and after its batch at worst
# (1.4 s apart under the bench's drain, where a 1 s window kept 5,000 payments to 18 calls/s
# and 282 s). Copies on the queue are taken off the room, so a longer window does not let
# them pile up: workers slower than the release leave about the window's work, less a tick's,
# and the floor waiting.
RELEASE_TAKEN_WINDOW = timedelta(seconds=3)
# A copy no worker took within this long is no longer waited for (a worker died receiving it,
# the queue was purged): it does not hold the release's room for ever.
RELEASE_COPY_HORIZON = timedelta(seconds=30)


def released_original_id(deduplication_id: str) -> str:
    """The parked message id a release copy was made from ("" for any other message)."""
    original, mark, _ = deduplication_id.rpartition(RELEASE_MARK)
    return original if mark else ""


def release_token(hold_id: int, release_round: int) -> str:
    """What a copy sent by round ``release_round`` of hold ``hold_id``'s release carries after
    ``RELEASE_MARK``: the hold's id, then ``.<round>`` from the second round on (the first
    round's copies keep the form they always had)."""
    return f"{hold_id}.{release_round}" if release_round else str(hold_id)


def released_by_round(deduplication_id: str) -> tuple[int, int] | None:
    """The (hold id, release round) whose release sent this copy; None for any other message."""
    _, mark, token = deduplication_id.rpartition(RELEASE_MARK)
    if not mark:
        return None
    hold_id, _, release_round = token.partition(".")
    try:
        return int(hold_id), int(release_round or 0)
    except ValueError:
        return None


def release_copies_room(
    *,
    floor: int = RELEASE_ROOM_FLOOR,
    window: timedelta = RELEASE_TAKEN_WINDOW,
    horizon: timedelta = RELEASE_COPY_HORIZON,
) -> int:
    """How many more copies the release of outage holds may send now: as many as the workers
    took from the releases within the last ``window`` (and ``floor`` more, so the pace can
    grow), less the copies sent that no worker has taken yet (sent within ``horizon``).

    A copy waits on the queue until a worker takes it. Sent faster than the workers take them,
    copies pile up there, and a 429's pause or a reopening of the breaker then parks every one
    of them again, each to be sent once more (which is how the demo's 30 s outage sent 2,934
    copies for 494 payments). Sent no faster than they are taken, a pause or a reopening
    catches about a window's worth. A copy taken is one a worker started and did not park
    again; a copy parked again has its row unsent (``message_park``), so it counts as
    neither."""
    now = timezone.now()
    copy = QueueMessage.objects.filter(message_id=OuterRef("republished_message_id"))
    taken = copy.filter(first_started_at__gte=now - window).exclude(
        status=QueueMessageStatus.PARKED
    )
    counts = (
        ParkedMessage.objects.filter(
            hold__kind=HoldKind.OUTAGE, hold__released_at__gte=now - horizon
        )
        .exclude(republished_message_id="")
        .aggregate(
            in_flight=Count("pk", filter=~Exists(copy)),
            taken=Count("pk", filter=Exists(taken)),
        )
    )
    return floor + counts["taken"] - counts["in_flight"]


def redrive_original(message: ReceivedMessage) -> str:
    """The message id a redrive replaces ("" when ``message`` is no redrive)."""
    return messages.redrive_original(message.body)


def parked_message_republish(
    *, row: ParkedMessage, hold: PaymentHold, release_round: int | None = None
) -> bool:
    """Send one parked message back to the main queue as part of round ``release_round`` of
    ``hold``'s release (by default the round ``hold`` was read in) and mark it; False (nothing
    sent, or nothing marked) when the hold is no longer active, the row no longer its, or the
    release started over meanwhile (a copy it sent was parked again: the row waits for the
    next round, and this one's mark must not say it was sent)."""
    release_round = hold.release_round if release_round is None else release_round
    current = PaymentHold.objects.filter(
        pk=hold.pk, released_at__isnull=True, release_round=release_round
    )
    if not current.exists():
        return False
    new_id = sqs.send_message_now(
        body=messages.republishable(row.body),
        group_id=row.payment_id,
        deduplication_id=(
            f"{row.message_id}{RELEASE_MARK}{release_token(hold.pk, release_round)}"[:128]
        ),
        attributes=propagation.message_attributes(row.carried),
    )
    with transaction.atomic():
        # Under the hold's lock, which a copy parked again takes too: either its round is
        # still this one and the row is marked sent, or the round moved on and it is not.
        if not current.select_for_update().exists():
            return False
        marked = ParkedMessage.objects.filter(
            pk=row.pk, hold=hold, republished_message_id=""
        ).update(republished_message_id=new_id, released_at=timezone.now())
    return bool(marked)


# A copy's deduplication id, whole: the first message's id, the mark, the move's number. Parsed
# whole, never by the mark alone: an outside event id may hold ":behind:" too (its messages'
# deduplication ids end in ".<fingerprint>", so they never match).
_BEHIND = re.compile(rf"(?P<first>.+){re.escape(BEHIND_MARK)}(?P<moves>[0-9]+)")


def _moved(deduplication_id: str) -> re.Match | None:
    return _BEHIND.fullmatch(deduplication_id)


def moves_behind(deduplication_id: str) -> int:
    """How many times the message was sent to the back of its group before (0 for one never
    moved)."""
    moved = _moved(deduplication_id)
    return int(moved["moves"]) if moved else 0


def message_send_behind(*, message: ReceivedMessage, moves: int) -> str:
    """Send ``message`` again, as it came, to the back of its group, as its ``moves``-th move;
    return the copy's message id. The caller then marks the message done and deletes it.

    The copy's deduplication id is the first message's id and the move's number: a move sent
    twice (the worker died before the message was deleted, and moved it again) is dropped by
    SQS within its window, and the event's own deduplication applies it once whatever comes."""
    moved = _moved(message.deduplication_id)
    first = moved["first"] if moved else message.message_id
    return sqs.send_message_now(
        body=message.body,
        group_id=message.group_id,
        deduplication_id=f"{first}{BEHIND_MARK}{moves}"[:128],
        attributes=propagation.message_attributes(propagation.carried(message.message_attributes)),
    )


def message_republish(
    *,
    deduplication_id: str,
    queue_message_id: int | None = None,
    body: dict | None = None,
    group_id: str | None = None,
    original_message_id: str = "",
) -> str:
    """Send a dead-lettered message back to the main queue now; return the new message id.

    Give either ``queue_message_id`` (a QueueMessage the worker recorded) or ``body`` and
    ``group_id`` (e.g. a message read from the DLQ). The body keeps its fields, loses the
    queue layer's annotations, and gains ``redrive.original_message_id``: the worker applies it
    although its payment's hold is still active (it is the message the hold waits for).
    """
    if not deduplication_id:
        raise ValueError("deduplication_id is required")
    if queue_message_id is not None:
        queue_message = QueueMessage.objects.get(pk=queue_message_id)
        if queue_message.body is None:
            raise ValueError(
                f"message {queue_message.message_id} has no JSON body; it cannot be republished"
            )
        body, group_id = queue_message.body, queue_message.group_id
        original_message_id = original_message_id or queue_message.message_id
    if not isinstance(body, dict) or not group_id:
        raise ValueError("give queue_message_id, or body (a JSON object) and group_id")
    dead_letter = body.get(messages.DEAD_LETTER_KEY)
    if not original_message_id and isinstance(dead_letter, dict):
        original_message_id = dead_letter.get("original_message_id") or ""
    new_body = messages.redrive_marked(
        body, original_message_id=original_message_id, republished_at=timezone.now()
    )
    return sqs.send_message_now(
        body=new_body, group_id=str(group_id), deduplication_id=deduplication_id[:128]
    )
