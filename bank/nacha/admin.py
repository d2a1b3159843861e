"""NACHA files and entries in the admin: what was cut, for which window, and delivered when.

A file's bytes hold account numbers, so its content is never shown; ``nacha_inspect`` prints
a file with the accounts masked.
"""

from django.contrib import admin

from bank.nacha.models import (
    NachaEntry,
    NachaFile,
    NachaInboundEvent,
    NachaInboundFile,
    NachaPrenote,
)
from payments.admin_base import ReadOnlyInline, ReadOnlyModelAdmin


class NachaEntryInline(ReadOnlyInline):
    model = NachaEntry
    fields = ("trace_number", "payment", "batch_number", "sec_code", "refused_reason")
    readonly_fields = fields

    def get_readonly_fields(self, request, obj=None):
        return self.fields


class NachaPrenoteInline(ReadOnlyInline):
    model = NachaPrenote
    fields = ("trace_number", "validation", "sec_code", "refused_reason")
    readonly_fields = fields

    def get_readonly_fields(self, request, obj=None):
        return self.fields


@admin.register(NachaFile)
class NachaFileAdmin(ReadOnlyModelAdmin):
    list_display = (
        "name",
        "window_name",
        "effective_entry_date",
        "entry_count",
        "total_debit_cents",
        "created_at",
        "delivered_at",
    )
    list_filter = ("window_name", "effective_entry_date")
    fields = (
        "name",
        "window_name",
        "bank_cutoff_at",
        "effective_entry_date",
        "creation_date",
        "file_id_modifier",
        "entry_count",
        "total_debit_cents",
        "sha256",
        "created_at",
        "delivered_at",
        "delivered_to",
        "delivery_conflict_at",
    )
    readonly_fields = fields

    def get_readonly_fields(self, request, obj=None):
        return self.fields

    inlines = [NachaEntryInline, NachaPrenoteInline]


@admin.register(NachaEntry)
class NachaEntryAdmin(ReadOnlyModelAdmin):
    list_display = ("trace_number", "payment", "file", "sec_code", "refused_reason", "created_at")
    search_fields = ("trace_number", "payment__id")
    fields = (
        "trace_number",
        "payment",
        "file",
        "batch_number",
        "sec_code",
        "refused_reason",
        "created_at",
    )
    readonly_fields = fields

    def get_readonly_fields(self, request, obj=None):
        return self.fields


@admin.register(NachaPrenote)
class NachaPrenoteAdmin(ReadOnlyModelAdmin):
    """Prenotes (an account's validation by a zero-dollar entry): queued, cut into a file or
    refused with the reason; their answers are the inbound events that name them."""

    list_display = (
        "trace_number",
        "validation",
        "merchant_id",
        "file",
        "sec_code",
        "refused_reason",
        "created_at",
    )
    list_filter = ("sec_code",)
    search_fields = ("trace_number", "account_token", "merchant_id")
    fields = (
        "trace_number",
        "validation",
        "account_token",
        "merchant_id",
        "file",
        "sec_code",
        "refused_reason",
        "created_at",
    )
    readonly_fields = fields

    def get_readonly_fields(self, request, obj=None):
        return self.fields

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("validation", "file")


class NachaInboundEventInline(ReadOnlyInline):
    model = NachaInboundEvent
    fields = (
        "record_number",
        "code",
        "event_type",
        "original_trace_number",
        "payment",
        "prenote",
        "published_at",
    )
    readonly_fields = fields

    def get_readonly_fields(self, request, obj=None):
        return self.fields


@admin.register(NachaInboundFile)
class NachaInboundFileAdmin(ReadOnlyModelAdmin):
    """What the bank sent: imported, or refused whole with the record and the reason (the file
    is kept; ``nacha_inspect`` on its bytes shows it with accounts masked)."""

    list_display = (
        "name",
        "status",
        "refused_record",
        "refused_reason",
        "entry_count",
        "received_at",
    )
    list_filter = ("status",)
    search_fields = ("name", "sha256")
    fields = (
        "name",
        "status",
        "refused_record",
        "refused_reason",
        "entry_count",
        "sha256",
        "received_at",
    )
    readonly_fields = fields
    inlines = [NachaInboundEventInline]

    def get_readonly_fields(self, request, obj=None):
        return self.fields
