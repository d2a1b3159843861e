"""Risk controls: exposure limits and their changes, the review queue and account blocks."""

from django.conf import settings
from django.db import models
from django.db.models.functions import Now

from payments.models.payment import Payment, PaymentDirection


class ExposureLimit(models.Model):
    """One merchant's own exposure limits in one direction and currency
    (``payments.exposure_limits``): they replace the default of ``PAYMENTS["EXPOSURE_LIMITS"]``
    for it; an empty cap caps nothing. Written only by ``payments.services.limits
    .exposure_limit_set``, each change with its ``ExposureLimitChange``."""

    merchant_id = models.CharField(max_length=64)
    direction = models.CharField(max_length=8, choices=PaymentDirection.choices)
    currency = models.CharField(max_length=3, default="USD")
    single_limit = models.DecimalField(max_digits=14, decimal_places=2, null=True, blank=True)
    daily_limit = models.DecimalField(max_digits=14, decimal_places=2, null=True, blank=True)
    window_limit = models.DecimalField(max_digits=14, decimal_places=2, null=True, blank=True)
    window_banking_days = models.PositiveSmallIntegerField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["merchant_id", "direction", "currency"]
        permissions = [("change_exposure_limits", "Can change merchants' exposure limits")]
        constraints = [
            models.UniqueConstraint(
                fields=["merchant_id", "direction", "currency"], name="exposure_limit_unique"
            ),
            models.CheckConstraint(
                condition=(
                    (models.Q(single_limit__isnull=True) | models.Q(single_limit__gt=0))
                    & (models.Q(daily_limit__isnull=True) | models.Q(daily_limit__gt=0))
                    & (
                        models.Q(window_limit__isnull=True, window_banking_days__isnull=True)
                        | models.Q(
                            window_limit__gt=0,
                            window_banking_days__gte=1,
                            window_banking_days__lte=60,
                        )
                    )
                ),
                name="exposure_limit_values",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.merchant_id} {self.direction} {self.currency}"


class ExposureLimitChange(models.Model):
    """The audit row of one change of a merchant's exposure limits: who, when, what they were,
    what they became, and why. Never edited."""

    merchant_id = models.CharField(max_length=64, db_index=True)
    direction = models.CharField(max_length=8, choices=PaymentDirection.choices)
    currency = models.CharField(max_length=3)
    changed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    changed_at = models.DateTimeField(db_default=Now(), editable=False, db_index=True)
    old = models.JSONField()
    new = models.JSONField()
    note = models.TextField()

    class Meta:
        ordering = ["-changed_at", "-id"]
        constraints = [
            models.CheckConstraint(
                condition=~models.Q(note=""), name="exposure_limit_change_note_required"
            )
        ]

    def __str__(self) -> str:
        return f"{self.merchant_id} {self.direction} {self.currency} at {self.changed_at}"


class HeldPayment(Payment):
    """The review queue (``payments.risk_admin``): payments held for a person's review, as the
    admin lists them by rule and merchant. No table of its own."""

    class Meta:
        proxy = True
        verbose_name = "payment held for review"
        verbose_name_plural = "review queue"


class AccountBlockScope(models.TextChoices):
    """Whose debits a block refuses: every merchant's (an R17 return the bank marked
    ``QUESTIONABLE``: the account was opened under false pretenses) or the merchant's whose
    debit came back unauthorized."""

    ALL_MERCHANTS = "all", "Every merchant"
    MERCHANT = "merchant", "The merchant"


class AccountBlock(models.Model):
    """An account no further debit may be drawn from (``payments.services.fraud``), opened by a
    return and cleared only by a person with ``payments.clear_account_block``, with a note. The
    row is its own audit: who opened it by which return, who cleared it, when and why; never
    edited otherwise, never deleted."""

    merchant_id = models.CharField(max_length=64, db_index=True)
    account_token = models.CharField(max_length=128, db_index=True)
    scope = models.CharField(max_length=8, choices=AccountBlockScope.choices)
    reason = models.CharField(max_length=255)
    return_code = models.CharField(max_length=4, blank=True, default="")
    payment = models.ForeignKey(
        Payment, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    opened_at = models.DateTimeField(db_default=Now(), editable=False, db_index=True)
    cleared_at = models.DateTimeField(null=True, blank=True, editable=False)
    cleared_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="+",
        editable=False,
    )
    note = models.TextField(blank=True, default="", editable=False)

    class Meta:
        ordering = ["-opened_at", "-id"]
        permissions = [("clear_account_block", "Can clear a block on an account's debits")]
        constraints = [
            # One open block per account and merchant and scope: a second return of the same
            # account while it is blocked adds nothing (``IntegrityError``: someone did it).
            models.UniqueConstraint(
                fields=["account_token", "merchant_id", "scope"],
                condition=models.Q(cleared_at__isnull=True),
                name="account_block_open_unique",
            ),
            models.CheckConstraint(
                condition=models.Q(cleared_at__isnull=True)
                | (models.Q(cleared_by__isnull=False) & ~models.Q(note="")),
                name="account_block_cleared_with_note",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.account_token} blocked ({self.get_scope_display()}, {self.return_code})"


class MerchantDayFigures(models.Model):
    """What a merchant's entries of one direction and currency created on one Eastern calendar
    day come to: their amount and how many they are (the day's total, or a change to it)."""

    merchant_id = models.CharField(max_length=64)
    direction = models.CharField(max_length=8, choices=PaymentDirection.choices)
    currency = models.CharField(max_length=3)
    day = models.DateField(help_text="The entries' Eastern calendar date of creation.")
    amount = models.DecimalField(max_digits=18, decimal_places=2)
    entries = models.BigIntegerField()

    class Meta:
        abstract = True

    def __str__(self) -> str:
        return f"{self.merchant_id} {self.direction} {self.currency} {self.day} {self.amount}"


class MerchantDayTotal(MerchantDayFigures):
    """What a merchant's entries of one direction and currency created on one Eastern calendar
    day add up to, as the exposure limits and the fraud rules count them (every state but
    failed and canceled, no account validation's micro-entries), kept with the database's help
    so that they read a few dozen rows instead of summing the merchant's every payment of up
    to 60 banking days on each create. A trigger on the payments' table (PostgreSQL, migration
    0045) appends a ``MerchantDayAdjustment`` for each entry that starts or stops counting (or
    changes its day, amount or merchant); a read under the merchant's exposure lock for the
    direction and currency folds them into these rows (``payments.services.limits.DAY_FOLD``).
    So the creates and the workers only ever append, and never wait on, or deadlock over, a
    total's row: only the lock's holder writes it. What counts is always the totals plus the
    changes not yet folded. Never written by the application otherwise."""

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["merchant_id", "direction", "currency", "day"],
                name="merchant_day_total_unique",
            ),
        ]


class MerchantDayAdjustment(MerchantDayFigures):
    """A change to a ``MerchantDayTotal`` not yet folded into it (an entry that started
    counting, or a negative one for an entry that stopped): appended by the trigger, deleted
    when a read under the exposure lock folds it in, never updated."""

    class Meta:
        indexes = [
            models.Index(
                fields=["merchant_id", "direction", "currency", "day"],
                name="merchant_day_adjustment",
            ),
        ]
