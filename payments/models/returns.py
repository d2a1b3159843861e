"""Returns, their dishonors, the double losses they leave and the per-merchant return counts."""

import uuid

from django.conf import settings
from django.db import models
from django.db.models.functions import Now

from payments.models.payment import Payment


class PaymentReturn(models.Model):
    """The ACH return of a payment, with its NACHA reason code: one per payment.

    Written in the transaction that applies the ``returned`` event, whether it came before
    settlement (the payment failed), after it (the payment is returned and its credit
    reversed) or after the payment had failed (it stays failed, nothing to reverse). Flags are
    for humans: an unknown code, a late return or a return after failure is kept all the same,
    because the money has already moved.
    """

    payment = models.OneToOneField(Payment, on_delete=models.PROTECT, related_name="ach_return")
    merchant_id = models.CharField(max_length=64, db_index=True)
    processor_event_id = models.CharField(max_length=128)
    reason_code = models.CharField(max_length=16, blank=True)
    reason_title = models.CharField(max_length=255, blank=True)
    category = models.CharField(max_length=16, blank=True, help_text="empty for an unknown code")
    after_settlement = models.BooleanField()
    settled_at = models.DateTimeField(null=True, blank=True)
    returned_at = models.DateTimeField(help_text="the processor's timestamp of the return")
    deadline = models.DateTimeField(null=True, blank=True)
    unknown_code = models.BooleanField(default=False, db_index=True)
    late = models.BooleanField(default=False, db_index=True, help_text="late return")
    after_failure = models.BooleanField(
        default=False,
        db_index=True,
        help_text="returned after the payment had failed (a 4xx rejection or a failed event)",
    )
    created_at = models.DateTimeField(db_default=Now(), editable=False, db_index=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.reason_code or '(no code)'} {self.reason_title} for {self.payment_id}"

    @property
    def flags(self) -> list[str]:
        flags = []
        if self.unknown_code:
            flags.append("unknown code")
        if self.late:
            flags.append("late return")
        if self.after_failure:
            flags.append("after failure")
        return flags


class DishonorRequestStatus(models.TextChoices):
    NONE = "", "Not asked by us (the processor reported it)"
    REQUESTED = "requested", "Requested (not yet accepted by the processor)"
    SENT = "sent", "Sent (the processor accepted the request)"
    FAILED = "failed", "Failed (the processor did not take it; send it again)"


class DoubleLossStatus(models.TextChoices):
    OPEN = "open", "Open (to recover)"
    RECOVERED = "recovered", "Recovered outside ACH"
    WRITTEN_OFF = "written_off", "Written off"
    UNDONE = "undone", "Undone (the refund failed or came back)"


class DoubleLoss(models.Model):
    """A debit returned after a refund of it was sent: both stand, so the customer has the
    money twice (Stripe only warns). Recorded once per refund when the return is applied, with
    the recovery the merchant is owed booked in the ledger (``recovery_owed``, pending) and a
    high alert; a person recovers it outside ACH and closes it here."""

    payment = models.ForeignKey(Payment, on_delete=models.PROTECT, related_name="double_losses")
    refund = models.OneToOneField(
        Payment, on_delete=models.PROTECT, related_name="double_loss", editable=False
    )
    merchant_id = models.CharField(max_length=64, db_index=True)
    amount = models.DecimalField(max_digits=14, decimal_places=2)
    currency = models.CharField(max_length=3)
    return_event_id = models.CharField(max_length=128)
    refund_state = models.CharField(max_length=16)  # the refund's state when the return came
    status = models.CharField(
        max_length=12, choices=DoubleLossStatus.choices, default=DoubleLossStatus.OPEN
    )
    detected_at = models.DateTimeField(db_default=Now(), editable=False)
    resolved_at = models.DateTimeField(null=True, blank=True)
    resolved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    note = models.TextField(blank=True)

    class Meta:
        ordering = ["-detected_at", "-id"]
        permissions = [("resolve_double_loss", "Can close a double loss (recovered, written off)")]

    def __str__(self) -> str:
        return f"double loss {self.amount} {self.currency} on {self.payment_id} ({self.status})"


class ReturnDishonor(models.Model):
    """The dishonor of a payment's return: our request and what came of it, one per payment.

    The operator's request (code R61-R69, note, who, when) is written before the processor is
    called, so a failed call leaves the request and its attempt rows behind (status ``failed``)
    rather than nothing. The processor's answers are facts on the same row: ``return_dishonored``
    (the dishonor stood) and ``dishonor_contested`` (R71-R77: the receiving bank contests, the
    return stands). Either may come first or twice; the ledger follows from which facts are
    recorded (``payments.services.dishonors``), never from their order.
    """

    payment = models.OneToOneField(Payment, on_delete=models.PROTECT, related_name="dishonor")
    ach_return = models.OneToOneField(
        PaymentReturn, on_delete=models.PROTECT, related_name="dishonor"
    )
    merchant_id = models.CharField(max_length=64, db_index=True)
    # Sent unchanged on every attempt of the request: the processor dishonors once.
    idempotency_key = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    reason_code = models.CharField(max_length=16, blank=True, help_text="R61-R69")
    note = models.TextField(blank=True)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True
    )
    requested_at = models.DateTimeField(null=True, blank=True)
    request_status = models.CharField(
        max_length=16, choices=DishonorRequestStatus.choices, blank=True, db_index=True
    )
    last_error = models.TextField(blank=True)
    dishonored_event_id = models.CharField(max_length=128, blank=True)
    dishonored_at = models.DateTimeField(
        null=True, blank=True, help_text="the processor's timestamp of return_dishonored"
    )
    contested_event_id = models.CharField(max_length=128, blank=True)
    contested_at = models.DateTimeField(
        null=True, blank=True, help_text="the processor's timestamp of dishonor_contested"
    )
    contest_reason_code = models.CharField(max_length=16, blank=True, help_text="R71-R77")
    unrequested = models.BooleanField(
        default=False, db_index=True, help_text="reported by the processor without our request"
    )
    unknown_code = models.BooleanField(
        default=False, db_index=True, help_text="a reason code outside R61-R69 / R71-R77"
    )
    created_at = models.DateTimeField(db_default=Now(), editable=False, db_index=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"dishonor {self.reason_code or '(no code)'} of the return of {self.payment_id}"

    @property
    def outcome(self) -> str:
        """What the facts say, whatever order they came in."""
        if self.contested_event_id:
            return "contested: the return stands"
        if self.dishonored_event_id:
            return "dishonored: the return is undone"
        return self.get_request_status_display() if self.request_status else "—"


class MerchantReturnDay(models.Model):
    """Per merchant and day (UTC): debits the ACH network answered and returns, by category.

    Incremented in the transaction of the transition that counts (an upsert, so concurrent
    transitions add up), so the return rates over a window are a sum over at most window-days
    rows per merchant, never a scan of payments.
    """

    merchant_id = models.CharField(max_length=64)
    day = models.DateField()
    debits = models.PositiveIntegerField(default=0)
    returns = models.PositiveIntegerField(default=0)
    unauthorized_returns = models.PositiveIntegerField(default=0)
    administrative_returns = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["-day", "merchant_id"]
        constraints = [
            models.UniqueConstraint(fields=["merchant_id", "day"], name="merchant_return_day")
        ]
        indexes = [models.Index(fields=["day", "merchant_id"])]

    def __str__(self) -> str:
        return f"{self.merchant_id} {self.day}: {self.returns}/{self.debits}"
