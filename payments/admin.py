"""Admin for payments: history is read-only, the state is never edited by hand."""

import json

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.shortcuts import get_object_or_404, redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from payments.admin_base import ReadOnlyAdminMixin, ReadOnlyInline, ReadOnlyModelAdmin, note_field
from payments.catalogue import event_type_label, event_types
from payments.exceptions import MoneyOutRefused

# Merchants' exposure limits, their audit rows (registered there), and a held payment's review.
from payments.limits_admin import PaymentReviewMixin
from payments.models import (
    AccountValidation,
    CircuitBreaker,
    CircuitBreakerTransition,
    DoubleLoss,
    DoubleLossStatus,
    EventKind,
    LedgerEntry,
    MerchantAccess,
    MerchantReturnDay,
    NocAction,
    NocStatus,
    NotificationOfChange,
    OriginatorProfile,
    OriginatorProfileChange,
    OutboxMessage,
    Payment,
    PaymentEvent,
    PaymentReturn,
    ProcessedEvent,
    ProcessorAttempt,
    ReturnDishonor,
)
from payments.originator import SEC_CODES
from payments.processor.contract import event_payload_shown
from payments.return_codes import return_code_label
from payments.selectors import payment_reinitiation_chain
from payments.services.nocs import NocNoteRequired, NocNotOpen, noc_mark_applied
from payments.services.originators import (
    PROFILE_FIELDS,
    originator_profile_problems,
    originator_profile_save,
)
from payments.services.refunds import double_loss_resolve


class EventTypeFilter(admin.SimpleListFilter):
    """The catalogue's event types, by label (``payments.catalogue``)."""

    title = "event type"
    parameter_name = "event_type"

    def lookups(self, request, model_admin):
        return [(entry.name, entry.label) for entry in event_types()]

    def queryset(self, request, queryset):
        return queryset.filter(event_type=self.value()) if self.value() else queryset


class PaymentEventInline(ReadOnlyInline):
    model = PaymentEvent
    fields = [
        "created_at",
        "kind",
        "event",
        "outcome",
        "from_state",
        "to_state",
        "processor_event_id",
        "caused_by",
    ]

    def get_readonly_fields(self, request, obj=None):
        return [*super().get_readonly_fields(request, obj), "event"]

    @admin.display(description="event type")
    def event(self, obj):
        return event_type_label(obj.event_type) if obj.event_type else ""


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
    fields = ["created_at", "kind", "amount", "currency", "status", "posted_at", "merchant_id"]


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


class NotificationOfChangeInline(ReadOnlyInline):
    model = NotificationOfChange
    fk_name = "payment"
    fields = ["change_code", "change_title", "status", "deadline", "unknown_code", "received_at"]


class PrenoteNocInline(NotificationOfChangeInline):
    """The NOCs of the account's prenotes, on its validation's page."""

    fk_name = "account_validation"
    verbose_name_plural = "notifications of change of its prenotes"


class ReturnDishonorInline(ReadOnlyInline):
    """The dishonor of the payment's return: our request and the processor's answers."""

    model = ReturnDishonor
    fields = [
        "outcome",
        "reason",
        "request_status",
        "requested_by",
        "requested_at",
        "note",
        "last_error",
        "dishonored_at",
        "contested_at",
        "contest_reason",
        "flags_display",
    ]

    def get_readonly_fields(self, request, obj=None):
        return self.fields

    @admin.display(description="reason code")
    def reason(self, obj):
        return return_code_label(obj.reason_code) if obj.reason_code else "—"

    @admin.display(description="contest code")
    def contest_reason(self, obj):
        return return_code_label(obj.contest_reason_code) if obj.contest_reason_code else "—"

    @admin.display(description="flags")
    def flags_display(self, obj):
        flags = [
            name
            for name, on in (("unrequested", obj.unrequested), ("unknown code", obj.unknown_code))
            if on
        ]
        return ", ".join(flags) or "—"


class RefundInline(ReadOnlyInline):
    """A debit's refunds, each a payment of its own (linked)."""

    model = Payment
    fk_name = "refund_of"
    verbose_name = "refund"
    verbose_name_plural = "refunds"
    fields = ["id", "amount", "currency", "state", "description", "created_at"]

    def get_readonly_fields(self, request, obj=None):
        return self.fields


class DoubleLossInline(ReadOnlyInline):
    model = DoubleLoss
    fk_name = "payment"
    fields = ["status", "refund", "amount", "currency", "refund_state", "detected_at", "note"]

    def get_readonly_fields(self, request, obj=None):
        return self.fields


