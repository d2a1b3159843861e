"""Notifications of change and what was done about them."""

from django.conf import settings
from django.db import models
from django.db.models.functions import Now

from payments.models.payment import Payment
from payments.models.validation import AccountValidation


class NocStatus(models.TextChoices):
    OPEN = "open", "Open (to apply at the processor)"
    APPLIED = "applied", "Applied (the token was updated)"
    REFUSED = "refused", "Refused NOC (nothing to apply)"


class NotificationOfChange(models.Model):
    """A notification of change (NOC) for a payment and its ``source_token``, one per processor
    event: which detail was wrong (the change code and its title), the corrected fields, and
    the NACHA deadline to apply it by (``payments.services.nocs``). Written in the transaction
    that claims the event; it moves no state and no money. An open NOC past its deadline
    blocks new debits on its token until an operator marks it applied.

    A NOC of an account's prenote answers no payment: it names the account's validation
    instead (``account_validation``), and is kept and applied as any other."""

    payment = models.ForeignKey(
        Payment, on_delete=models.PROTECT, related_name="nocs", null=True, blank=True
    )
    account_validation = models.ForeignKey(
        AccountValidation,
        on_delete=models.PROTECT,
        related_name="nocs",
        null=True,
        blank=True,
        help_text="the validation whose prenote the NOC answered (no payment then)",
    )
    merchant_id = models.CharField(max_length=64)
    source_token = models.CharField(max_length=128)
    processor_event_id = models.CharField(max_length=128, unique=True)
    change_code = models.CharField(max_length=8)
    change_title = models.CharField(max_length=255, blank=True)
    corrected_data = models.JSONField(default=dict, blank=True)
    unknown_code = models.BooleanField(default=False, db_index=True)
    status = models.CharField(max_length=16, choices=NocStatus.choices)
    received_at = models.DateTimeField(help_text="the processor's timestamp of the NOC")
    deadline = models.DateTimeField(
        null=True, blank=True, help_text="apply by: 6 banking days after it was received"
    )
    applied_at = models.DateTimeField(null=True, blank=True)
    applied_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True
    )
    applied_note = models.TextField(blank=True)
    created_at = models.DateTimeField(db_default=Now(), editable=False)

    class Meta:
        ordering = ["deadline", "id"]
        verbose_name = "notification of change"
        verbose_name_plural = "notifications of change"
        permissions = [("apply_noc", "Can mark a notification of change applied")]
        constraints = [
            # A NOC answers one entry: a payment's, or a validation's prenote.
            models.CheckConstraint(
                condition=models.Q(payment__isnull=False, account_validation__isnull=True)
                | models.Q(payment__isnull=True, account_validation__isnull=False),
                name="noc_of_a_payment_or_a_prenote",
            ),
        ]
        indexes = [
            # A debit's check: the token's open NOCs, by deadline.
            models.Index(
                fields=["source_token", "deadline"],
                condition=models.Q(status="open"),
                name="noc_open_by_token",
            ),
            models.Index(
                fields=["deadline"], condition=models.Q(status="open"), name="noc_open_deadline"
            ),
        ]

    def __str__(self) -> str:
        of = self.payment_id or f"the prenote of validation {self.account_validation_id}"
        return f"NOC {self.change_code} {self.change_title} for {of}"


class NocAction(models.Model):
    """Audit row: who closed which NOC, when, why, and its status before and after."""

    noc = models.ForeignKey(NotificationOfChange, on_delete=models.PROTECT, related_name="actions")
    action = models.CharField(max_length=16, default="apply")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT)
    note = models.TextField()
    status_before = models.CharField(max_length=16, choices=NocStatus.choices)
    status_after = models.CharField(max_length=16, choices=NocStatus.choices)
    created_at = models.DateTimeField(db_default=Now(), editable=False, db_index=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.action} NOC {self.noc_id} by {self.user}"
