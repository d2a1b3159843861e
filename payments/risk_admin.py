"""The review queue and the account blocks in the admin. Registered by ``payments.admin``.

The queue lists the payments held for review (``HeldPayment``), oldest first, filtered by the
rule that held them and the merchant, for a user with ``payments.review_payment``. One is decided
on its own review page (``payments.limits_admin.PaymentReviewMixin``); several held by the same
rule are approved or rejected together through a confirmation page with one note, each by the
same service (``payments.services.review``) under its own row lock, so a decision racing the
merchant's cancel or another reviewer is refused for that payment alone and reported.

An account block (``AccountBlock``) is read-only; a user with ``payments.clear_account_block``
clears an open one with a note (``payments.services.fraud.account_block_clear``), which the row
keeps with who and when.
"""

from __future__ import annotations

import uuid

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import PermissionDenied, ValidationError
from django.shortcuts import get_object_or_404, redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html

from payments.admin_base import ReadOnlyAdminMixin, note_field
from payments.exceptions import CancelRefused, PaymentNotFound
from payments.models import AccountBlock, HeldPayment, ReviewStatus
from payments.services.fraud import CLEAR_PERMISSION, account_block_clear
from payments.services.review import (
    REVIEW_PERMISSION,
    ReviewRefused,
    payment_review_approve,
    payment_review_reject,
)

# A bulk decision is a person's judgment on each payment: a page of them at most.
BULK_MAX = 100
DECIDED = {"approve": "approved", "reject": "rejected"}


class BulkReviewForm(forms.Form):
    note = note_field("Why: what was checked for all of them, with whom, the ticket.")


