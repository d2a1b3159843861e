"""What the queue worker knows about the messages it handled, their failures, and payment holds.

``payment_id`` columns hold the message group id, which by contract is the payment id; they are
strings so a message whose body is unreadable can still be recorded and held against its group.
"""

from django.db import models
from django.db.models.functions import Now

SEQUENCE_NUMBER_WIDTH = 40  # SQS FIFO sequence numbers are up to 128 bits: at most 39 digits.


def sequence_key(sequence_number: str | int | None) -> str:
    """A zero-padded form of an SQS sequence number so that string order is numeric order."""
    if sequence_number in (None, ""):
        return ""
    return str(int(sequence_number)).zfill(SEQUENCE_NUMBER_WIDTH)


class QueueMessageStatus(models.TextChoices):
    IN_PROGRESS = "in_progress", "In progress"
    RETRYING = "retrying", "Retrying (hidden for its backoff)"
    DONE = "done", "Done"
    DEAD_LETTERED = "dead_lettered", "Dead-lettered"
    PARKED = "parked", "Parked (payment on hold)"


UNFINISHED_STATUSES = (QueueMessageStatus.IN_PROGRESS, QueueMessageStatus.RETRYING)
FINISHED_STATUSES = (
    QueueMessageStatus.DONE,
    QueueMessageStatus.DEAD_LETTERED,
    QueueMessageStatus.PARKED,
)


class QueueMessage(models.Model):
    """One SQS message the worker has started, counted in the database, not by SQS.

    ``attempts`` is raised in its own committed transaction just before the work starts, so an
    attempt that crashes the process still counts, and group-mates released untouched behind a
    failing message (whose SQS receive counts rise anyway) never get a row until they start.
    """

    # Indexed through Meta (unique constraint, plain index): a field's own unique/db_index
    # would add a second, LIKE-only index per column on PostgreSQL, written on every insert.
    message_id = models.CharField(max_length=128)
    kind = models.CharField(max_length=64, blank=True)
    group_id = models.CharField(max_length=128)
    payment_id = models.CharField(max_length=128, blank=True)
    deduplication_id = models.CharField(max_length=128, blank=True)
    sequence_number = models.CharField(
        max_length=SEQUENCE_NUMBER_WIDTH, blank=True, help_text="Zero-padded so it orders."
    )
    body = models.JSONField(
        null=True,
        blank=True,
        help_text=(
            "Null when the body is not JSON, or for a processor event started with its batch "
            "and applied cleanly (the payment's event log holds its payload); written with "
            "the error row when such a message fails."
        ),
    )
    raw_body = models.TextField(blank=True, help_text="The body as received when not JSON.")
    enqueued_at = models.DateTimeField(null=True, blank=True, help_text="SQS SentTimestamp.")
    first_started_at = models.DateTimeField()
    last_started_at = models.DateTimeField()
    attempts = models.PositiveIntegerField(default=0)
    status = models.CharField(max_length=16, choices=QueueMessageStatus.choices)
    outcome = models.CharField(max_length=32, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    last_error_class = models.CharField(max_length=255, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-first_started_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["message_id"], name="queuemessage_message_id_unique")
        ]
        indexes = [
            models.Index(fields=["status", "enqueued_at"], name="queuemessage_status_enqueued"),
            # Also serves "an unfinished message earlier in the group" (status is checked on
            # the group's few rows), which had an index of its own on (group_id, status).
            models.Index(
                fields=["group_id", "sequence_number"], name="queuemessage_group_sequence"
            ),
            models.Index(fields=["payment_id"], name="queuemessage_payment"),
        ]

    def __str__(self) -> str:
        return f"{self.kind or '?'} {self.message_id} ({self.status})"


class ProcessingError(models.Model):
    """One failed attempt, written in its own transaction after the work's rolled back."""

    queue_message = models.ForeignKey(QueueMessage, on_delete=models.PROTECT, related_name="errors")
    payment_id = models.CharField(max_length=128, blank=True, db_index=True)
    message_id = models.CharField(max_length=128)
    attempt_number = models.PositiveIntegerField()
    error_class = models.CharField(max_length=255)
    message = models.TextField(blank=True)
    traceback = models.TextField(blank=True)
    retryable = models.BooleanField()
    delay_seconds = models.FloatField(
        null=True, blank=True, help_text="Backoff chosen; empty when it was dead-lettered."
    )
    created_at = models.DateTimeField(db_default=Now(), editable=False, db_index=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.error_class} on attempt {self.attempt_number} of {self.message_id}"


class HoldKind(models.TextChoices):
    # A message was dead-lettered or went missing: a person decides (triage).
    TRIAGE = "triage", "Waiting for a person"
    # The processor could not be called (breaker open, or calls paused by a 429): the workers
    # release it themselves once calls may flow.
    OUTAGE = "outage", "Waiting for the processor"