@admin.register(Payment)
class PaymentAdmin(PaymentReviewMixin, admin.ModelAdmin):
    list_display = [
        "id",
        "merchant_id",
        "purpose",
        "sec_code",
        "amount",
        "currency",
        "state",
        "review_status",
        "created_at",
    ]
    list_filter = [
        "state",
        "review_status",
        "review_rule",
        "purpose",
        "sec_code",
        "currency",
        "created_at",
    ]
    search_fields = ["=id", "=idempotency_key", "merchant_id", "=processor_id"]
    date_hierarchy = "created_at"
    inlines = [
        PaymentEventInline,
        ProcessorAttemptInline,
        LedgerEntryInline,
        PaymentReturnInline,
        NotificationOfChangeInline,
        ReturnDishonorInline,
        RefundInline,
        DoubleLossInline,
    ]
    list_per_page = 50
    show_full_result_count = False

    def get_readonly_fields(self, request, obj=None):
        # The state moves only through services; nothing about a payment is edited by hand.
        return [*(f.name for f in self.model._meta.fields), "reinitiation_chain", "review_link"]

    @admin.display(description="reinitiation chain")
    def reinitiation_chain(self, obj):
        """The original entry and its reinitiations, each linked, this one marked."""
        chain = payment_reinitiation_chain(obj) if obj is not None and obj.pk else None
        if chain is None:
            return "—"
        rows = []
        for entry in chain["chain"]:
            number = entry["reinitiation_number"]
            label = "original" if number is None else f"reinitiation {number}"
            status = entry["state"] + (f", {entry['return_code']}" if entry["return_code"] else "")
            here = " (this payment)" if entry["id"] == obj.id else ""
            url = reverse("admin:payments_payment_change", args=[entry["id"]])
            rows.append((url, entry["id"], label, status, here))
        return format_html_join(mark_safe("<br>"), '<a href="{}">{}</a> {} ({}){}', rows)

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
        "event",
        "outcome",
        "from_state",
        "to_state",
    ]
    list_filter = ["kind", "outcome", EventTypeFilter]
    search_fields = ["=payment__id", "processor_event_id"]
    list_select_related = ["payment"]
    # The payload is shown once, by payload_pretty: masked, where the field itself is not.
    exclude = ["payload"]
    readonly_fields = ["payload_pretty"]

    @admin.display(description="event type", ordering="event_type")
    def event(self, obj):
        return event_type_label(obj.event_type) if obj.event_type else ""

    @admin.display(description="payload")
    def payload_pretty(self, obj):
        payload = obj.payload
        if obj.kind == EventKind.PROCESSOR_EVENT and isinstance(payload, dict):
            # What a processor sent, bank numbers masked even in rows stored before the edge
            # masked them.
            payload = event_payload_shown(payload)
        return format_html("<pre>{}</pre>", json.dumps(payload, indent=2, sort_keys=True))


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
    list_display = ["processor_event_id", "payment", "event", "outcome", "processed_at"]
    list_filter = [EventTypeFilter, "outcome"]

    @admin.display(description="event type", ordering="event_type")
    def event(self, obj):
        return event_type_label(obj.event_type)

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


@admin.register(ReturnDishonor)
class ReturnDishonorAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Every dishonor of a return: requested ones, failed requests to send again, and the
    processor's answers; unrequested and unknown-code ones filterable."""

    list_display = [
        "created_at",
        "payment",
        "merchant_id",
        "reason_code",
        "request_status",
        "outcome",
        "contest_reason_code",
    ]
    list_filter = ["request_status", "unrequested", "unknown_code", "reason_code"]
    search_fields = ["=payment__id", "merchant_id"]
    list_select_related = ["payment"]

    def get_readonly_fields(self, request, obj=None):
        return ["outcome", *(f.name for f in self.model._meta.fields)]


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

    list_display = [
        "name",
        "state",
        "opened_at",
        "open_until",
        "paused_until",
        "degraded_since",
        "updated_at",
    ]
    inlines = [CircuitBreakerTransitionInline]


class NocActionInline(ReadOnlyInline):
    model = NocAction
    fields = ["created_at", "action", "user", "status_before", "status_after", "note"]
    show_change_link = False


class NocApplyForm(forms.Form):
    note = note_field(
        "What was updated at the processor, and where (ticket, reference).",
    )


