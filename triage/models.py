"""Dead letters waiting for a human, the audit trail of what humans did, alert history, and
beat's heartbeat."""

from django.conf import settings
from django.db import models
from django.db.models.functions import Now


class DeadLetterStatus(models.TextChoices):
    OPEN = "open", "Open"
    REDRIVEN = "redriven", "Redriven"
    RESOLVED = "resolved", "Resolved (fixed elsewhere)"
    DISCARDED = "discarded", "Discarded"


class DeadLetterSource(models.TextChoices):
    WORKER = "worker", "Moved by the worker (attempts exhausted or permanent error)"
    REDRIVE_POLICY = "redrive_policy", "Moved by the queue's RedrivePolicy (worker crashed)"


class DeadLetter(models.Model):
    """A message taken out of the DLQ into the database, where it waits for a decision."""

    original_message_id = models.CharField(
        max_length=128,
        unique=True,
        help_text="The main queue's message id: ingestion is idempotent on it.",
    )
    dlq_message_id = models.CharField(max_length=128)
    payment_id = models.UUIDField(null=True, blank=True, db_index=True)
    kind = models.CharField(max_length=32, db_index=True)
    group_id = models.CharField(max_length=128)
    deduplication_id = models.CharField(max_length=128, blank=True)
    processor_event_id = models.CharField(max_length=128, blank=True, db_index=True)
    body = models.JSONField()
    attributes = models.JSONField(default=dict)
    source = models.CharField(max_length=16, choices=DeadLetterSource.choices)
    attempts = models.PositiveIntegerField(default=0)
    first_failed_at = models.DateTimeField(null=True, blank=True)
    last_failed_at = models.DateTimeField(null=True, blank=True)
    last_error_class = models.CharField(max_length=255, blank=True, db_index=True)
    last_error_message = models.TextField(blank=True)
    status = models.CharField(
        max_length=16,
        choices=DeadLetterStatus.choices,
        default=DeadLetterStatus.OPEN,
        db_index=True,
    )
    ingested_at = models.DateTimeField(db_default=Now(), editable=False, db_index=True)
    status_changed_at = models.DateTimeField(db_default=Now(), editable=False)
    redrive_message_id = models.CharField(max_length=128, blank=True)

    class Meta:
        ordering = ["-ingested_at"]
        # The changelist orders by (-ingested_at, -id), mostly filtered by status: a page is
        # read from an index in that order (ingested_at's own index without a filter, this one
        # with), never by sorting the table.
        indexes = [
            models.Index(
                fields=["status", "-ingested_at", "-id"], name="deadletter_status_ingested"
            ),
        ]
        permissions = [
            ("act_on_deadletter", "Can redrive, resolve or discard dead letters"),
        ]

    def __str__(self) -> str:
        return f"dead letter {self.original_message_id} ({self.kind}, {self.status})"


class TriageDashboard(DeadLetter):
    """No data of its own: gives the triage dashboard its place in the admin index."""

    class Meta:
        proxy = True
        verbose_name = "triage dashboard"
        verbose_name_plural = "triage dashboard"


class TriageActionKind(models.TextChoices):
    REDRIVE = "redrive", "Redrive"
    RESOLVE = "resolve", "Resolve"
    DISCARD = "discard", "Discard"
    RELEASE_HOLD = "release_hold", "Release the payment's hold"


class TriageAction(models.Model):
    """Audit row: who did what to which dead letter, when, why, and the status before and after."""

    dead_letter = models.ForeignKey(DeadLetter, on_delete=models.PROTECT, related_name="actions")
    action = models.CharField(max_length=16, choices=TriageActionKind.choices)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT)
    note = models.TextField()
    status_before = models.CharField(max_length=16, choices=DeadLetterStatus.choices)
    status_after = models.CharField(max_length=16, choices=DeadLetterStatus.choices)
    details = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(db_default=Now(), editable=False, db_index=True)
    bulk_job = models.ForeignKey(
        "BulkTriageJob",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="actions",
        help_text="The bulk job that took this action; empty for an action taken one by one.",
    )

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.action} by {self.user_id} at {self.created_at:%Y-%m-%d %H:%M}"


class BulkJobStatus(models.TextChoices):
    PENDING = "pending", "Waiting for a worker"
    RUNNING = "running", "Running"
    INTERRUPTED = "interrupted", "Interrupted (resume it)"
    CANCELLED = "cancelled", "Cancelled"
    COMPLETED = "completed", "Completed"


UNFINISHED_JOB_STATUSES = [BulkJobStatus.PENDING, BulkJobStatus.RUNNING, BulkJobStatus.INTERRUPTED]


