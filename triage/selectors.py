"""Reads of triage: one payment's whole story for the dead-letter page, and the dashboard numbers.

The dashboard numbers are plain functions returning plain data so ``/metrics`` can reuse them.
Every function here issues a fixed number of queries, whatever the size of the history.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db.models import Count, DurationField, ExpressionWrapper, F, Min, Q, QuerySet
from django.utils import timezone

from callbacks import sqs
from callbacks.models import (
    UNFINISHED_STATUSES,
    HoldKind,
    ParkedMessage,
    PaymentHold,
    ProcessingError,
    QueueMessage,
    QueueMessageStatus,
)
from callbacks.selectors import payment_dead_lettered_message_ids
from payments.messages import MessageKind, event_fields, message_kind
from payments.models import (
    BreakerState,
    CircuitBreaker,
    CircuitBreakerTransition,
    Payment,
    PaymentEvent,
    PaymentState,
    ProcessorAttempt,
)
from triage.models import DeadLetter, DeadLetterStatus, TriageAction

# --- One payment's story -----------------------------------------------------------------------


@dataclass
class TimelineStep:
    at: datetime
    from_state: str
    to_state: str
    cause: str
    event_type: str


@dataclass
class DeadLetterStory:
    dead_letter: DeadLetter
    payment: Payment | None
    queue_message: QueueMessage | None  # the worker's record of the dead message
    errors: list[ProcessingError]  # the dead message's failed attempts, oldest first
    other_errors: list[ProcessingError]  # the payment's other messages' failures
    attempts: list[ProcessorAttempt]
    events: list[PaymentEvent]
    timeline: list[TimelineStep]
    messages: list[QueueMessage]  # every message of the payment the worker started, in order
    holds: list[PaymentHold]  # with ``parked`` prefetched, newest first
    active_hold: PaymentHold | None
    parked: list[ParkedMessage]  # the active hold's parked messages, in order
    dead_letters: list[DeadLetter]  # all of the payment's dead letters, oldest first
    actions: list[TriageAction]  # triage actions on any of them, oldest first
    release_blockers: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ParkedEvent:
    """What a parked message would do once released, as the dead-letter page shows it."""

    kind: str  # the envelope's kind: ``processor_event``, ``submit_payment``, ...
    event_type: str  # the processor's event type; blank for our own messages
    processor_event_id: str
    amount: str
    currency: str
    description: str  # one line for the operator


def _text(value) -> str:
    return value if isinstance(value, str) else ""


def parked_event(body, kind: str = "") -> ParkedEvent:
    """The event a parked message carries. A processor event sits under ``event`` in the queue
    envelope; reading the envelope's top level (as before the envelope nested it) finds
    nothing, and the operator could not tell what waits behind the hold."""
    kind = message_kind(body) or kind
    if kind == MessageKind.PROCESSOR_EVENT:
        fields = event_fields(body)
        event_type = _text(fields.get("event_type"))
        event_id = _text(fields.get("processor_event_id"))
        amount = _text(fields.get("amount"))
        currency = _text(fields.get("currency"))
        description = " ".join(
            part for part in (event_type or "unknown event", amount, currency) if part
        )
        return ParkedEvent(kind, event_type, event_id, amount, currency, description)
    if kind == MessageKind.SUBMIT_PAYMENT:
        return ParkedEvent(kind, "", "", "", "", "submission of the payment to the processor")
    return ParkedEvent(kind, "", "", "", "", kind or "message of unknown kind")


def dead_letter_story(dead_letter: DeadLetter) -> DeadLetterStory:
    """Everything known about the dead letter's payment, in about a dozen queries."""
    group = dead_letter.group_id
    payment = (
        Payment.objects.filter(pk=dead_letter.payment_id).first()
        if dead_letter.payment_id
        else None
    )
    errors, other_errors = _errors_split(dead_letter)
    messages = _payment_messages(group)
    attempts: list[ProcessorAttempt] = []
    events: list[PaymentEvent] = []
    if payment is not None:
        attempts = list(payment.attempts.order_by("started_at", "id"))
        events = list(payment.events.order_by("created_at", "id"))
    holds = _payment_holds(group)
    active_hold = next((h for h in holds if h.released_at is None), None)
    dead_letters = _payment_dead_letters(dead_letter)
    story = DeadLetterStory(
        dead_letter=dead_letter,
        payment=payment,
        queue_message=next(
            (m for m in messages if m.message_id == dead_letter.original_message_id), None
        ),
        errors=errors,
        other_errors=other_errors,
        attempts=attempts,
        events=events,
        timeline=_timeline(payment, events),
        messages=messages,
        holds=holds,
        active_hold=active_hold,
        parked=list(active_hold.parked.all()) if active_hold else [],
        dead_letters=dead_letters,
        actions=list(
            TriageAction.objects.filter(dead_letter__in=[d.pk for d in dead_letters])
            .select_related("user")
            .order_by("created_at", "id")
        ),
    )
    if active_hold is not None:
        story.release_blockers = hold_release_blockers(group, ignoring=dead_letter.pk)
    return story


