from django.contrib import admin

from tests.host.accounts.models import User


@admin.register(User)
class UserAdmin(admin.ModelAdmin):
    list_display = ["email", "is_staff", "is_active"]
    search_fields = ["email"]
