"""Dead letters in the admin: read-only history, actions only through confirmation pages.

Nobody adds, edits or deletes a dead letter or an audit row here. Redrive, resolve, discard and
hold release go through views added by ``get_urls()`` (see ``triage.views``), which require the
``triage.act_on_deadletter`` permission and a note; the bulk actions only collect the selected
ids (exactly what the filter selected) and send the operator to the same confirmation page.
"""

import json

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.db.models import QuerySet
from django.http import Http404, HttpResponseBadRequest, HttpResponseRedirect
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.http import urlencode

from payments.admin_base import ReadOnlyAdminMixin
from triage import (
    payment_admin,  # noqa: F401 - the payment page's operator actions
    services,
)
from triage.models import (
    UNFINISHED_JOB_STATUSES,
    BulkItemOutcome,
    BulkTriageJob,
    DeadLetter,
    TriageAction,
    TriageActionKind,
    TriageDashboard,
)
from triage.operations import admin as operations_admin  # noqa: F401 - alert history in the admin
from triage.operations import dashboard
from triage.operations.charts import human_age
from triage.selectors import AGE_BUCKETS, age_bucket_filter, dead_letter_story
from triage.services import ACT_PERMISSION
from triage.views import bulk as bulk_views
from triage.views import common as common_views
from triage.views import dead_letters as dead_letter_views

BULK_LIMIT = 200  # ids travel in the confirmation page's URL; larger sets: "all matching"


class AgeFilter(admin.SimpleListFilter):
    title = "age (since ingested)"
    parameter_name = "age"

    def lookups(self, request, model_admin):
        return [(key, label) for key, label, _, _ in AGE_BUCKETS]

    def queryset(self, request, queryset):
        if self.value() is None:
            return queryset
        condition = age_bucket_filter(self.value())
        return queryset.none() if condition is None else queryset.filter(condition)


class ErrorClassFilter(admin.SimpleListFilter):
    title = "last error class"
    parameter_name = "error_class"
    NONE = "__none__"

    def lookups(self, request, model_admin):
        classes = (
            DeadLetter.objects.order_by("last_error_class")
            .values_list("last_error_class", flat=True)
            .distinct()
        )
        return [
            (c or self.NONE, c.rsplit(".", 1)[-1] if c else "(no error recorded)") for c in classes
        ]

    def queryset(self, request, queryset):
        value = self.value()
        if value is None:
            return queryset
        return queryset.filter(last_error_class="" if value == self.NONE else value)


