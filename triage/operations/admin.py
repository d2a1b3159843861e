"""Alert history in the admin: read-only, each alert with every notification sent or tried."""

import json

from django.contrib import admin
from django.utils.html import format_html

from payments.admin_base import ReadOnlyAdminMixin, ReadOnlyInline
from triage.models import Alert, AlertNotification


class AlertNotificationInline(ReadOnlyInline):
    model = AlertNotification
    fields = ["sent_at", "kind", "sink", "ok", "error"]
    readonly_fields = fields
    show_change_link = False


@admin.register(Alert)
class AlertAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = [
        "key",
        "severity",
        "status",
        "first_fired_at",
        "last_fired_at",
        "last_notified_at",
        "notify_count",
        "suppressed_count",
        "resolved_at",
    ]
    list_filter = ["status", "severity"]
    search_fields = ["key", "summary", "payment_id"]
    date_hierarchy = "first_fired_at"
    inlines = [AlertNotificationInline]
    fields = [
        "key",
        "severity",
        "status",
        "summary",
        "payment_id",
        "first_fired_at",
        "last_fired_at",
        "last_notified_at",
        "notify_count",
        "suppressed_count",
        "resolved_at",
        "details_pretty",
    ]
    readonly_fields = fields

    @admin.display(description="details")
    def details_pretty(self, obj: Alert) -> str:
        return format_html("<pre>{}</pre>", json.dumps(obj.details, indent=2, sort_keys=True))

    def get_queryset(self, request):
        return super().get_queryset(request).prefetch_related("notifications")


@admin.register(AlertNotification)
class AlertNotificationAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["sent_at", "alert", "kind", "sink", "ok", "error"]
    list_filter = ["sink", "kind", "ok"]
    list_select_related = ["alert"]
    readonly_fields = ["alert", "kind", "sink", "ok", "error", "sent_at"]
