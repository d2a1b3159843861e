"""Admin for payments: history is read-only, the state is never edited by hand."""

import json

from django.contrib import admin
from django.utils.html import format_html

from payments.models import (
    CircuitBreaker,
    CircuitBreakerTransition,
    LedgerEntry,
    MerchantAccess,
    MerchantReturnDay,
    OutboxMessage,
    Payment,
    PaymentEvent,
    PaymentReturn,
    ProcessedEvent,
    ProcessorAttempt,
)
from payments.return_codes import return_code_label


class ReadOnlyAdminMixin:
    """Audit data: no add, no change, no delete; every field read-only."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class ReadOnlyModelAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in self.model._meta.fields]


class ReadOnlyInline(ReadOnlyAdminMixin, admin.TabularInline):
    extra = 0
    can_delete = False
    show_change_link = True

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in self.model._meta.fields]


class PaymentEventInline(ReadOnlyInline):
    model = PaymentEvent
    fields = [
        "created_at",
        "kind",
        "event_type",
        "outcome",
        "from_state",
        "to_state",
        "processor_event_id",
        "caused_by",
    ]


class ProcessorAttemptInline(ReadOnlyInline):
    model = ProcessorAttempt
    fields = [
        "started_at",
        "attempt_number",
        "operation",
        "outcome",
        "http_status",
        "error_kind",
        "latency_ms",
        "error",
    ]


class LedgerEntryInline(ReadOnlyInline):
    model = LedgerEntry
    fields = ["created_at", "kind", "amount", "currency", "merchant_id"]


class PaymentReturnInline(ReadOnlyInline):
    model = PaymentReturn
    fields = [
        "reason",
        "category",
        "after_settlement",
        "returned_at",
        "deadline",
        "flags_display",
        "processor_event_id",
    ]

    def get_readonly_fields(self, request, obj=None):
        return self.fields

    @admin.display(description="reason code")
    def reason(self, obj):
        return return_code_label(obj.reason_code)

    @admin.display(description="flags")
    def flags_display(self, obj):
        return ", ".join(obj.flags) or "—"


@admin.register(Payment)
class PaymentAdmin(admin.ModelAdmin):
    list_display = ["id", "merchant_id", "amount", "currency", "state", "created_at"]
    list_filter = ["state", "currency", "created_at"]
    search_fields = ["=id", "=idempotency_key", "merchant_id", "=processor_id"]
    date_hierarchy = "created_at"
    inlines = [PaymentEventInline, ProcessorAttemptInline, LedgerEntryInline, PaymentReturnInline]
    list_per_page = 50
    show_full_result_count = False

    def get_readonly_fields(self, request, obj=None):
        # The state moves only through services; nothing about a payment is edited by hand.
        return [f.name for f in self.model._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(PaymentEvent)
class PaymentEventAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = [
        "created_at",
        "payment",
        "kind",
        "event_type",
        "outcome",
        "from_state",
        "to_state",
    ]
    list_filter = ["kind", "outcome", "event_type"]
    search_fields = ["=payment__id", "processor_event_id"]
    list_select_related = ["payment"]
    readonly_fields = ["payload_pretty"]

    @admin.display(description="payload")
    def payload_pretty(self, obj):
        return format_html("<pre>{}</pre>", json.dumps(obj.payload, indent=2, sort_keys=True))


@admin.register(ProcessorAttempt)
class ProcessorAttemptAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = [
        "started_at",
        "payment",
        "attempt_number",
        "outcome",
        "http_status",
        "error_kind",
        "latency_ms",
    ]
    list_filter = ["outcome", "error_kind", "http_status"]
    search_fields = ["=payment__id", "=idempotency_key"]
    list_select_related = ["payment"]


@admin.register(LedgerEntry)
class LedgerEntryAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["created_at", "merchant_id", "kind", "amount", "currency", "payment"]
    list_filter = ["kind", "currency"]
    search_fields = ["merchant_id", "=payment__id"]
    list_select_related = ["payment"]


@admin.register(ProcessedEvent)
class ProcessedEventAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["processor_event_id", "payment", "event_type", "outcome", "processed_at"]
    list_filter = ["event_type", "outcome"]
    search_fields = ["=processor_event_id", "=payment__id"]
    list_select_related = ["payment"]


@admin.register(OutboxMessage)
class OutboxMessageAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["id", "kind", "group_id", "created_at", "published_at", "publish_attempts"]
    list_filter = ["kind", ("published_at", admin.EmptyFieldListFilter)]
    search_fields = ["=group_id"]


@admin.register(PaymentReturn)
class PaymentReturnAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Every ACH return with its NACHA code and title; late, unknown-code and after-failure ones
    filterable."""

    list_display = [
        "created_at",
        "payment",
        "merchant_id",
        "reason",
        "category",
        "after_settlement",
        "flags_display",
    ]
    list_filter = [
        "late",
        "unknown_code",
        "after_failure",
        "after_settlement",
        "category",
        "reason_code",
    ]
    search_fields = ["=payment__id", "merchant_id", "=processor_event_id", "=reason_code"]
    list_select_related = ["payment"]
    date_hierarchy = "created_at"

    def get_readonly_fields(self, request, obj=None):
        return ["reason", "flags_display", *(f.name for f in self.model._meta.fields)]

    @admin.display(description="reason code", ordering="reason_code")
    def reason(self, obj):
        return return_code_label(obj.reason_code)

    @admin.display(description="flags")
    def flags_display(self, obj):
        return ", ".join(obj.flags) or "—"


@admin.register(MerchantReturnDay)
class MerchantReturnDayAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = [
        "day",
        "merchant_id",
        "debits",
        "returns",
        "unauthorized_returns",
        "administrative_returns",
    ]
    list_filter = ["day"]
    search_fields = ["merchant_id"]


@admin.register(MerchantAccess)
class MerchantAccessAdmin(admin.ModelAdmin):
    """Grants are configuration, not audit data: staff add and remove them here."""

    list_display = ["user", "merchant_id", "note", "created_at"]
    search_fields = ["merchant_id"]
    # A raw id works with any user model; an autocomplete would need the host's user admin.
    raw_id_fields = ["user"]
    list_select_related = ["user"]


class CircuitBreakerTransitionInline(ReadOnlyInline):
    model = CircuitBreakerTransition
    fields = ["created_at", "kind", "pause_seconds", "reason"]
    show_change_link = False
    ordering = ["-created_at", "-id"]


@admin.register(CircuitBreaker)
class CircuitBreakerAdmin(ReadOnlyModelAdmin):
    """The breaker's state changes only through payments.processor.breaker: shown, never edited."""

    list_display = ["name", "state", "opened_at", "open_until", "paused_until", "updated_at"]
    inlines = [CircuitBreakerTransitionInline]


# The bank path's and the vault's admins live with their code.
from payments.nacha import admin as nacha_admin  # noqa: E402, F401
from payments.vault import admin as vault_admin  # noqa: E402, F401
