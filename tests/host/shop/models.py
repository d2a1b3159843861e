"""The host's own records of money moving: an order paid by a payment, and one notice per
payment state change (written by a ``payment_transitioned`` receiver, in its transaction)."""

from django.db import models


class Order(models.Model):
    reference = models.CharField(max_length=32, unique=True)
    payment_id = models.UUIDField(null=True, blank=True, unique=True)
    paid = models.BooleanField(default=False)

    def __str__(self) -> str:
        return self.reference


class PaymentNotice(models.Model):
    payment_id = models.UUIDField(db_index=True)
    from_state = models.CharField(max_length=16)
    to_state = models.CharField(max_length=16)
    event_row_id = models.BigIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.payment_id}: {self.from_state} -> {self.to_state}"
