"""A merchant as an originator: its profile and the profile's changes."""

from django.conf import settings
from django.db import models
from django.db.models.functions import Now


class OriginatorProfile(models.Model):
    """A merchant as an originator: the company name and identification the receiver's
    statement and the bank's batches show, the SEC codes it may originate, and its default
    entry description. Edited in the admin (``change_originatorprofile``), each change with its
    ``OriginatorProfileChange`` row (``payments.services.originators``). A merchant without one
    originates every class under the global originator's identity, as before."""

    merchant_id = models.CharField(max_length=64, unique=True)
    company_name = models.CharField(max_length=16)
    company_identification = models.CharField(max_length=10)
    allowed_sec_codes = models.JSONField(default=list)
    default_entry_description = models.CharField(max_length=10, blank=True)
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["merchant_id"]

    def __str__(self) -> str:
        return f"{self.merchant_id}: {self.company_name} ({self.company_identification})"


class OriginatorProfileChange(models.Model):
    """Audit row: who changed a merchant's originator profile, when, and each field's value
    before and after (``{field: [before, after]}``; a new profile's before is null)."""

    profile = models.ForeignKey(OriginatorProfile, on_delete=models.PROTECT, related_name="changes")
    merchant_id = models.CharField(max_length=64, db_index=True)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True
    )
    changes = models.JSONField()
    created_at = models.DateTimeField(db_default=Now(), editable=False, db_index=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.merchant_id} changed by {self.user} ({', '.join(self.changes)})"