def _errors_split(
    dead_letter: DeadLetter,
) -> tuple[list[ProcessingError], list[ProcessingError]]:
    """The dead message's own failures, and the payment's other messages' ones (one query)."""
    message_id = dead_letter.original_message_id
    all_errors = list(
        ProcessingError.objects.filter(
            Q(payment_id=dead_letter.group_id) | Q(message_id=message_id)
        ).order_by("created_at", "id")
    )
    return (
        [e for e in all_errors if e.message_id == message_id],
        [e for e in all_errors if e.message_id != message_id],
    )


def _payment_messages(group: str) -> list[QueueMessage]:
    if not group:
        return []
    return list(
        QueueMessage.objects.filter(group_id=group)
        .defer("body", "raw_body")
        .order_by("sequence_number", "first_started_at", "id")
    )


def _payment_holds(group: str) -> list[PaymentHold]:
    if not group:
        return []
    holds = list(
        PaymentHold.objects.filter(payment_id=group)
        .select_related("caused_by")
        .prefetch_related("parked")
        .order_by("-created_at", "-id")
    )
    # The prefetched rows are the ones the page (and ``story.parked``) iterates.
    for hold in holds:
        for parked in hold.parked.all():
            parked.event = parked_event(parked.body, parked.kind)
    return holds


def _payment_dead_letters(dead_letter: DeadLetter) -> list[DeadLetter]:
    if not dead_letter.group_id:
        return [dead_letter]
    return list(
        DeadLetter.objects.filter(group_id=dead_letter.group_id)
        .defer("body", "attributes")
        .order_by("ingested_at", "id")
    )


def _timeline(payment: Payment | None, events: list[PaymentEvent]) -> list[TimelineStep]:
    if payment is None:
        return []
    steps = [TimelineStep(payment.created_at, "", PaymentState.PENDING, "created", "")]
    for event in events:
        if event.to_state and event.from_state and event.to_state != event.from_state:
            steps.append(
                TimelineStep(
                    event.created_at,
                    event.from_state,
                    event.to_state,
                    event.caused_by,
                    event.event_type or event.kind,
                )
            )
    return steps


# --- Dashboard numbers -------------------------------------------------------------------------

LATENCY_BUCKETS: list[tuple[str, timedelta | None]] = [
    ("< 1 s", timedelta(seconds=1)),
    ("1 s – 1 min", timedelta(minutes=1)),
    ("1 min – 1 h", timedelta(hours=1)),
    ("1 h – 1 day", timedelta(days=1)),
    ("> 1 day", None),
]
AGE_BUCKETS: list[tuple[str, str, timedelta | None, timedelta | None]] = [
    ("lt1h", "less than 1 hour", None, timedelta(hours=1)),
    ("1h-1d", "1 hour to 1 day", timedelta(hours=1), timedelta(days=1)),
    ("1d-7d", "1 to 7 days", timedelta(days=1), timedelta(days=7)),
    ("gt7d", "more than 7 days", timedelta(days=7), None),
]
DAY = timedelta(hours=24)
ZERO = timedelta(0)


@dataclass(frozen=True)
class OpenDeadLetters:
    count: int
    oldest_ingested_at: datetime | None
    oldest_age: timedelta | None


def dead_letters_open_summary(*, now: datetime | None = None) -> OpenDeadLetters:
    now = now or timezone.now()
    row = DeadLetter.objects.filter(status=DeadLetterStatus.OPEN).aggregate(
        count=Count("id"), oldest=Min("ingested_at")
    )
    oldest = row["oldest"]
    return OpenDeadLetters(row["count"], oldest, (now - oldest) if oldest else None)


@dataclass(frozen=True)
class QueueDepth:
    name: str
    visible: int | None = None
    in_flight: int | None = None
    delayed: int | None = None
    error: str = ""  # why the depth is unavailable

    @property
    def available(self) -> bool:
        return not self.error


