"""Read-only admin for the queue layer's records: what the worker did, and why it stopped.

Holds are released through ``callbacks.services.hold_release`` (the triage screens call it),
never by editing a row here.
"""

import json

from django.contrib import admin
from django.utils.html import format_html

from callbacks.models import (
    ParkedMessage,
    PaymentHold,
    ProcessingError,
    ProcessorEventsCursor,
    QueueMessage,
)
from payments.admin_base import ReadOnlyInline, ReadOnlyModelAdmin


def _pre(text: str):
    return format_html("<pre>{}</pre>", text)


class ProcessingErrorInline(ReadOnlyInline):
    model = ProcessingError
    fields = ["created_at", "attempt_number", "error_class", "message", "retryable"]
    ordering = ["created_at", "id"]


@admin.register(QueueMessage)
class QueueMessageAdmin(ReadOnlyModelAdmin):
    list_display = [
        "message_id",
        "kind",
        "payment_id",
        "status",
        "outcome",
        "attempts",
        "enqueued_at",
        "finished_at",
    ]
    list_filter = ["status", "kind", "outcome"]
    search_fields = ["=message_id", "=payment_id", "=group_id", "=deduplication_id"]
    date_hierarchy = "enqueued_at"
    inlines = [ProcessingErrorInline]
    list_per_page = 50

    def get_readonly_fields(self, request, obj=None):
        return [*super().get_readonly_fields(request, obj), "body_pretty"]

    @admin.display(description="Body")
    def body_pretty(self, obj):
        return _pre(json.dumps(obj.body, indent=2, sort_keys=True) if obj.body else obj.raw_body)


@admin.register(ProcessingError)
class ProcessingErrorAdmin(ReadOnlyModelAdmin):
    list_display = [
        "created_at",
        "payment_id",
        "message_id",
        "attempt_number",
        "error_class",
        "retryable",
        "delay_seconds",
    ]
    list_filter = ["retryable", "error_class"]
    search_fields = ["=payment_id", "=message_id"]
    date_hierarchy = "created_at"
    list_select_related = ["queue_message"]
    exclude = ["traceback"]
    list_per_page = 50

    def get_readonly_fields(self, request, obj=None):
        fields = [f for f in super().get_readonly_fields(request, obj) if f != "traceback"]
        return [*fields, "traceback_pre"]

    @admin.display(description="Traceback")
    def traceback_pre(self, obj):
        return _pre(obj.traceback)


class ParkedMessageInline(ReadOnlyInline):
    model = ParkedMessage
    fields = [
        "sequence_number",
        "message_id",
        "kind",
        "arrived_at",
        "released_at",
        "republished_message_id",
    ]


@admin.register(PaymentHold)
class PaymentHoldAdmin(ReadOnlyModelAdmin):
    list_display = [
        "payment_id",
        "kind",
        "created_at",
        "release_after",
        "released_at",
        "released_by",
        "caused_by",
    ]
    list_filter = [("released_at", admin.EmptyFieldListFilter), "kind"]
    search_fields = ["=payment_id"]
    date_hierarchy = "created_at"
    list_select_related = ["caused_by"]
    inlines = [ParkedMessageInline]
    list_per_page = 50


@admin.register(ParkedMessage)
class ParkedMessageAdmin(ReadOnlyModelAdmin):
    list_display = ["payment_id", "message_id", "kind", "arrived_at", "released_at", "hold"]
    list_filter = [("released_at", admin.EmptyFieldListFilter), "kind"]
    search_fields = ["=payment_id", "=message_id"]
    list_select_related = ["hold"]
    list_per_page = 50


@admin.register(ProcessorEventsCursor)
class ProcessorEventsCursorAdmin(ReadOnlyModelAdmin):
    """How far the pull of the processor's events got, and what it found; moved only by the
    pull itself (``processor_events_pull``)."""

    list_display = [
        "source",
        "cursor",
        "pulled_at",
        "newest_event_at",
        "events_pulled",
        "events_new",
        "events_known",
        "events_malformed",
    ]