@admin.register(HeldPayment)
class HeldPaymentAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = [
        "created_at",
        "held_for",
        "merchant_id",
        "purpose",
        "amount",
        "currency",
        "review_rule",
        "review_reason",
        "decide",
    ]
    list_filter = ["review_rule", "merchant_id", "purpose"]
    search_fields = ["=id", "merchant_id"]
    ordering = ["created_at"]
    actions = ["approve_selected", "reject_selected"]
    list_per_page = BULK_MAX

    def get_queryset(self, request):
        return super().get_queryset(request).filter(review_status=ReviewStatus.HELD)

    def has_view_permission(self, request, obj=None):
        return request.user.has_perm(REVIEW_PERMISSION)

    def has_module_permission(self, request):
        return request.user.has_perm(REVIEW_PERMISSION) or super().has_module_permission(request)

    def get_actions(self, request):
        if not request.user.has_perm(REVIEW_PERMISSION):
            return {}
        return super().get_actions(request)

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in self.model._meta.fields]

    def response_action(self, request, queryset):
        # A forged selection (not a payment id) is refused by name, not a 500 from the query.
        selected = request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)
        try:
            for value in selected:
                uuid.UUID(value)
        except ValueError:
            self.message_user(request, "The selection holds something that is not a payment id.")
            return None
        return super().response_action(request, queryset)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        # The payment's own page has its history and the decision.
        return redirect(reverse("admin:payments_payment_change", args=[object_id]))

    @admin.display(description="held for")
    def held_for(self, obj):
        hours = (timezone.now() - obj.created_at).total_seconds() / 3600
        return f"{hours:.0f} h" if hours >= 1 else "< 1 h"

    @admin.display(description="decide")
    def decide(self, obj):
        url = reverse("admin:payments_payment_review", args=[obj.pk])
        return format_html('<a class="button" href="{}">Approve or reject…</a>', url)

    @admin.action(description="Approve the selected payments (held by one rule)…")
    def approve_selected(self, request, queryset):
        return self._bulk(request, queryset, "approve")

    @admin.action(description="Reject the selected payments (held by one rule)…")
    def reject_selected(self, request, queryset):
        return self._bulk(request, queryset, "reject")

    def _bulk(self, request, queryset, decision: str):
        if not request.user.has_perm(REVIEW_PERMISSION):
            raise PermissionDenied(f"Deciding a held payment needs {REVIEW_PERMISSION}.")
        payments = list(queryset.order_by("created_at")[: BULK_MAX + 1])
        rules = {payment.review_rule for payment in payments}
        if len(payments) > BULK_MAX:
            self.message_user(request, f"Select at most {BULK_MAX} payments.", messages.ERROR)
            return None
        if len(rules) != 1:
            self.message_user(
                request,
                "A bulk decision is for payments held by one rule: filter by rule first "
                f"(the selection has {', '.join(sorted(r or '(none)' for r in rules))}).",
                messages.ERROR,
            )
            return None
        form = BulkReviewForm(request.POST if request.POST.get("confirmed") else None)
        if form.is_valid():
            self._bulk_decide(request, payments, decision, form.cleaned_data["note"])
            return None
        return TemplateResponse(
            request,
            "admin/payments/heldpayment/confirm_bulk_review.html",
            {
                **self.admin_site.each_context(request),
                "opts": self.opts,
                "app_label": self.opts.app_label,
                "title": f"{decision.capitalize()} {len(payments)} held payments",
                "payments": payments,
                "rule": rules.pop(),
                "decision": decision,
                "action": f"{decision}_selected",
                "form": form,
                "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            },
        )

    def _bulk_decide(self, request, payments, decision: str, note: str) -> None:
        decide = payment_review_approve if decision == "approve" else payment_review_reject
        done, refused = 0, []
        for payment in payments:
            try:
                decide(payment_id=payment.pk, user=request.user, note=note)
            except (ReviewRefused, CancelRefused, PaymentNotFound) as exc:
                refused.append(f"{payment.pk}: {exc}")
            else:
                done += 1
        past = DECIDED[decision]
        self.message_user(request, f"{done} payment(s) {past}.", messages.SUCCESS)
        for line in refused:
            self.message_user(request, f"Not {past}, {line}", messages.WARNING)


class AccountBlockClearForm(forms.Form):
    note = note_field("Why the block is cleared: the account holder's confirmation, the ticket.")


@admin.register(AccountBlock)
class AccountBlockAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = [
        "opened_at",
        "account_token",
        "scope",
        "merchant_id",
        "return_code",
        "reason",
        "cleared_at",
        "cleared_by",
    ]
    list_filter = ["scope", "return_code", ("cleared_at", admin.EmptyFieldListFilter)]
    search_fields = ["=account_token", "merchant_id"]
    list_select_related = ["cleared_by"]

    def get_readonly_fields(self, request, obj=None):
        return ["clear_link", *(f.name for f in self.model._meta.fields)]

    def has_view_permission(self, request, obj=None):
        return super().has_view_permission(request, obj) or request.user.has_perm(CLEAR_PERMISSION)

    @admin.display(description="clear")
    def clear_link(self, obj):
        if obj is None or obj.cleared_at is not None:
            return "—"
        url = reverse("admin:payments_accountblock_clear", args=[obj.pk])
        return format_html('<a class="button" href="{}">Clear…</a>', url)

    def get_urls(self):
        return [
            path(
                "<int:block_id>/clear/",
                self.admin_site.admin_view(self.clear_view),
                name="payments_accountblock_clear",
            ),
            *super().get_urls(),
        ]

    def clear_view(self, request, block_id: int):
        if not request.user.has_perm(CLEAR_PERMISSION):
            raise PermissionDenied(f"Clearing an account block needs {CLEAR_PERMISSION}.")
        block = get_object_or_404(AccountBlock, pk=block_id)
        change_url = reverse("admin:payments_accountblock_change", args=[block.pk])
        form = AccountBlockClearForm(request.POST or None)
        error = None
        if request.method == "POST" and form.is_valid():
            try:
                account_block_clear(
                    block_id=block.pk, user=request.user, note=form.cleaned_data["note"]
                )
            except ValidationError as exc:
                error = "; ".join(exc.messages)
            else:
                self.message_user(request, f"Account block {block.pk} cleared.", messages.SUCCESS)
                return redirect(change_url)
        return TemplateResponse(
            request,
            "admin/payments/accountblock/confirm_clear.html",
            {
                **self.admin_site.each_context(request),
                "opts": self.opts,
                "app_label": self.opts.app_label,
                "title": f"Clear account block {block.pk}",
                "account_block": block,
                "form": form,
                "error": error,
                "cancel_url": change_url,
            },
        )
