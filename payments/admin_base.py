"""The read-only admin every app of the module shows its audit rows with (history is never
edited by hand); apart from ``payments.admin`` so the admins of the bank path's parts, which
``payments.admin`` registers, can build on it."""

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
