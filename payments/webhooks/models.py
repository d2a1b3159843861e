"""Events, the endpoints that want them, each delivery of an event to an endpoint and its
attempts, and the operators' actions on them. Part of the payments app (its migrations)."""

import uuid

from django.conf import settings
from django.db import models
from django.db.models.functions import Now


def event_id_new() -> str:
    return f"evt_{uuid.uuid4().hex}"


def api_version_pinned() -> str:
    """A new endpoint's version when none is named: the host's pin (``PAYMENTS["API_VERSION"]``).
    Also what the migration gave the endpoints made before endpoints had versions."""
    from payments import conf

    return conf.API_VERSION


class Event(models.Model):
    """Something that happened to a merchant's money, with the object as the API shows it.

    ``position`` is given after commit, in the order events are seen committed
    (``delivery.events_dispatch``): a reader paging by it never skips an event that committed
    late, as it could paging by an id taken inside a longer transaction."""

    id = models.CharField(primary_key=True, max_length=40, default=event_id_new, editable=False)
    type = models.CharField(max_length=64)
    merchant_id = models.CharField(max_length=64)
    object_id = models.CharField(max_length=64)
    data = models.JSONField()
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    position = models.BigIntegerField(null=True, blank=True, unique=True)

    class Meta:
        indexes = [
            models.Index(fields=["merchant_id", "position"], name="event_merchant_position"),
            models.Index(
                fields=["created_at"],
                condition=models.Q(position__isnull=True),
                name="event_undispatched",
            ),
            models.Index(fields=["created_at"], name="event_created"),
            models.Index(fields=["object_id", "position"], name="event_object_position"),
        ]

    def __str__(self) -> str:
        return f"{self.id} {self.type}"


class WebhookEndpoint(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    merchant_id = models.CharField(max_length=64, db_index=True)
    url = models.CharField(max_length=2048)
    description = models.CharField(max_length=255, blank=True)
    # Event types it wants; empty: every type.
    event_types = models.JSONField(default=list, blank=True)
    # Thin: each event's object as its id and kind only; the receiver reads the rest back.
    thin = models.BooleanField(default=False)
    # Ordered: an event about a payment waits until the earlier ones about it are delivered.
    ordered = models.BooleanField(default=False)
    # The API version its events are rendered in (``payments.webhooks.versions``), as Stripe
    # pins a webhook endpoint's; one of ``payments.api_versions.VERSIONS``.
    api_version = models.CharField(max_length=10, default=api_version_pinned)
    # ``whsec_`` + base64 of 32 random bytes; shown once, when made or rotated.
    secret = models.CharField(max_length=128, editable=False)
    previous_secret = models.CharField(max_length=128, blank=True, editable=False)
    previous_secret_expires_at = models.DateTimeField(null=True, blank=True, editable=False)
    enabled = models.BooleanField(default=True)
    disabled_at = models.DateTimeField(null=True, blank=True)
    disabled_reason = models.CharField(max_length=255, blank=True)
    consecutive_failures = models.PositiveIntegerField(default=0)
    failing_since = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["created_at"]

    def __str__(self) -> str:
        return f"{self.merchant_id} {self.url[:80]}"

    def wants(self, event_type: str) -> bool:
        return not self.event_types or event_type in self.event_types


class DeliveryStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed (retries exhausted)"


class WebhookDelivery(models.Model):
    """One event for one endpoint: sent with the event's id as ``webhook-id`` on every attempt
    until the endpoint answers 2xx or the retry schedule is spent. ``next_attempt_at`` is also
    the lease of an attempt under way: a sender that dies leaves it to expire, then it is sent
    again."""

    endpoint = models.ForeignKey(
        WebhookEndpoint, on_delete=models.CASCADE, related_name="deliveries"
    )
    event = models.ForeignKey(Event, on_delete=models.CASCADE, related_name="deliveries")
    status = models.CharField(
        max_length=16, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING
    )
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(db_default=Now())
    last_status_code = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "webhook deliveries"
        constraints = [
            models.UniqueConstraint(fields=["endpoint", "event"], name="webhook_delivery_once")
        ]
        indexes = [
            models.Index(
                fields=["next_attempt_at"],
                condition=models.Q(status="pending"),
                name="webhook_delivery_due",
            )
        ]

    def __str__(self) -> str:
        return f"{self.event_id} -> {self.endpoint_id} ({self.status})"


class WebhookAttempt(models.Model):
    """One request of a delivery: what came back, how fast; never the secret or a signature."""

    delivery = models.ForeignKey(WebhookDelivery, on_delete=models.CASCADE, related_name="tries")
    number = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    latency_ms = models.PositiveIntegerField()
    status_code = models.PositiveIntegerField(null=True, blank=True)
    error = models.CharField(max_length=255, blank=True)
    response_head = models.TextField(blank=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"attempt {self.number} of {self.delivery_id}: {self.status_code or self.error}"


class WebhookActionKind(models.TextChoices):
    REPLAY = "replay", "Replay"
    ENABLE = "enable", "Enable"
    DISABLE = "disable", "Disable"
    ROTATE_SECRET = "rotate_secret", "Rotate secret"
    DELETE = "delete", "Delete"


class WebhookAction(models.Model):
    """Audit of what a person (or the failure rule) did to an endpoint or its deliveries."""

    kind = models.CharField(max_length=16, choices=WebhookActionKind.choices)
    # Kept when its endpoint is deleted: the audit outlives what it audits.
    endpoint = models.ForeignKey(
        WebhookEndpoint, on_delete=models.SET_NULL, related_name="actions", null=True
    )
    # Which endpoint, of which merchant, still said once the endpoint is deleted.
    endpoint_ref = models.CharField(max_length=36, blank=True, db_index=True)
    merchant_id = models.CharField(max_length=64, blank=True)
    deliveries = models.PositiveIntegerField(default=0)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True
    )
    actor_label = models.CharField(max_length=150)
    note = models.TextField(blank=True)
    created_at = models.DateTimeField(db_default=Now(), editable=False)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"{self.kind} by {self.actor_label}"
