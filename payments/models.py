"""Payments, their append-only history, the merchant ledger and the idempotency records.

State changes go through ``payments.services`` only: the FSM field is protected, transitions
change the state in memory, and the service saves them under a row lock.
"""

import uuid
from decimal import Decimal

from django.core.validators import MinValueValidator
from django.db import models
from django_fsm import FSMField, FSMModelMixin, transition


class PaymentState(models.TextChoices):
    PENDING = "pending", "Pending"
    SUBMITTED = "submitted", "Submitted"
    CONFIRMED = "confirmed", "Confirmed"
    FAILED = "failed", "Failed"


# How far along a state is; an event whose target ranks below the current state is stale.
STATE_RANK = {
    PaymentState.PENDING: 0,
    PaymentState.SUBMITTED: 1,
    PaymentState.CONFIRMED: 2,
    PaymentState.FAILED: 2,
}
FINAL_STATES = (PaymentState.CONFIRMED, PaymentState.FAILED)


class Payment(FSMModelMixin, models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    merchant_id = models.CharField(max_length=64, db_index=True)
    amount = models.DecimalField(
        max_digits=14, decimal_places=2, validators=[MinValueValidator(Decimal("0.01"))]
    )
    currency = models.CharField(max_length=3, default="USD")
    source_token = models.CharField(
        max_length=128, help_text="The processor's token for the bank account; never a raw number."
    )
    description = models.CharField(max_length=255, blank=True)
    idempotency_key = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    state = FSMField(
        default=PaymentState.PENDING, choices=PaymentState.choices, protected=True, db_index=True
    )
    processor_id = models.CharField(max_length=128, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    updated_at = models.DateTimeField(auto_now=True)
    state_changed_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(amount__gt=0), name="payment_amount_positive"
            ),
        ]
        indexes = [models.Index(fields=["state", "state_changed_at"])]

    def __str__(self) -> str:
        return f"{self.id} {self.amount} {self.currency} ({self.state})"

    # The transitions only change the state in memory; payments.services saves them.
    @transition(field=state, source=PaymentState.PENDING, target=PaymentState.SUBMITTED)
    def submit(self) -> None:
        pass

    @transition(field=state, source=PaymentState.PENDING, target=PaymentState.FAILED)
    def reject(self) -> None:
        """The processor refused the submission (4xx): it never reached the ACH network."""

    @transition(field=state, source=PaymentState.SUBMITTED, target=PaymentState.CONFIRMED)
    def confirm(self) -> None:
        pass

    @transition(field=state, source=PaymentState.SUBMITTED, target=PaymentState.FAILED)
    def fail(self) -> None:
        pass


class EventKind(models.TextChoices):
    CREATED = "created", "Created"
    SUBMISSION = "submission", "Submission outcome"
    PROCESSOR_EVENT = "processor_event", "Processor event"


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
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.kind} {self.event_type} {self.outcome}"


class AttemptOutcome(models.TextChoices):
    ACCEPTED = "accepted", "Accepted (2xx)"
    REJECTED = "rejected", "Rejected (4xx, permanent)"
    RETRYABLE = "retryable", "Retryable (5xx, 408, 429, timeout, connection)"


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
    started_at = models.DateTimeField(db_index=True)

    class Meta:
        ordering = ["started_at", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["payment", "operation", "attempt_number"], name="attempt_number_unique"
            )
        ]

    def __str__(self) -> str:
        return f"attempt {self.attempt_number} {self.outcome} {self.http_status or self.error_kind}"


class LedgerEntryKind(models.TextChoices):
    CREDIT = "credit", "Credit"


class LedgerEntry(models.Model):
    """A merchant credit, written once per confirmed payment: the unique constraint is the guard."""

    payment = models.ForeignKey(Payment, on_delete=models.PROTECT, related_name="ledger_entries")
    merchant_id = models.CharField(max_length=64, db_index=True)
    kind = models.CharField(max_length=16, choices=LedgerEntryKind.choices)
    amount = models.DecimalField(max_digits=14, decimal_places=2)
    currency = models.CharField(max_length=3)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]
        verbose_name_plural = "ledger entries"
        constraints = [
            models.UniqueConstraint(fields=["payment", "kind"], name="ledger_one_entry_per_kind")
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.amount} {self.currency} to {self.merchant_id}"