@admin.register(DeadLetter)
class DeadLetterAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    change_form_template = "admin/triage/deadletter/change_form.html"
    change_list_template = "admin/triage/deadletter/change_list.html"
    list_display = [
        "id",
        "status",
        "kind",
        "payment_link",
        "error_class_short",
        "attempts",
        "age",
        "source",
        "processor_event_id",
    ]
    list_display_links = ["id", "status"]
    list_filter = ["status", "kind", ErrorClassFilter, AgeFilter, "source"]
    search_fields = ["=group_id", "=processor_event_id", "=original_message_id"]
    search_help_text = "Exact payment id, processor event id or message id."
    list_per_page = 50
    show_full_result_count = False
    actions = ["redrive_selected", "resolve_selected", "discard_selected"]
    fieldsets = [
        (
            None,
            {
                "fields": [
                    "status",
                    "payment_link",
                    "kind",
                    "processor_event_id",
                    "last_error_class",
                    "last_error_message_pre",
                    "attempts",
                    "first_failed_at",
                    "last_failed_at",
                    "source",
                ]
            },
        ),
        (
            "Message",
            {
                "fields": [
                    "body_pretty",
                    "original_message_id",
                    "dlq_message_id",
                    "group_id",
                    "deduplication_id",
                    "attributes_pretty",
                ]
            },
        ),
        (
            "Triage",
            {
                "fields": ["ingested_at", "status_changed_at", "redrive_message_id"],
                "classes": ["collapse"],
            },
        ),
    ]
    readonly_fields = [
        "payment_link",
        "body_pretty",
        "attributes_pretty",
        "last_error_message_pre",
    ]

    # --- display ---

    @admin.display(description="payment", ordering="group_id")
    def payment_link(self, obj: DeadLetter):
        if obj.payment_id is None:
            return obj.group_id or "—"
        url = reverse("admin:payments_payment_change", args=[obj.payment_id])
        return format_html('<a href="{}">{}</a>', url, obj.payment_id)

    @admin.display(description="error class", ordering="last_error_class")
    def error_class_short(self, obj: DeadLetter) -> str:
        return obj.last_error_class.rsplit(".", 1)[-1] if obj.last_error_class else "—"

    @admin.display(description="age", ordering="ingested_at")
    def age(self, obj: DeadLetter) -> str:
        return human_age(timezone.now() - obj.ingested_at)

    @admin.display(description="message body")
    def body_pretty(self, obj: DeadLetter):
        return format_html(
            '<pre class="triage-json">{}</pre>', json.dumps(obj.body, indent=2, sort_keys=True)
        )

    @admin.display(description="SQS attributes")
    def attributes_pretty(self, obj: DeadLetter):
        return format_html(
            '<pre class="triage-json">{}</pre>',
            json.dumps(obj.attributes, indent=2, sort_keys=True),
        )

    @admin.display(description="last error message")
    def last_error_message_pre(self, obj: DeadLetter):
        return format_html('<pre class="triage-error">{}</pre>', obj.last_error_message or "—")

    # --- permissions ---

    def has_act_permission(self, request) -> bool:
        return request.user.has_perm(ACT_PERMISSION)

    # --- pages ---

    def get_urls(self):
        wrap = self.admin_site.admin_view
        info = f"{self.opts.app_label}_{self.opts.model_name}"
        return [
            path(
                "bulk/<str:action>/",
                wrap(self._bulk_view),
                name=f"{info}_bulk",
            ),
            path(
                "bulk-all/<str:action>/",
                wrap(self._bulk_all_view),
                name=f"{info}_bulk_all",
            ),
            # Ids are parsed by the views (``object_id_parse``): anything that cannot be a row's
            # id is a 404 there, not a fall-through to the admin's catch-all redirect.
            path(
                "<str:object_id>/act/<str:action>/",
                wrap(self._action_view),
                name=f"{info}_act",
            ),
            path(
                "<str:object_id>/release-hold/",
                wrap(self._release_view),
                name=f"{info}_release_hold",
            ),
            *super().get_urls(),
        ]

    def _action_view(self, request, object_id, action):
        object_id = common_views.object_id_parse(object_id)
        return dead_letter_views.dead_letter_action(
            request, self, object_id=object_id, action=action
        )

    def _bulk_view(self, request, action):
        return bulk_views.dead_letters_bulk_action(request, self, action=action)

    def _bulk_all_view(self, request, action):
        return bulk_views.dead_letters_bulk_all(request, self, action=action)

    def _release_view(self, request, object_id):
        object_id = common_views.object_id_parse(object_id)
        return dead_letter_views.dead_letter_hold_release(request, self, object_id=object_id)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        common_views.object_id_parse(object_id)
        extra_context = extra_context or {}
        obj = self.get_object(request, object_id)
        if obj is not None and self.has_view_permission(request, obj):
            extra_context["story"] = dead_letter_story(obj)
            extra_context["can_act"] = self.has_act_permission(request)
            extra_context["human_age"] = human_age(timezone.now() - obj.ingested_at)
        return super().change_view(request, object_id, form_url, extra_context)

    def response_action(self, request, queryset):
        # The admin filters by the posted checkbox values as they come, and a value the id
        # field cannot take ("²", "1e3", "") raises deep inside the action: refuse it here.
        for raw in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME):
            try:
                common_views.object_id_parse(raw)
            except Http404:
                return HttpResponseBadRequest(
                    f"{raw[:40]!r} is not a dead letter id (ids are positive whole numbers)",
                    content_type="text/plain; charset=utf-8",
                )
        return super().response_action(request, queryset)

    def changelist_view(self, request, extra_context=None):
        extra_context = extra_context or {}
        extra_context["dashboard_url"] = reverse("admin:triage_triagedashboard_changelist")
        extra_context["jobs_url"] = reverse("admin:triage_bulktriagejob_changelist")
        if self.has_act_permission(request):
            # "All matching this filter": the confirmation page counts the open ones and
            # freezes them into a background job; the page's own querystring is the filter.
            filters = request.GET.copy()
            for key in ("p", "e", "o"):
                filters.pop(key, None)
            query = urlencode({"_changelist_filters": filters.urlencode()})
            extra_context["bulk_all_links"] = [
                (
                    common_views.ACTION_TEXT[action]["title"],
                    reverse("admin:triage_deadletter_bulk_all", args=[action]) + "?" + query,
                )
                for action in services.ACTIONS
            ]
        return super().changelist_view(request, extra_context)

    # --- bulk actions: collect exactly the selection, confirm on a separate page ---

    def _bulk_redirect(self, request, queryset: QuerySet, action: str):
        ids = list(queryset.order_by("ingested_at", "id").values_list("pk", flat=True))
        if not ids:
            self.message_user(
                request, "None of the selected dead letters exists.", messages.WARNING
            )
            return None
        if len(ids) > BULK_LIMIT:
            self.message_user(
                request,
                f"{len(ids)} dead letters selected: at most {BULK_LIMIT} per bulk action. "
                "For more, use “Redrive all matching…” (or resolve, discard) above the list.",
                messages.ERROR,
            )
            return None
        query = {"ids": ",".join(str(i) for i in ids)}
        filters = request.GET.urlencode()
        if filters:
            query["_changelist_filters"] = filters
        url = reverse("admin:triage_deadletter_bulk", args=[action])
        return HttpResponseRedirect(f"{url}?{urlencode(query)}")

    @admin.action(description="Redrive selected dead letters…", permissions=["act"])
    def redrive_selected(self, request, queryset):
        return self._bulk_redirect(request, queryset, TriageActionKind.REDRIVE)

    @admin.action(
        description="Resolve selected dead letters (fixed elsewhere)…", permissions=["act"]
    )
    def resolve_selected(self, request, queryset):
        return self._bulk_redirect(request, queryset, TriageActionKind.RESOLVE)

    @admin.action(description="Discard selected dead letters…", permissions=["act"])
    def discard_selected(self, request, queryset):
        return self._bulk_redirect(request, queryset, TriageActionKind.DISCARD)