def queue_depths() -> list[QueueDepth]:
    """Main queue and DLQ depth from SQS attributes; a queue that cannot be read is reported
    with the reason instead of raising."""
    from callbacks import conf as callbacks_conf

    depths = []
    for name, url_of in (
        (callbacks_conf.SQS_QUEUE_NAME, sqs.main_queue_url),
        (callbacks_conf.SQS_DLQ_NAME, sqs.dead_letter_queue_url),
    ):
        try:
            attributes = sqs.queue_attributes(
                url_of(),
                [
                    "ApproximateNumberOfMessages",
                    "ApproximateNumberOfMessagesNotVisible",
                    "ApproximateNumberOfMessagesDelayed",
                ],
            )
        except sqs.QueueUnavailable as exc:
            depths.append(QueueDepth(name=name, error=str(exc)))
            continue
        depths.append(
            QueueDepth(
                name=name,
                visible=int(attributes.get("ApproximateNumberOfMessages", 0)),
                in_flight=int(attributes.get("ApproximateNumberOfMessagesNotVisible", 0)),
                delayed=int(attributes.get("ApproximateNumberOfMessagesDelayed", 0)),
            )
        )
    return depths


@dataclass(frozen=True)
class UnfinishedMessages:
    count: int
    oldest_age: timedelta | None  # None when nothing is unfinished


def unfinished_messages(*, now: datetime | None = None) -> UnfinishedMessages:
    """Messages the worker started and has not finished (in progress or retrying), and the age
    of the oldest from its own records (SQS has no such attribute; on AWS, CloudWatch's
    ApproximateAgeOfOldestMessage is the queue-side equivalent)."""
    now = now or timezone.now()
    row = QueueMessage.objects.filter(status__in=UNFINISHED_STATUSES).aggregate(
        count=Count("pk"), oldest=Min("enqueued_at")
    )
    oldest = row["oldest"]
    return UnfinishedMessages(row["count"], None if oldest is None else max(now - oldest, ZERO))


def oldest_unfinished_age(*, now: datetime | None = None) -> timedelta | None:
    """Age of the oldest message the worker started and has not finished."""
    return unfinished_messages(now=now).oldest_age


def payments_on_hold() -> QuerySet[PaymentHold]:
    """Active holds for a person, oldest first, with the number of messages parked behind
    each (outage holds are released by the workers, not by a person)."""
    return (
        PaymentHold.objects.filter(released_at__isnull=True, kind=HoldKind.TRIAGE)
        .annotate(parked_count=Count("parked", filter=Q(parked__republished_message_id="")))
        .order_by("created_at", "id")
    )


@dataclass(frozen=True)
class ReprocessingRate:
    total: int
    reprocessed: int  # needed more than one attempt

    @property
    def ratio(self) -> float | None:
        return self.reprocessed / self.total if self.total else None


def reprocessing_rate(*, window: timedelta = DAY, now: datetime | None = None) -> ReprocessingRate:
    """Messages first started in the window that needed more than one attempt, of all."""
    now = now or timezone.now()
    row = QueueMessage.objects.filter(first_started_at__gte=now - window).aggregate(
        total=Count("id"), reprocessed=Count("id", filter=Q(attempts__gt=1))
    )
    return ReprocessingRate(row["total"], row["reprocessed"])


def enqueue_to_applied_buckets(
    *, window: timedelta = DAY, now: datetime | None = None
) -> list[tuple[str, int]]:
    """Messages done in the window, counted by enqueue-to-applied latency bucket."""
    now = now or timezone.now()
    latency = ExpressionWrapper(F("finished_at") - F("enqueued_at"), output_field=DurationField())
    counts = {}
    lower = None
    for label, upper in LATENCY_BUCKETS:
        condition = Q()
        if lower is not None:
            condition &= Q(latency__gte=lower)
        if upper is not None:
            condition &= Q(latency__lt=upper)
        counts[label] = Count("id", filter=condition)
        lower = upper
    row = (
        QueueMessage.objects.filter(
            status=QueueMessageStatus.DONE,
            finished_at__gte=now - window,
            enqueued_at__isnull=False,
        )
        .annotate(latency=latency)
        .aggregate(**{f"b{i}": c for i, c in enumerate(counts.values())})
    )
    return [(label, row[f"b{i}"]) for i, label in enumerate(counts)]