@admin.register(NotificationOfChange)
class NotificationOfChangeAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Notifications of change, earliest deadline first: an operator applies each at the
    processor, then marks it applied here with a note (an audit row). Nothing else is edited."""

    list_display = [
        "deadline",
        "due",
        "change",
        "status",
        "answered",
        "merchant_id",
        "source_token",
        "unknown_code",
        "received_at",
    ]
    list_filter = ["status", "unknown_code", "change_code"]
    search_fields = ["=payment__id", "merchant_id", "=source_token", "=processor_event_id"]
    list_select_related = ["payment", "account_validation"]
    ordering = ["deadline", "id"]
    inlines = [NocActionInline]

    def get_readonly_fields(self, request, obj=None):
        return ["apply_link", "change", *(f.name for f in self.model._meta.fields)]

    def has_apply_permission(self, request) -> bool:
        return request.user.has_perm("payments.apply_noc")

    @admin.display(description="change code", ordering="change_code")
    def change(self, obj):
        return f"{obj.change_code} {obj.change_title or '(unknown code)'}"

    @admin.display(description="answered")
    def answered(self, obj):
        """The entry the NOC answered: a payment, or an account's prenote (its validation)."""
        if obj.payment_id is not None:
            return obj.payment
        return format_html(
            '<a href="{}">prenote of {}</a>',
            reverse("admin:payments_accountvalidation_change", args=[obj.account_validation_id]),
            obj.account_validation.account_token,
        )

    @admin.display(description="due")
    def due(self, obj):
        if obj.status != NocStatus.OPEN or obj.deadline is None:
            return "—"
        return "past deadline" if obj.deadline < timezone.now() else "open"

    @admin.display(description="mark applied")
    def apply_link(self, obj):
        if obj is None or obj.status != NocStatus.OPEN:
            return "—"
        url = reverse("admin:payments_notificationofchange_apply", args=[obj.pk])
        return format_html('<a class="button" href="{}">Mark applied…</a>', url)

    def get_urls(self):
        return [
            path(
                "<int:noc_id>/apply/",
                self.admin_site.admin_view(self.apply_view),
                name="payments_notificationofchange_apply",
            ),
            *super().get_urls(),
        ]

    def apply_view(self, request, noc_id: int):
        """Confirm with a note, then close the NOC through the service."""
        if not self.has_apply_permission(request):
            raise PermissionDenied("Marking a NOC applied needs the payments.apply_noc right.")
        noc = get_object_or_404(NotificationOfChange, pk=noc_id)
        change_url = reverse("admin:payments_notificationofchange_change", args=[noc.pk])
        form = NocApplyForm(request.POST or None)
        error = None
        if request.method == "POST" and form.is_valid():
            try:
                noc_mark_applied(noc_id=noc.pk, user=request.user, note=form.cleaned_data["note"])
            except (NocNotOpen, NocNoteRequired) as exc:
                error = str(exc)
            else:
                self.message_user(request, f"NOC {noc.pk} marked applied.", messages.SUCCESS)
                return redirect(change_url)
        return TemplateResponse(
            request,
            "admin/payments/notificationofchange/confirm_apply.html",
            {
                **self.admin_site.each_context(request),
                "opts": self.opts,
                "app_label": self.opts.app_label,
                "title": f"Mark NOC {noc.pk} applied",
                "noc": noc,
                "form": form,
                "error": error,
                "cancel_url": change_url,
            },
        )


class DoubleLossResolveForm(forms.Form):
    status = forms.ChoiceField(
        choices=[
            (DoubleLossStatus.RECOVERED, "Recovered: the customer paid the refund back"),
            (DoubleLossStatus.WRITTEN_OFF, "Written off: it will not be recovered"),
        ],
        widget=forms.RadioSelect,
    )
    note = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 4, "cols": 80, "required": True}),
        strip=True,
        help_text="How it was recovered (reference), or why it was not.",
    )


