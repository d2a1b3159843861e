"""Who may act for which merchant, and the Idempotency-Key records of the API."""

from django.conf import settings
from django.db import models


class ApiIdempotencyKey(models.Model):
    """Idempotency-Key header records of the API's POSTs (payments, reinitiations, the vault's
    accounts; kept at least 24 hours)."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    key = models.CharField(max_length=255)
    request_hash = models.CharField(max_length=64)
    response_status = models.PositiveSmallIntegerField(null=True, blank=True)
    response_body = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    completed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "key"], name="api_idempotency_key_unique")
        ]

    def __str__(self) -> str:
        return self.key


class MerchantAccess(models.Model):
    """A grant: this API user may create payments for, and read, this merchant's payments and
    balance. Read through the access policy (``payments.access``), never directly by views."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="merchant_grants"
    )
    merchant_id = models.CharField(max_length=64, db_index=True)
    note = models.CharField(max_length=255, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name = "merchant access grant"
        constraints = [
            models.UniqueConstraint(fields=["user", "merchant_id"], name="merchant_access_unique")
        ]

    def __str__(self) -> str:
        return f"{self.user} -> {self.merchant_id}"
