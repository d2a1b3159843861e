"""Merchants' exposure limits in the admin: changed only by a user with
``payments.change_exposure_limits``, each change with a note and an audit row
(``payments.services.limits.exposure_limit_set``); the audit rows are read-only. And the
decision on a payment held for review (``PaymentReviewMixin``, on the payment's admin page).
Registered by ``payments.admin``."""

import json

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.shortcuts import get_object_or_404, redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from payments.admin_base import ReadOnlyModelAdmin, note_field
from payments.api.fields import MERCHANT_MESSAGE, MERCHANT_RE
from payments.exceptions import CancelRefused
from payments.exposure_limits import KINDS, Limits, currency_code
from payments.models import ExposureLimit, ExposureLimitChange, Payment, ReviewStatus
from payments.services.limits import CHANGE_PERMISSION, exposure_limit_set
from payments.services.review import (
    REVIEW_PERMISSION,
    ReviewRefused,
    payment_review_approve,
    payment_review_reject,
)


class ExposureLimitForm(forms.ModelForm):
    note = note_field(
        "Why the limits change (the review, the ticket): kept with the audit row.",
        rows=3,
    )

    class Meta:
        model = ExposureLimit
        fields = [
            "merchant_id",
            "direction",
            "currency",
            "single_limit",
            "daily_limit",
            "window_limit",
            "window_banking_days",
        ]

    def clean_merchant_id(self):
        value = self.cleaned_data["merchant_id"]
        if not MERCHANT_RE.fullmatch(value):
            raise ValidationError(MERCHANT_MESSAGE)
        return value

    def clean_currency(self):
        try:
            return currency_code(self.cleaned_data["currency"])
        except ValueError as exc:
            raise ValidationError(str(exc)) from None

    def clean_note(self):
        note = self.cleaned_data["note"]
        if "\x00" in note:
            raise ValidationError("a note has no NUL characters")
        return note

    def clean(self):
        cleaned = super().clean()
        values = {kind: cleaned.get(f"{kind}_limit") for kind in KINDS}
        try:
            self.limits = Limits(
                **{k: v for k, v in values.items() if v is not None},
                window_banking_days=cleaned.get("window_banking_days"),
            )
        except ValueError as exc:
            raise ValidationError(str(exc)) from None
        return cleaned


@admin.register(ExposureLimit)
class ExposureLimitAdmin(admin.ModelAdmin):
    """A merchant's own limits in one direction and currency; an empty cap caps nothing. Never
    deleted here (clear the caps instead), so every change has its audit row."""

    form = ExposureLimitForm
    list_display = [
        "merchant_id",
        "direction",
        "currency",
        "single_limit",
        "daily_limit",
        "window_limit",
        "window_banking_days",
        "updated_at",
    ]
    list_filter = ["direction", "currency"]
    search_fields = ["merchant_id"]

    def get_readonly_fields(self, request, obj=None):
        return ["merchant_id", "direction", "currency"] if obj is not None else []

    def has_view_permission(self, request, obj=None):
        return super().has_view_permission(request, obj) or request.user.has_perm(CHANGE_PERMISSION)

    def has_add_permission(self, request):
        return request.user.has_perm(CHANGE_PERMISSION)

    def has_change_permission(self, request, obj=None):
        return request.user.has_perm(CHANGE_PERMISSION)

    def has_delete_permission(self, request, obj=None):
        return False

    def save_model(self, request, obj, form, change):
        row = exposure_limit_set(
            merchant_id=obj.merchant_id,
            direction=obj.direction,
            currency=obj.currency,
            limits=form.limits,
            user=request.user,
            note=form.cleaned_data["note"],
        )
        obj.pk = row.pk


@admin.register(ExposureLimitChange)
class ExposureLimitChangeAdmin(ReadOnlyModelAdmin):
    list_display = ["changed_at", "merchant_id", "direction", "currency", "changed_by", "note"]
    list_filter = ["direction", "currency"]
    search_fields = ["merchant_id"]
    list_select_related = ["changed_by"]

    def has_view_permission(self, request, obj=None):
        # Who may change the limits may read their history.
        return super().has_view_permission(request, obj) or request.user.has_perm(CHANGE_PERMISSION)


class PaymentReviewForm(forms.Form):
    decision = forms.ChoiceField(
        choices=[
            ("approve", "Approve: send it, once"),
            ("reject", "Reject: cancel it, nothing is sent"),
        ],
        widget=forms.RadioSelect,
    )
    note = note_field(
        "Why: what was checked, with whom, the ticket.",
    )


def evidence_shown(evidence: dict) -> str:
    """A held payment's evidence (every flag with its figures, the merchant's baseline) as the
    review page shows it: indented JSON, escaped by the template; "" for a hold without any."""
    return json.dumps(evidence, indent=2, sort_keys=True) if evidence else ""


class PaymentReviewMixin:
    """A held payment's decision on its admin page: a confirmation page with the reason and a
    note, for a user with ``payments.review_payment`` only; the service decides under the
    payment's row lock."""

    def has_review_permission(self, request) -> bool:
        return request.user.has_perm(REVIEW_PERMISSION)

    def has_view_permission(self, request, obj=None):
        # A reviewer reads the payment it decides on, its history and its merchant's others.
        return super().has_view_permission(request, obj) or self.has_review_permission(request)

    @admin.display(description="review")
    def review_link(self, obj):
        if obj is None or obj.review_status != ReviewStatus.HELD:
            return obj.get_review_status_display() if obj is not None else "—"
        url = reverse("admin:payments_payment_review", args=[obj.pk])
        return format_html('<a class="button" href="{}">Approve or reject…</a>', url)

    def get_urls(self):
        return [
            path(
                "<uuid:payment_id>/review/",
                self.admin_site.admin_view(self.review_view),
                name="payments_payment_review",
            ),
            *super().get_urls(),
        ]

    def review_view(self, request, payment_id):
        if not self.has_review_permission(request):
            raise PermissionDenied(f"Deciding a held payment needs {REVIEW_PERMISSION}.")
        payment = get_object_or_404(Payment, pk=payment_id)
        change_url = reverse("admin:payments_payment_change", args=[payment.pk])
        form = PaymentReviewForm(request.POST or None)
        error = None
        if request.method == "POST" and form.is_valid():
            decide = (
                payment_review_approve
                if form.cleaned_data["decision"] == "approve"
                else payment_review_reject
            )
            try:
                decide(payment_id=payment.pk, user=request.user, note=form.cleaned_data["note"])
            except (ReviewRefused, CancelRefused) as exc:
                error = str(exc)
            else:
                self.message_user(
                    request,
                    f"Payment {payment.pk}: {form.cleaned_data['decision'].rstrip('e')}ed.",
                    messages.SUCCESS,
                )
                return redirect(change_url)
        return TemplateResponse(
            request,
            "admin/payments/payment/confirm_review.html",
            {
                **self.admin_site.each_context(request),
                "opts": self.opts,
                "app_label": self.opts.app_label,
                "title": f"Review payment {payment.pk}",
                "payment": payment,
                "evidence": evidence_shown(payment.review_evidence)
                if payment.review_evidence
                else "",
                "form": form,
                "error": error,
                "cancel_url": change_url,
            },
        )
