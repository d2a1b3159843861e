"""A payment's append-only history: its events, its processor attempts, the processor
events applied and the outbox."""

from django.db import models
from django.db.models.functions import Now

from payments.models.payment import Payment


class EventKind(models.TextChoices):
    CREATED = "created", "Created"
    SUBMISSION = "submission", "Submission outcome"
    PROCESSOR_EVENT = "processor_event", "Processor event"
    CANCELLATION = "cancellation", "Canceled before origination"
    REVIEW = "review", "Held for review, approved or rejected"


class EventOutcome(models.TextChoices):
    APPLIED = "applied", "Applied (state changed)"
    RECORDED = "recorded", "Recorded (no state change expected)"
    STALE = "stale", "Stale (acknowledged, nothing changed)"
    DUPLICATE = "duplicate", "Duplicate (already processed)"


class PaymentEvent(models.Model):
    """Append-only log: every transition and every processor event, whatever its outcome."""

    payment = models.ForeignKey(Payment, on_delete=models.PROTECT, related_name="events")
    kind = models.CharField(max_length=32, choices=EventKind.choices)
    outcome = models.CharField(max_length=16, choices=EventOutcome.choices)
    event_type = models.CharField(max_length=32, blank=True)
    processor_event_id = models.CharField(max_length=128, blank=True, db_index=True)
    from_state = models.CharField(max_length=16, blank=True)
    to_state = models.CharField(max_length=16, blank=True)
    payload = models.JSONField(default=dict, blank=True)
    caused_by = models.CharField(
        max_length=255, blank=True, help_text="What caused it: api:<user>, sqs:<message id>, ..."
    )
    created_at = models.DateTimeField(db_default=Now(), editable=False, db_index=True)

    class Meta:
        # Insertion order (a database sequence): created_at is the database's clock (its
        # statement time), never a worker's, but one statement's rows share it.
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.kind} {self.event_type} {self.outcome}"


class AttemptOutcome(models.TextChoices):
    ACCEPTED = "accepted", "Accepted (2xx)"
    REJECTED = "rejected", "Rejected (4xx, permanent)"
    RETRYABLE = "retryable", "Retryable (5xx, 408, 429, timeout, connection)"
    QUEUED = "queued", "Queued (the backend submits it itself, e.g. with its bank file)"


class ProcessorAttempt(models.Model):
    """One outbound call to the processor, whatever its outcome."""

    payment = models.ForeignKey(Payment, on_delete=models.PROTECT, related_name="attempts")
    attempt_number = models.PositiveIntegerField()
    operation = models.CharField(max_length=32, default="submit")
    idempotency_key = models.UUIDField()
    outcome = models.CharField(max_length=16, choices=AttemptOutcome.choices)
    http_status = models.PositiveSmallIntegerField(null=True, blank=True)
    error_kind = models.CharField(
        max_length=32, blank=True, help_text="timeout, connection, http, ... (empty when accepted)"
    )
    error = models.TextField(blank=True)
    response_body = models.TextField(blank=True)
    latency_ms = models.FloatField()
    retry_after_seconds = models.FloatField(null=True, blank=True)
    # On the database's clock too: the record's time less the call's own (monotonic) latency
    # (``payments.services.calls.attempt_record``), never the calling host's wall clock.
    started_at = models.DateTimeField(db_index=True)
    # When the attempt was recorded, on the database's clock: the breaker's failure-rate window
    # is measured on this one.
    recorded_at = models.DateTimeField(db_default=Now())

    class Meta:
        # Insertion order: two attempts' times may tie, their ids do not.
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(
                fields=["payment", "operation", "attempt_number"], name="attempt_number_unique"
            )
        ]

    def __str__(self) -> str:
        return f"attempt {self.attempt_number} {self.outcome} {self.http_status or self.error_kind}"


class ProcessedEvent(models.Model):
    """The application-level dedup record of processor events, kept far past SQS's 5 minutes."""

    processor_event_id = models.CharField(max_length=128, primary_key=True)
    payment = models.ForeignKey(Payment, on_delete=models.PROTECT, related_name="processed_events")
    event_type = models.CharField(max_length=32)
    payload_hash = models.CharField(max_length=64)
    outcome = models.CharField(max_length=16, choices=EventOutcome.choices)
    processed_at = models.DateTimeField(db_default=Now(), editable=False, db_index=True)

    def __str__(self) -> str:
        return self.processor_event_id


class OutboxMessage(models.Model):
    """A message promised in the transaction of the row that caused it; a relay publishes it."""

    kind = models.CharField(max_length=32)
    group_id = models.CharField(max_length=128)
    body = models.JSONField()
    # The request id and trace of the request that caused it, sent as the message's attributes
    # (payments.kernel.propagation): the worker's records of the message name them.
    carried = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    published_at = models.DateTimeField(null=True, blank=True)
    publish_attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)

    class Meta:
        ordering = ["id"]
        indexes = [
            models.Index(
                fields=["id"],
                condition=models.Q(published_at__isnull=True),
                name="outbox_unpublished",
            )
        ]

    def __str__(self) -> str:
        return f"outbox {self.id} {self.kind} ({'published' if self.published_at else 'pending'})"

    @property
    def deduplication_id(self) -> str:
        return f"outbox-{self.id}"