class PaymentHold(models.Model):
    """A payment whose messages must wait, in the database and in order, off the queue.

    While active, the worker parks the payment's messages instead of applying them; releasing
    the hold republishes them in their original order. A triage hold waits for a person; an
    outage hold holds a submission the processor could not take (and whatever of its payment
    came after it) and is released by the workers when calls may flow, so no outage, however
    long, makes SQS hand a message out again and again towards its RedrivePolicy.
    """

    payment_id = models.CharField(max_length=128, db_index=True)
    kind = models.CharField(max_length=16, choices=HoldKind.choices, default=HoldKind.TRIAGE)
    reason = models.TextField()
    caused_by = models.ForeignKey(
        QueueMessage,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="holds_caused",
    )
    created_at = models.DateTimeField(db_default=Now(), editable=False, db_index=True)
    release_after = models.DateTimeField(
        null=True,
        blank=True,
        help_text=(
            "An outage hold the workers release only after this (the database's clock): a "
            "submission that failed while the processor was degraded waits its backoff here. "
            "Empty: as soon as calls may flow."
        ),
    )
    released_at = models.DateTimeField(null=True, blank=True)
    released_by = models.CharField(max_length=255, blank=True)
    note = models.TextField(blank=True)
    # A default in the database too: code that predates the column (a rolling deploy) still
    # inserts holds.
    release_round = models.PositiveIntegerField(
        default=0,
        db_default=0,
        help_text=(
            "How many times an outage hold's release started over: a submission it sent back met "
            "the processor unavailable again and waits here once more. The copies a release "
            "sends carry the round, so each round's copies are new to SQS and a copy of an "
            "earlier round no longer passes the hold."
        ),
    )

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["payment_id"],
                condition=models.Q(released_at__isnull=True),
                name="one_active_hold_per_payment",
            )
        ]
        indexes = [
            # The workers' release of outage holds, oldest first, looks only at active ones.
            models.Index(
                fields=["kind", "id"],
                condition=models.Q(released_at__isnull=True),
                name="hold_active_by_kind",
            ),
            # The release's pace: how many outage holds the workers released in the last second.
            models.Index(
                fields=["kind", "released_at"],
                condition=models.Q(released_at__isnull=False),
                name="hold_released_by_kind",
            ),
        ]

    def __str__(self) -> str:
        state = "released" if self.released_at else "active"
        return f"hold {self.id} on {self.payment_id} ({state})"

    @property
    def is_active(self) -> bool:
        return self.released_at is None


class ParkedMessage(models.Model):
    """A message that arrived while its payment was on hold: kept here, deleted from SQS."""

    hold = models.ForeignKey(PaymentHold, on_delete=models.PROTECT, related_name="parked")
    payment_id = models.CharField(max_length=128, db_index=True)
    message_id = models.CharField(max_length=128, unique=True)
    sequence_number = models.CharField(max_length=SEQUENCE_NUMBER_WIDTH, blank=True)
    kind = models.CharField(max_length=64, blank=True)
    body = models.JSONField()
    # The request id and trace the message carried (payments.kernel.propagation), sent again with
    # it.
    carried = models.JSONField(default=dict, blank=True)
    arrived_at = models.DateTimeField(null=True, blank=True, help_text="SQS SentTimestamp.")
    parked_at = models.DateTimeField(db_default=Now(), editable=False)
    released_at = models.DateTimeField(null=True, blank=True)
    republished_message_id = models.CharField(max_length=128, blank=True)

    class Meta:
        # Sequence numbers order a group's messages on the queue: arrival order.
        ordering = ["sequence_number", "id"]

    def __str__(self) -> str:
        return f"parked {self.message_id} for {self.payment_id}"


class ProcessorEventsCursor(models.Model):
    """How far the pull of the processor's events got (``callbacks.events_pull``): one row per
    processor backend, so a host that changes processors does not send one processor's cursor
    to the other.

    ``cursor`` is the processor's opaque cursor after the last page whose events are all on the
    queue ("" = from its first event); it only moves forward from the value a pass read (a
    compare-and-set), so a pass that crashed or lost a race resumes from a page it may have
    queued already: at least once onto the queue, once in the ledger (SQS's deduplication and
    the processed-event record).
    """

    source = models.CharField(
        max_length=255, primary_key=True, help_text="The backend's dotted path."
    )
    cursor = models.CharField(max_length=512, blank=True)
    pulled_at = models.DateTimeField(
        null=True, blank=True, help_text="The end of the last successful pass (database time)."
    )
    newest_event_at = models.DateTimeField(
        null=True, blank=True, help_text="The timestamp of the newest event pulled."
    )
    events_pulled = models.PositiveBigIntegerField(default=0)
    events_new = models.PositiveBigIntegerField(
        default=0, help_text="Pulled before the worker had applied them: recovered or in flight."
    )
    events_known = models.PositiveBigIntegerField(
        default=0, help_text="Already applied when pulled (delivered by callback)."
    )
    events_malformed = models.PositiveBigIntegerField(
        default=0, help_text="Breaking the event contract: dead-lettered with their errors."
    )
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.source} after {self.cursor or '(start)'}"
