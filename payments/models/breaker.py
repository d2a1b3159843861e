"""The processor's circuit breaker and its transitions."""

from django.db import models
from django.db.models.functions import Now


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
        null=True,
        blank=True,
        help_text=(
            "Start of the current incident (the database's clock); it outlasts a close by "
            "PROCESSOR_BREAKER_INCIDENT_COOLDOWN_SECONDS, so a reopening soon after is the "
            "same incident. Empty when there is none."
        ),
    )
    open_until = models.DateTimeField(
        null=True, blank=True, help_text="When the half-open probe may be taken."
    )
    reopen_count = models.PositiveIntegerField(
        default=0, help_text="Reopenings in this incident: each one doubles the pause."
    )
    probe_until = models.DateTimeField(
        null=True,
        blank=True,
        help_text="The half-open trial's lease: after it, a new trial may be started.",
    )
    trial_admitted = models.PositiveIntegerField(
        default=0, help_text="Half-open: real submissions admitted as trials in this lease."
    )
    trial_succeeded = models.PositiveIntegerField(
        default=0, help_text="Half-open: trial submissions the processor accepted."
    )
    closed_at = models.DateTimeField(
        null=True, blank=True, help_text="When the breaker last closed (the database's clock)."
    )
    window_after_attempt = models.BigIntegerField(
        default=0,
        help_text="Only submissions after this attempt id count toward the failure rate (the "
        "last attempt before the last close).",
    )
    paused_until = models.DateTimeField(
        null=True, blank=True, help_text="Calls paused by a 429 Retry-After, for every worker."
    )
    degraded_since = models.DateTimeField(
        null=True,
        blank=True,
        help_text=(
            "Since when calls fail for many payments while others go through (the database's "
            "clock): a failure then spends no payment's retry budget. Empty when not degraded."
        ),
    )
    degraded_seen_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text=(
            "The last failure judged a degradation; once none for "
            "PROCESSOR_BREAKER_INCIDENT_COOLDOWN_SECONDS, the degradation is over."
        ),
    )
    last_error = models.TextField(blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.name} breaker ({self.state})"


class BreakerTransitionKind(models.TextChoices):
    OPENED = "opened", "Opened"
    PROBING = "probing", "Half-open: trial submissions admitted"
    REOPENED = "reopened", "Reopened in the same incident"
    CLOSED = "closed", "Closed"
    RESOLVED = "resolved", "Incident over: closed for the cool-down"
    PAUSED = "paused", "Paused by 429 Retry-After"
    DEGRADED = "degraded", "Degraded: calls fail for many payments while others go through"
    RECOVERED = "recovered", "No longer degraded"


class CircuitBreakerTransition(models.Model):
    """Append-only history of a breaker: when each incident started and ended, and why."""

    breaker = models.ForeignKey(
        CircuitBreaker, on_delete=models.PROTECT, related_name="transitions"
    )
    kind = models.CharField(max_length=16, choices=BreakerTransitionKind.choices)
    reason = models.TextField(blank=True)
    pause_seconds = models.FloatField(null=True, blank=True)
    # The database's clock, as every time of the breaker's: a process whose clock is wrong
    # cannot misdate an incident.
    created_at = models.DateTimeField(db_default=Now(), db_index=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.breaker_id} {self.kind} at {self.created_at:%Y-%m-%d %H:%M:%S}"