@admin.register(TriageAction)
class TriageActionAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = [
        "created_at",
        "action",
        "dead_letter",
        "user",
        "status_before",
        "status_after",
        "bulk_job",
    ]
    list_filter = ["action", "status_after"]
    search_fields = ["=dead_letter__group_id", "note"]
    list_select_related = ["dead_letter", "user", "bulk_job"]
    date_hierarchy = "created_at"

    def lookup_allowed(self, lookup, value, request=None):
        # A bulk job's page links to its audit rows; a list filter of every job would not scale.
        return lookup == "bulk_job__id__exact" or super().lookup_allowed(lookup, value, request)


@admin.register(BulkTriageJob)
class BulkTriageJobAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Progress of the bulk jobs: counts, rate, status; cancel and resume by POST."""

    change_form_template = "admin/triage/bulktriagejob/change_form.html"
    list_display = [
        "id",
        "action",
        "status",
        "total",
        "done",
        "failed",
        "skipped",
        "rate",
        "user",
        "created_at",
    ]
    list_filter = ["status", "action"]
    list_select_related = ["user"]
    list_per_page = 50
    show_full_result_count = False
    fields = [
        "action",
        "status",
        "total",
        "done",
        "failed",
        "skipped",
        "rate",
        "note",
        "filters_link",
        "user",
        "created_at",
        "started_at",
        "finished_at",
        "updated_at",
        "cancelled_by",
        "last_error",
    ]
    readonly_fields = fields

    def has_view_permission(self, request, obj=None):
        return request.user.has_perm("triage.view_deadletter")

    def has_module_permission(self, request):
        return self.has_view_permission(request)

    @admin.display(description="rate (per second)")
    def rate(self, obj: BulkTriageJob) -> str:
        if obj.started_at is None:
            return "—"
        elapsed = ((obj.finished_at or timezone.now()) - obj.started_at).total_seconds()
        return f"{obj.processed / elapsed:.1f}" if elapsed > 0 else "—"

    @admin.display(description="filter")
    def filters_link(self, obj: BulkTriageJob):
        url = reverse("admin:triage_deadletter_changelist")
        return format_html('<a href="{}?{}">{}</a>', url, obj.filters, obj.filters or "(none)")

    def get_urls(self):
        wrap = self.admin_site.admin_view
        return [
            path(
                "<str:object_id>/cancel/",
                wrap(self._control_view),
                {"operation": bulk_views.BulkJobOperation.CANCEL},
                name="triage_bulktriagejob_cancel",
            ),
            path(
                "<str:object_id>/resume/",
                wrap(self._control_view),
                {"operation": bulk_views.BulkJobOperation.RESUME},
                name="triage_bulktriagejob_resume",
            ),
            *super().get_urls(),
        ]

    def _control_view(self, request, object_id, operation):
        return bulk_views.bulk_job_control(request, self, object_id=object_id, operation=operation)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        common_views.object_id_parse(object_id)
        extra_context = extra_context or {}
        obj = self.get_object(request, object_id)
        if obj is not None and self.has_view_permission(request, obj):
            extra_context["can_act"] = request.user.has_perm(ACT_PERMISSION)
            extra_context["unfinished"] = obj.status in UNFINISHED_JOB_STATUSES
            extra_context["audit_url"] = (
                reverse("admin:triage_triageaction_changelist") + f"?bulk_job__id__exact={obj.pk}"
            )
            extra_context["failures"] = list(
                obj.items.filter(outcome=BulkItemOutcome.FAILED).order_by("position")[:50]
            )
        return super().change_view(request, object_id, form_url, extra_context)


@admin.register(TriageDashboard)
class TriageDashboardAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """The dashboard's entry in the admin index; seeing it needs the dead-letter view right."""

    def has_view_permission(self, request, obj=None):
        return request.user.has_perm("triage.view_deadletter")

    def has_module_permission(self, request):
        return self.has_view_permission(request)

    def changelist_view(self, request, extra_context=None):
        return dashboard.dashboard(request, self)
