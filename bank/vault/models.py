"""A bank account in the vault: its numbers sealed (``crypto``), its token in the clear.

Only the last 4 digits of the account number are kept in the clear, for people to tell
accounts apart (the admin, the API's answer). Nothing else of the numbers is stored.
"""

from django.db import models


class AccountType(models.TextChoices):
    CHECKING = "checking", "Checking"
    SAVINGS = "savings", "Savings"


class SecCode(models.TextChoices):
    """How the receiver authorized the debits (NACHA's standard entry class)."""

    PPD = "PPD", "PPD: consumer, written authorization"
    CCD = "CCD", "CCD: business account"
    WEB = "WEB", "WEB: consumer, authorized online"


class VaultAccount(models.Model):
    token = models.CharField(max_length=64, unique=True)
    merchant_id = models.CharField(max_length=64, db_index=True)
    account_type = models.CharField(max_length=8, choices=AccountType.choices)
    sec_code = models.CharField(max_length=3, choices=SecCode.choices)
    account_last4 = models.CharField(max_length=4)
    key_version = models.CharField(max_length=32, db_index=True)
    wrapped_key = models.BinaryField()
    nonce = models.BinaryField()
    ciphertext = models.BinaryField()
    created_at = models.DateTimeField(auto_now_add=True)
    rotated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "payments_vaultaccount"
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.token} (****{self.account_last4})"

    def __repr__(self) -> str:
        return f"<VaultAccount {self}>"
