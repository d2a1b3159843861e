"""Merchants' exposure limits in the admin: changed only by a user with
``payments.change_exposure_limits``, each change with a note and an audit row
(``payments.services.limits.exposure_limit_set``); the audit rows are read-only. Registered by
``payments.admin``."""

from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError

from payments.admin_base import ReadOnlyModelAdmin
from payments.exposure_limits import KINDS, Limits, currency_code
from payments.models import ExposureLimit, ExposureLimitChange
from payments.serializers import MERCHANT_MESSAGE, MERCHANT_RE
from payments.services.limits import CHANGE_PERMISSION, exposure_limit_set


class ExposureLimitForm(forms.ModelForm):
    note = forms.CharField(
        label="Note (required)",
        widget=forms.Textarea(attrs={"rows": 3, "cols": 80}),
        strip=True,
        max_length=2000,
        help_text="Why the limits change (the review, the ticket): kept with the audit row.",
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