def payments_stuck(*, limit: int = 10) -> QuerySet[Payment]:
    """Payments waiting longest in ``pending`` or ``submitted``."""
    return Payment.objects.filter(
        state__in=[PaymentState.PENDING, PaymentState.SUBMITTED]
    ).order_by("state_changed_at")[:limit]


def error_classes_ranked(
    *, window: timedelta = DAY, now: datetime | None = None, limit: int = 10
) -> list[tuple[str, int]]:
    """Processing error classes in the window, most frequent first."""
    now = now or timezone.now()
    rows = (
        ProcessingError.objects.filter(created_at__gte=now - window)
        .values("error_class")
        .annotate(n=Count("id"))
        .order_by("-n", "error_class")[:limit]
    )
    return [(r["error_class"], r["n"]) for r in rows]


def dead_letters_by_error_class(*, limit: int = 10) -> list[tuple[str, int]]:
    """Open dead letters by last error class, most frequent first."""
    rows = (
        DeadLetter.objects.filter(status=DeadLetterStatus.OPEN)
        .values("last_error_class")
        .annotate(n=Count("id"))
        .order_by("-n", "last_error_class")[:limit]
    )
    return [(r["last_error_class"] or "(no error recorded)", r["n"]) for r in rows]


def age_bucket_filter(key: str, *, now: datetime | None = None) -> Q | None:
    """The ``ingested_at`` condition for an age bucket key of ``AGE_BUCKETS``."""
    now = now or timezone.now()
    for bucket_key, _, older_than, younger_than in AGE_BUCKETS:
        if bucket_key == key:
            condition = Q()
            if older_than is not None:
                condition &= Q(ingested_at__lte=now - older_than)
            if younger_than is not None:
                condition &= Q(ingested_at__gt=now - younger_than)
            return condition
    return None


# --- The processor's circuit breaker -----------------------------------------------------------


@dataclass(frozen=True)
class BreakerStatus:
    state: str
    opened_at: datetime | None
    open_for: timedelta | None
    next_probe_in: timedelta | None
    paused_for: timedelta | None  # a 429 Retry-After pause still running
    last_error: str
    payments_waiting: int
    transitions: list[CircuitBreakerTransition]

    @property
    def is_open(self) -> bool:
        return self.state != BreakerState.CLOSED


def processor_breaker_status(*, now: datetime | None = None, history: int = 10) -> BreakerStatus:
    """The breaker as the dashboard shows it: three queries."""
    from payments.processor.breaker import PROCESSOR

    now = now or timezone.now()
    breaker = CircuitBreaker.objects.filter(name=PROCESSOR).first() or CircuitBreaker(
        name=PROCESSOR
    )
    recent = CircuitBreakerTransition.objects.filter(breaker_id=PROCESSOR)
    transitions = list(recent.order_by("-created_at", "-id")[:history])

    def ahead(moment: datetime | None) -> timedelta | None:
        return moment - now if moment is not None and moment > now else None

    return BreakerStatus(
        state=breaker.state,
        opened_at=breaker.opened_at,
        open_for=(now - breaker.opened_at) if breaker.opened_at else None,
        next_probe_in=ahead(breaker.open_until) if breaker.state == BreakerState.OPEN else None,
        paused_for=ahead(breaker.paused_until),
        last_error=breaker.last_error,
        payments_waiting=Payment.objects.filter(state=PaymentState.PENDING).count(),
        transitions=transitions,
    )


def hold_release_blockers(group_id: str, *, ignoring: int | None = None) -> list[str]:
    """Why the payment's hold must stay: its open dead letters (except ``ignoring``, the one
    about to be acted on), and messages the worker dead-lettered that have not been ingested
    from the DLQ yet. Empty = it may be released."""
    if not group_id:
        return ["the dead letter has no message group, so no payment hold belongs to it"]
    blockers = [
        f"dead letter {pk} is still open"
        for pk in DeadLetter.objects.filter(group_id=group_id, status=DeadLetterStatus.OPEN)
        .exclude(pk=ignoring)
        .values_list("pk", flat=True)
    ]
    dead_ids = payment_dead_lettered_message_ids(group_id)
    if dead_ids:
        ingested = set(
            DeadLetter.objects.filter(original_message_id__in=dead_ids).values_list(
                "original_message_id", flat=True
            )
        )
        blockers += [
            f"message {mid} was dead-lettered but is not ingested from the DLQ yet"
            for mid in sorted(dead_ids - ingested)
        ]
    return blockers
