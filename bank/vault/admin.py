"""The vault in the admin: which accounts exist and under which key, the last 4 digits only.

The sealed columns are not shown at all (not even as bytes), and nothing is added or edited
here: an account is stored through the vault's entry point, which checks it.
"""

from django.contrib import admin

from bank.vault.models import VaultAccount
from payments.admin_base import ReadOnlyModelAdmin


@admin.register(VaultAccount)
class VaultAccountAdmin(ReadOnlyModelAdmin):
    list_display = (
        "token",
        "merchant_id",
        "masked_account",
        "account_type",
        "sec_code",
        "key_version",
        "created_at",
    )
    list_filter = ("account_type", "sec_code", "key_version")
    search_fields = ("token", "merchant_id")
    fields = (
        "token",
        "merchant_id",
        "masked_account",
        "account_type",
        "sec_code",
        "key_version",
        "created_at",
        "rotated_at",
    )
    readonly_fields = fields

    def get_readonly_fields(self, request, obj=None):
        return self.fields

    @admin.display(description="account")
    def masked_account(self, obj: VaultAccount) -> str:
        return f"****{obj.account_last4}"
