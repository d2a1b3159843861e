"""The admin of events and webhooks: endpoints (made here or by the API; the secret is shown
once, in the message after saving), deliveries with their attempts, replays with a note and an
audit row. Events, attempts and actions are read-only history."""

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.template.response import TemplateResponse

from payments.admin_base import ReadOnlyAdminMixin, ReadOnlyInline, note_field
from payments.api_versions import VERSIONS
from payments.webhooks.models import (
    Event,
    WebhookAction,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
    api_version_pinned,
)
from payments.webhooks.services import (
    endpoint_fields_checked,
    webhook_deliveries_replay,
    webhook_endpoint_delete,
    webhook_endpoint_enable,
    webhook_failed_replay_since,
)
from payments.webhooks.signing import secret_new


@admin.register(Event)
class EventAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["id", "type", "merchant_id", "object_id", "created_at", "position"]
    list_filter = ["type"]
    search_fields = ["=id", "=merchant_id", "=object_id"]
    date_hierarchy = "created_at"


class WebhookEndpointForm(forms.ModelForm):
    # A choice of the API's versions; a new endpoint starts at the host's pin (the model's).
    api_version = forms.ChoiceField(
        choices=[(version, version) for version in VERSIONS],
        initial=api_version_pinned,
        help_text="the API version its events are rendered in",
    )

    class Meta:
        model = WebhookEndpoint
        fields = [
            "merchant_id",
            "url",
            "description",
            "event_types",
            "thin",
            "ordered",
            "api_version",
        ]

    def clean(self):
        data = super().clean()
        try:
            endpoint_fields_checked(
                url=data.get("url"),
                event_types=data.get("event_types"),
                api_version=data.get("api_version"),
            )
        except ValidationError as exc:
            for field, errors in exc.message_dict.items():
                self.add_error(field, errors)
        return data


class WebhookActionInline(ReadOnlyInline):
    model = WebhookAction
    fields = ["created_at", "kind", "actor_label", "deliveries", "note"]
    show_change_link = False


class WebhookAttemptInline(ReadOnlyInline):
    model = WebhookAttempt
    fields = ["number", "started_at", "status_code", "error", "latency_ms", "response_head"]
    show_change_link = False


class ReplayForm(forms.Form):
    note = note_field(
        "Why they are sent again (ticket, reference).",
    )


class ReplaySinceForm(ReplayForm):
    field_order = ["since", "note"]

    since = forms.DateTimeField(
        help_text="Deliveries made from this time on (UTC, YYYY-MM-DD HH:MM) that failed."
    )


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(admin.ModelAdmin):
    """A merchant's endpoints. The secret never appears here after it is made: the message
    after adding one shows it once."""

    form = WebhookEndpointForm
    list_display = [
        "url",
        "merchant_id",
        "thin",
        "ordered",
        "api_version",
        "enabled",
        "disabled_at",
        "consecutive_failures",
    ]
    list_filter = ["enabled"]
    search_fields = ["=merchant_id", "url"]
    readonly_fields = [
        "enabled",
        "disabled_at",
        "disabled_reason",
        "consecutive_failures",
        "failing_since",
        "created_at",
    ]
    inlines = [WebhookActionInline]
    actions = ["enable_endpoints", "replay_failed_since"]

    def save_model(self, request, obj, form, change):
        if not change:
            obj.secret = secret_new()
        super().save_model(request, obj, form, change)
        if not change:
            self.message_user(
                request,
                f"Endpoint created. Its signing secret, shown this once: {obj.secret}",
                messages.WARNING,
            )

    @admin.action(
        description="Enable the selected endpoints (and replay what they missed)",
        permissions=["change"],
    )
    def enable_endpoints(self, request, queryset):
        replayed = sum(
            webhook_endpoint_enable(endpoint=endpoint, actor=request.user, note="admin")
            for endpoint in queryset
        )
        self.message_user(request, f"Enabled; {replayed} deliveries due now.", messages.SUCCESS)

    @admin.action(description="Replay the failed deliveries since a time…", permissions=["change"])
    def replay_failed_since(self, request, queryset):
        """Every delivery of the selected endpoints that spent its retries since a time, sent
        again: one confirmation page, a note, an audit row per endpoint."""
        form = ReplaySinceForm(request.POST if "apply" in request.POST else None)
        if "apply" in request.POST and form.is_valid():
            count = sum(
                webhook_failed_replay_since(
                    endpoint=endpoint,
                    since=form.cleaned_data["since"],
                    actor=request.user,
                    note=form.cleaned_data["note"],
                )
                for endpoint in queryset
            )
            self.message_user(request, f"{count} deliveries will be sent again.", messages.SUCCESS)
            return None
        return TemplateResponse(
            request,
            "admin/payments/webhookendpoint/confirm_replay_since.html",
            {
                **self.admin_site.each_context(request),
                "opts": self.opts,
                "title": "Replay failed deliveries",
                "endpoints": queryset,
                "form": form,
                "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME,
            },
        )

    def delete_model(self, request, obj):
        webhook_endpoint_delete(endpoint=obj, actor=request.user)

    def delete_queryset(self, request, queryset):
        for endpoint in queryset:
            webhook_endpoint_delete(endpoint=endpoint, actor=request.user)


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Deliveries with their attempts. To replay every failed delivery since a time: filter
    by status and date, select all, and replay (one confirmation page, a note, an audit row
    per endpoint)."""

    list_display = ["event", "endpoint", "status", "attempts", "last_status_code", "created_at"]
    list_filter = ["status"]
    list_select_related = ["event", "endpoint"]
    search_fields = ["=event__id", "=endpoint__merchant_id"]
    date_hierarchy = "created_at"
    inlines = [WebhookAttemptInline]
    actions = ["replay"]

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in self.model._meta.fields]

    def has_replay_permission(self, request) -> bool:
        return request.user.has_perm("payments.change_webhookendpoint")

    @admin.action(description="Replay the selected deliveries…", permissions=["replay"])
    def replay(self, request, queryset):
        form = ReplayForm(request.POST if "apply" in request.POST else None)
        if "apply" in request.POST and form.is_valid():
            count = webhook_deliveries_replay(
                deliveries=list(queryset), actor=request.user, note=form.cleaned_data["note"]
            )
            self.message_user(request, f"{count} deliveries will be sent again.", messages.SUCCESS)
            return None
        return TemplateResponse(
            request,
            "admin/payments/webhookdelivery/confirm_replay.html",
            {
                **self.admin_site.each_context(request),
                "opts": self.opts,
                "title": "Replay deliveries",
                "deliveries": queryset,
                "count": queryset.count(),
                "form": form,
                "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME,
            },
        )


@admin.register(WebhookAction)
class WebhookActionAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = [
        "created_at",
        "kind",
        "endpoint_ref",
        "merchant_id",
        "actor_label",
        "deliveries",
    ]
    list_filter = ["kind"]
    search_fields = ["=endpoint_ref", "=merchant_id"]