class ProcessedEvent(models.Model):
    """The application-level dedup record of processor events, kept far past SQS's 5 minutes."""

    processor_event_id = models.CharField(max_length=128, primary_key=True)
    payment = models.ForeignKey(Payment, on_delete=models.PROTECT, related_name="processed_events")
    event_type = models.CharField(max_length=32)
    payload_hash = models.CharField(max_length=64)
    outcome = models.CharField(max_length=16, choices=EventOutcome.choices)
    processed_at = models.DateTimeField(auto_now_add=True, db_index=True)

    def __str__(self) -> str:
        return self.processor_event_id


class OutboxMessage(models.Model):
    """A message promised in the transaction of the row that caused it; a relay publishes it."""

    kind = models.CharField(max_length=32)
    group_id = models.CharField(max_length=128)
    body = models.JSONField()
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


class ApiIdempotencyKey(models.Model):
    """Idempotency-Key header records for POST /api/payments/ (kept at least 24 hours)."""

    user = models.ForeignKey("auth.User", on_delete=models.CASCADE)
    key = models.CharField(max_length=255)
    request_hash = models.CharField(max_length=64)
    response_status = models.PositiveSmallIntegerField(null=True, blank=True)
    response_body = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    completed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "key"], name="api_idempotency_key_unique")
        ]

    def __str__(self) -> str:
        return self.key


class BreakerState(models.TextChoices):
    CLOSED = "closed", "Closed (calls flow)"
    OPEN = "open", "Open (no calls until the pause ends)"
    HALF_OPEN = "half_open", "Half-open (one probe call decides)"


class CircuitBreaker(models.Model):
    """The shared state of the circuit breaker around one dependency (the processor).

    One row per dependency, read by every worker process and changed only by conditional
    UPDATEs in ``payments.processor.breaker``, so two processes never both open it, both take
    the half-open probe, or both close it.
    """

    name = models.CharField(max_length=32, primary_key=True)
    state = models.CharField(
        max_length=16, choices=BreakerState.choices, default=BreakerState.CLOSED
    )
    consecutive_failures = models.PositiveIntegerField(default=0)
    opened_at = models.DateTimeField(
        null=True, blank=True, help_text="Start of the current incident; empty while closed."
    )
    open_until = models.DateTimeField(
        null=True, blank=True, help_text="When the half-open probe may be taken."
    )
    reopen_count = models.PositiveIntegerField(
        default=0, help_text="Failed probes in this incident: each one doubles the pause."
    )
    probe_until = models.DateTimeField(
        null=True, blank=True, help_text="The probe's lease: another may be taken after it."
    )
    paused_until = models.DateTimeField(
        null=True, blank=True, help_text="Calls paused by a 429 Retry-After, for every worker."
    )
    last_error = models.TextField(blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.name} breaker ({self.state})"


class BreakerTransitionKind(models.TextChoices):
    OPENED = "opened", "Opened"
    PROBING = "probing", "Half-open probe taken"
    REOPENED = "reopened", "Probe failed: reopened"
    CLOSED = "closed", "Closed"
    PAUSED = "paused", "Paused by 429 Retry-After"


class CircuitBreakerTransition(models.Model):
    """Append-only history of a breaker: when each incident started and ended, and why."""

    breaker = models.ForeignKey(
        CircuitBreaker, on_delete=models.PROTECT, related_name="transitions"
    )
    kind = models.CharField(max_length=16, choices=BreakerTransitionKind.choices)
    reason = models.TextField(blank=True)
    pause_seconds = models.FloatField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.breaker_id} {self.kind} at {self.created_at:%Y-%m-%d %H:%M:%S}"