@admin.register(DoubleLoss)
class DoubleLossAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Debits returned after a refund of them was sent: the customer has the money twice. An
    operator recovers it outside ACH, then closes it here with a note."""

    list_display = [
        "detected_at",
        "status",
        "payment",
        "refund",
        "merchant_id",
        "amount",
        "currency",
        "refund_state",
    ]
    list_filter = ["status", "currency"]
    search_fields = ["=payment__id", "=refund__id", "merchant_id", "=return_event_id"]
    list_select_related = ["payment", "refund"]

    def get_readonly_fields(self, request, obj=None):
        return ["resolve_link", *(f.name for f in self.model._meta.fields)]

    @admin.display(description="close")
    def resolve_link(self, obj):
        if obj is None or obj.status != DoubleLossStatus.OPEN:
            return "—"
        url = reverse("admin:payments_doubleloss_resolve", args=[obj.pk])
        return format_html('<a class="button" href="{}">Close…</a>', url)

    def get_urls(self):
        return [
            path(
                "<int:loss_id>/resolve/",
                self.admin_site.admin_view(self.resolve_view),
                name="payments_doubleloss_resolve",
            ),
            *super().get_urls(),
        ]

    def resolve_view(self, request, loss_id: int):
        if not request.user.has_perm("payments.resolve_double_loss"):
            raise PermissionDenied("Closing a double loss needs payments.resolve_double_loss.")
        loss = get_object_or_404(DoubleLoss, pk=loss_id)
        change_url = reverse("admin:payments_doubleloss_change", args=[loss.pk])
        form = DoubleLossResolveForm(request.POST or None)
        error = None
        if request.method == "POST" and form.is_valid():
            try:
                double_loss_resolve(
                    loss_id=loss.pk,
                    status=form.cleaned_data["status"],
                    user=request.user,
                    note=form.cleaned_data["note"],
                )
            except MoneyOutRefused as exc:
                error = str(exc)
            else:
                self.message_user(request, f"Double loss {loss.pk} closed.", messages.SUCCESS)
                return redirect(change_url)
        return TemplateResponse(
            request,
            "admin/payments/doubleloss/confirm_resolve.html",
            {
                **self.admin_site.each_context(request),
                "opts": self.opts,
                "app_label": self.opts.app_label,
                "title": f"Close double loss {loss.pk}",
                "loss": loss,
                "form": form,
                "error": error,
                "cancel_url": change_url,
            },
        )


@admin.register(NocAction)
class NocActionAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["created_at", "noc", "action", "user", "status_before", "status_after"]
    list_select_related = ["noc", "user"]


class OriginatorProfileForm(forms.ModelForm):
    """The profile's fields as the rules take them (``payments.originator``): a value that does
    not fit is refused with the reason, never cut or upper-cased."""

    allowed_sec_codes = forms.MultipleChoiceField(
        choices=[(code, code) for code in SEC_CODES], widget=forms.CheckboxSelectMultiple
    )

    class Meta:
        model = OriginatorProfile
        fields = ["merchant_id", *PROFILE_FIELDS]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for name in ("company_name", "company_identification", "default_entry_description"):
            if name in self.fields:
                self.fields[name].strip = False

    def clean(self):
        cleaned = super().clean()
        values = {name: cleaned[name] for name in PROFILE_FIELDS if name in cleaned}
        for name, problem in originator_profile_problems(values).items():
            self.add_error(name, problem)
        return cleaned


class OriginatorProfileChangeInline(ReadOnlyInline):
    model = OriginatorProfileChange
    fields = ["created_at", "user", "changes"]
    show_change_link = False

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("user")


@admin.register(OriginatorProfile)
class OriginatorProfileAdmin(admin.ModelAdmin):
    """A merchant as an originator. Each save goes through ``originator_profile_save``, which
    writes the change's audit row; a profile is never deleted (its history stays)."""

    form = OriginatorProfileForm
    list_display = ["merchant_id", "company_name", "company_identification", "sec_codes"]
    search_fields = ["merchant_id", "company_name", "company_identification"]
    inlines = [OriginatorProfileChangeInline]

    def get_readonly_fields(self, request, obj=None):
        return ["merchant_id", "created_at", "updated_at"] if obj is not None else []

    @admin.display(description="SEC codes")
    def sec_codes(self, obj):
        return ", ".join(obj.allowed_sec_codes)

    def has_delete_permission(self, request, obj=None):
        return False

    def save_model(self, request, obj, form, change):
        values = {name: form.cleaned_data[name] for name in PROFILE_FIELDS}
        saved = originator_profile_save(
            merchant_id=obj.merchant_id, values=values, user=request.user
        )
        obj.pk = saved.pk
        obj.created_at = saved.created_at


@admin.register(OriginatorProfileChange)
class OriginatorProfileChangeAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["created_at", "merchant_id", "user", "changes"]
    search_fields = ["merchant_id"]
    list_select_related = ["user"]


# The events and webhooks admin registers itself on import.
from payments import risk_admin  # noqa: E402, F401
from payments.webhooks import admin as webhooks_admin  # noqa: E402, F401


class MicroEntryInline(ReadOnlyInline):
    """A validation's micro-entries, each a payment of its own (linked: its history, its
    ledger, its return). The amounts are left off this page: the validation's secret is read
    from the account holder's statement, not passed around from here."""

    model = Payment
    fk_name = "account_validation"
    verbose_name = "micro-entry"
    verbose_name_plural = "micro-entries"
    fields = ["id", "direction", "state", "processor_id", "created_at"]

    def get_readonly_fields(self, request, obj=None):
        return self.fields


@admin.register(AccountValidation)
class AccountValidationAdmin(ReadOnlyModelAdmin):
    """Each account's validation before its first WEB debit (payments.services.validation):
    state, method, tries and evidence, read-only; it moves only by its method and the API. The
    micro-entries' digest is left out: it is nobody's to read."""

    list_display = [
        "account_token",
        "merchant_id",
        "state",
        "method",
        "attempts",
        "expires_at",
        "live_from",
        "retry_at",
        "validated_at",
        "failed_at",
    ]
    list_filter = ["state", "method"]
    search_fields = ["=account_token", "merchant_id"]
    exclude = ["secret_digest"]
    inlines = [PrenoteNocInline, MicroEntryInline]

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in self.model._meta.fields if f.name != "secret_digest"]
