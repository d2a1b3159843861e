"""The read-only admin every app of the module shows its audit rows with (history is never
edited by hand), and the note every confirm-with-a-note action asks for; apart from
``payments.admin`` so the admins of the bank path's parts, which ``payments.admin`` registers,
can build on it."""

from django import forms
from django.contrib import admin


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


def note_field(help_text: str, *, required_message: str | None = None, rows: int = 4):
    """The note every confirm-with-a-note form of the admin asks for: required (in the browser
    too), stripped, at most 2,000 characters, with why it is asked in ``help_text``; it goes in
    the audit row the action writes."""
    return forms.CharField(
        label="Note (required)",
        widget=forms.Textarea(attrs={"rows": rows, "cols": 80, "required": True}),
        strip=True,
        max_length=2000,
        error_messages={"required": required_message} if required_message else None,
        help_text=help_text,
    )
