"""The books in the admin: statements (imported or refused), their lines and matches, and the
variances, each with its evidence: the bank line, the batch's file, the payments. A variance
is never edited: a person with ``bank.explain_variance`` explains an open one through a
confirmation page with a note (``variance_explain``: an audit row, who and when)."""

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.shortcuts import get_object_or_404, redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join

from bank.books.models import (
    BankStatement,
    BooksVariance,
    StatementLine,
    StatementMatch,
    VarianceExplanation,
    VarianceStatus,
)
from bank.books.services import VarianceNotOpen, variance_explain
from bank.nacha.models import NachaEntry
from payments.admin_base import ReadOnlyAdminMixin, ReadOnlyInline, ReadOnlyModelAdmin, note_field
from payments.models import LedgerEntry

EXPLAIN_PERMISSION = "bank.explain_variance"


class StatementLineInline(ReadOnlyInline):
    model = StatementLine
    fields = (
        "record_number",
        "as_of_date",
        "type_code",
        "direction",
        "amount",
        "customer_reference",
        "text",
        "match_status",
    )


@admin.register(BankStatement)
class BankStatementAdmin(ReadOnlyModelAdmin):
    """What the bank reported: imported, or refused whole with the record and the reason (the
    statement is kept sealed; it names our bank account, so its bytes are never shown)."""

    list_display = (
        "name",
        "status",
        "refused_record",
        "refused_reason",
        "line_count",
        "received_at",
    )
    list_filter = ("status",)
    search_fields = ("name", "sha256")
    fields = (
        "name",
        "status",
        "refused_record",
        "refused_reason",
        "line_count",
        "sha256",
        "received_at",
    )
    inlines = [StatementLineInline]

    def get_readonly_fields(self, request, obj=None):
        return self.fields


class StatementMatchInline(ReadOnlyInline):
    model = StatementMatch
    fields = (
        "kind",
        "nacha_file",
        "batch_number",
        "sec_code",
        "payment",
        "expected_amount",
        "created_at",
    )


@admin.register(StatementLine)
class StatementLineAdmin(ReadOnlyModelAdmin):
    list_display = (
        "as_of_date",
        "type_code",
        "direction",
        "amount",
        "matched_amount",
        "match_status",
        "customer_reference",
        "statement",
    )
    list_filter = ("match_status", "direction", "as_of_date")
    search_fields = ("customer_reference", "bank_reference", "text")
    list_select_related = ("statement",)
    inlines = [StatementMatchInline]


class VarianceExplanationInline(ReadOnlyInline):
    model = VarianceExplanation
    fields = ("created_at", "explained_by", "note")
    show_change_link = False


class VarianceExplainForm(forms.Form):
    note = note_field(
        "Why the bank and the books differ, and where it is followed up (ticket, "
        "the bank's reference). The amounts are not changed.",
    )


@admin.register(BooksVariance)
class BooksVarianceAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = (
        "day",
        "kind",
        "status",
        "currency",
        "merchants",
        "expected_amount",
        "bank_amount",
        "found_at",
    )
    list_filter = ("status", "kind", "day")
    search_fields = ("key", "summary")
    list_select_related = ("line", "nacha_file")
    ordering = ("status", "day", "found_at")
    inlines = [VarianceExplanationInline]

    def get_queryset(self, request):
        return super().get_queryset(request).prefetch_related("payments")

    def get_readonly_fields(self, request, obj=None):
        return [
            "explain_link",
            "evidence_line",
            "evidence_payments",
            "evidence_entries",
            *(f.name for f in self.model._meta.fields),
        ]

    def has_explain_permission(self, request) -> bool:
        return request.user.has_perm(EXPLAIN_PERMISSION)

    @admin.display(description="merchants")
    def merchants(self, obj):
        return ", ".join(obj.merchant_ids) or "(the bank account)"

    @admin.display(description="bank line")
    def evidence_line(self, obj):
        line = obj.line
        if line is None:
            return "— (nothing at the bank)"
        url = reverse("admin:bank_statementline_change", args=[line.pk])
        return format_html(
            '<a href="{}">{} {} {} {}</a> record {} of statement {}: <pre>{} | {} | {}</pre>',
            url,
            line.as_of_date,
            line.type_code,
            line.direction,
            line.amount,
            line.record_number,
            line.statement_id,
            line.bank_reference,
            line.customer_reference,
            line.text,
        )

    @admin.display(description="payments")
    def evidence_payments(self, obj):
        rows = [
            (reverse("admin:payments_payment_change", args=[p.pk]), p.pk, p.merchant_id, p.amount)
            for p in obj.payments.all()
        ]
        if not rows:
            return "—"
        return format_html_join(", ", '<a href="{}">{}</a> ({} {})', rows)

    @admin.display(description="ledger and trace numbers")
    def evidence_entries(self, obj):
        """Each payment's NACHA entry (trace number, file) and its ledger entries."""
        payment_ids = [p.pk for p in obj.payments.all()]
        if not payment_ids:
            return "—"
        traces = dict(
            NachaEntry.objects.filter(payment_id__in=payment_ids).values_list(
                "payment_id", "trace_number"
            )
        )
        ledger: dict = {}
        for entry in LedgerEntry.objects.filter(payment_id__in=payment_ids).order_by("id"):
            ledger.setdefault(entry.payment_id, []).append(f"{entry.kind} {entry.amount}")
        return format_html_join(
            "\n",
            "<div>{} trace {}: {}</div>",
            (
                (pid, traces.get(pid, "—"), ", ".join(ledger.get(pid, [])) or "no ledger entry")
                for pid in payment_ids
            ),
        )

    @admin.display(description="explain")
    def explain_link(self, obj):
        if obj is None or obj.status != VarianceStatus.OPEN:
            return "—"
        url = reverse("admin:bank_booksvariance_explain", args=[obj.pk])
        return format_html('<a class="button" href="{}">Explain…</a>', url)

    def get_urls(self):
        return [
            path(
                "<int:variance_id>/explain/",
                self.admin_site.admin_view(self.explain_view),
                name="bank_booksvariance_explain",
            ),
            *super().get_urls(),
        ]

    def explain_view(self, request, variance_id: int):
        """Confirm with a note, then explain the variance through the service."""
        if not self.has_explain_permission(request):
            raise PermissionDenied(f"Explaining a variance needs the {EXPLAIN_PERMISSION} right.")
        variance = get_object_or_404(BooksVariance, pk=variance_id)
        change_url = reverse("admin:bank_booksvariance_change", args=[variance.pk])
        form = VarianceExplainForm(request.POST or None)
        error = None
        if request.method == "POST" and form.is_valid():
            try:
                variance_explain(
                    variance_id=variance.pk, user=request.user, note=form.cleaned_data["note"]
                )
            except (VarianceNotOpen, ValueError) as exc:
                error = str(exc)
            else:
                self.message_user(request, f"Variance {variance.pk} explained.", messages.SUCCESS)
                return redirect(change_url)
        return TemplateResponse(
            request,
            "admin/bank/booksvariance/confirm_explain.html",
            {
                **self.admin_site.each_context(request),
                "opts": self.opts,
                "app_label": self.opts.app_label,
                "title": f"Explain variance {variance.pk}",
                "variance": variance,
                "form": form,
                "error": error,
                "cancel_url": change_url,
            },
        )


@admin.register(VarianceExplanation)
class VarianceExplanationAdmin(ReadOnlyModelAdmin):
    list_display = ("created_at", "variance", "explained_by")
    list_select_related = ("variance", "explained_by")