class BulkTriageJob(models.Model):
    """One action on every open dead letter that matched a changelist filter at confirmation.

    The matched set is frozen into ``BulkTriageJobItem`` rows when the operator confirms, so the
    job acts on exactly what was counted and shown, never on dead letters that arrive later.
    The counts are kept up to date item by item, so the progress page reads one row.
    """

    action = models.CharField(max_length=16, choices=TriageActionKind.choices)
    filters = models.TextField(
        blank=True, help_text="The changelist querystring the operator confirmed."
    )
    note = models.TextField()
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT)
    status = models.CharField(
        max_length=16, choices=BulkJobStatus.choices, default=BulkJobStatus.PENDING, db_index=True
    )
    total = models.PositiveIntegerField(default=0)
    done = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    skipped = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)
    cancelled_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="+",
    )

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name = "bulk triage job"

    def __str__(self) -> str:
        return f"bulk {self.action} {self.pk} ({self.status}, {self.processed}/{self.total})"

    @property
    def processed(self) -> int:
        return self.done + self.failed + self.skipped


class BulkItemOutcome(models.TextChoices):
    PENDING = "pending", "Pending"
    DONE = "done", "Done"
    FAILED = "failed", "Failed (refused by the action)"
    SKIPPED = "skipped", "Skipped (no longer open)"


class BulkTriageJobItem(models.Model):
    """One dead letter of a bulk job, in the order the job acts (oldest ingested first)."""

    job = models.ForeignKey(BulkTriageJob, on_delete=models.CASCADE, related_name="items")
    dead_letter = models.ForeignKey(DeadLetter, on_delete=models.PROTECT, related_name="+")
    position = models.PositiveIntegerField()
    outcome = models.CharField(
        max_length=16, choices=BulkItemOutcome.choices, default=BulkItemOutcome.PENDING
    )
    reason = models.TextField(blank=True)

    class Meta:
        ordering = ["job", "position"]
        constraints = [
            models.UniqueConstraint(fields=["job", "dead_letter"], name="bulk_item_once_per_job"),
        ]
        # The task takes its next batch as "pending items of this job, by position".
        indexes = [
            models.Index(fields=["job", "outcome", "position"], name="bulk_item_next"),
        ]

    def __str__(self) -> str:
        return f"job {self.job_id} item {self.position}: dead letter {self.dead_letter_id}"


class AlertSeverity(models.TextChoices):
    HIGH = "high", "High (pages)"
    MEDIUM = "medium", "Medium"
    LOW = "low", "Low"


class AlertStatus(models.TextChoices):
    FIRING = "firing", "Firing"
    RESOLVED = "resolved", "Resolved"


class Alert(models.Model):
    """One alert condition, identified by its key; it fires, reminds and resolves."""

    key = models.CharField(max_length=255, db_index=True)
    severity = models.CharField(max_length=8, choices=AlertSeverity.choices)
    status = models.CharField(
        max_length=16, choices=AlertStatus.choices, default=AlertStatus.FIRING, db_index=True
    )
    summary = models.TextField()
    details = models.JSONField(default=dict, blank=True)
    payment_id = models.UUIDField(null=True, blank=True, db_index=True)
    first_fired_at = models.DateTimeField(auto_now_add=True, db_index=True)
    last_fired_at = models.DateTimeField(auto_now_add=True)
    last_notified_at = models.DateTimeField(null=True, blank=True)
    notify_count = models.PositiveIntegerField(default=0)
    suppressed_count = models.PositiveIntegerField(default=0)
    resolved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-first_fired_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["key"],
                condition=models.Q(status="firing"),
                name="alert_one_firing_per_key",
            )
        ]

    def __str__(self) -> str:
        return f"[{self.severity}] {self.key} ({self.status})"


class AlertNotification(models.Model):
    """Each message sent (or tried) to a sink about an alert."""

    alert = models.ForeignKey(Alert, on_delete=models.PROTECT, related_name="notifications")
    kind = models.CharField(max_length=16)  # fired, reminder, resolved
    sink = models.CharField(max_length=16)  # log, webhook, email
    ok = models.BooleanField()
    error = models.TextField(blank=True)
    sent_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["sent_at", "id"]

    def __str__(self) -> str:
        return f"{self.kind} via {self.sink} ({'ok' if self.ok else 'failed'})"


class BeatHeartbeat(models.Model):
    """When beat's heartbeat task last ran, in database time: one row, upserted each tick
    (``triage.operations.heartbeat``). Its age is what says beat, and a worker taking its
    tasks, are still going."""

    # Always 1: the check keeps the table at one row whoever writes it.
    id = models.PositiveSmallIntegerField(primary_key=True, default=1, editable=False)
    beat_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.CheckConstraint(condition=models.Q(id=1), name="beat_heartbeat_one_row")
        ]

    def __str__(self) -> str:
        return f"beat ran at {self.beat_at.isoformat()}"
