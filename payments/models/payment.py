"""The payment: its states, direction, purpose and the fields every movement of money carries."""

import uuid
from decimal import Decimal

from django.core.validators import MinValueValidator
from django.db import models
from django_fsm import FSMField, FSMModelMixin, transition

from payments.catalogue import FAILED, RETURNED, SETTLED, SUBMITTED
from payments.state_graph import StateGraph


class PaymentState(models.TextChoices):
    PENDING = "pending", "Pending"
    SUBMITTED = "submitted", "Submitted"
    CONFIRMED = "confirmed", "Confirmed"
    FAILED = "failed", "Failed"
    RETURNED = "returned", "Returned after settlement"
    CANCELED = "canceled", "Canceled before origination"


class PaymentDirection(models.TextChoices):
    """Which way the money moves, seen from the merchant's customer's account."""

    DEBIT = "debit", "Debit (collects)"
    CREDIT = "credit", "Credit (sends)"


class ReviewStatus(models.TextChoices):
    """A payment held for a person's review (``payments.services.review``): never submitted
    while ``held``; approved, it is sent once; rejected, it is canceled."""

    NONE = "", "Not held"
    HELD = "held", "Held for review"
    APPROVED = "approved", "Approved"
    REJECTED = "rejected", "Rejected (canceled)"
    # A WEB debit from an account not validated yet, with PAYMENTS["UNVALIDATED_WEB_DEBITS"] =
    # "hold" (payments.services.validation): released by the validation, never by a person.
    VALIDATION = "validation", "Held until its account is validated"


class PaymentPurpose(models.TextChoices):
    COLLECTION = "collection", "Collection"
    REFUND = "refund", "Refund of a collected debit"
    PAYOUT = "payout", "Payout to the merchant's own account"
    # An account validation's micro-entries (payments.validation_methods.MicroEntries): two
    # credits under a dollar and a debit of their sum, money like any other, never shown to the
    # merchant (the amounts are the validation's secret).
    MICRO_ENTRY = "micro_entry", "Micro-entry of an account validation"


# The money movements the API, the events and the webhooks show a merchant: every purpose but
# an account validation's micro-entries, whose amounts the account's holder must read from its
# statement, not from us.
SHOWN_PURPOSES = tuple(
    purpose for purpose in PaymentPurpose.values if purpose != PaymentPurpose.MICRO_ENTRY
)


# Confirmed counts as final: most settled debits never come back, and nothing waits for them.


FINAL_STATES = (
    PaymentState.CONFIRMED,
    PaymentState.FAILED,
    PaymentState.RETURNED,
    PaymentState.CANCELED,
)


class Payment(FSMModelMixin, models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    merchant_id = models.CharField(max_length=64, db_index=True)
    amount = models.DecimalField(
        max_digits=14, decimal_places=2, validators=[MinValueValidator(Decimal("0.01"))]
    )
    currency = models.CharField(max_length=3, default="USD")
    source_token = models.CharField(
        max_length=128, help_text="The processor's token for the bank account; never a raw number."
    )
    description = models.CharField(max_length=255, blank=True)
    # Money out (payments.services.refunds, payouts) is a payment too, a credit: the same
    # states, idempotency key, queue, worker and event log as a debit. ``source_token`` is then
    # the account the credit goes to (a refund's: the one its debit came from).
    direction = models.CharField(
        max_length=8,
        choices=PaymentDirection.choices,
        default=PaymentDirection.DEBIT,
        db_default=PaymentDirection.DEBIT,
        editable=False,
    )
    purpose = models.CharField(
        max_length=12,
        choices=PaymentPurpose.choices,
        default=PaymentPurpose.COLLECTION,
        db_default=PaymentPurpose.COLLECTION,
        editable=False,
    )
    # A refund's debit.
    refund_of = models.ForeignKey(
        "self", on_delete=models.PROTECT, null=True, blank=True, related_name="refunds"
    )
    # A refund held until its debit is past its return window (REFUND_HOLD_BANKING_DAYS): its
    # submit command is enqueued only then (``payments.services.refunds.refunds_release``).
    hold_until = models.DateTimeField(null=True, blank=True, editable=False)
    # Held for a person's review (PAYMENTS["OVER_LIMIT"] = "hold": created past an exposure
    # limit): no submit command until it is approved; ``review_reason`` says why it was held.
    review_status = models.CharField(
        max_length=10,
        choices=ReviewStatus.choices,
        blank=True,
        default=ReviewStatus.NONE,
        db_default=ReviewStatus.NONE,
        editable=False,
    )
    review_reason = models.CharField(
        max_length=255, blank=True, default="", db_default="", editable=False
    )
    # The rule that held it (``exposure_limit`` or a fraud rule's name, ``payments.fraud_rules``),
    # and what the reviewer reads: every rule that flagged it with the figures that tripped it,
    # and the merchant's baseline as the create read it (``payments.services.fraud``).
    review_rule = models.CharField(
        max_length=64, blank=True, default="", db_default="", editable=False, db_index=True
    )
    review_evidence = models.JSONField(default=dict, db_default={}, blank=True, editable=False)
    idempotency_key = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    state = FSMField(
        default=PaymentState.PENDING, choices=PaymentState.choices, protected=True, db_index=True
    )
    processor_id = models.CharField(max_length=128, blank=True)
    # Set under the row lock before a submission's call to the processor: from then on the debit
    # may have reached it, so the payment can no longer be canceled (one winner, the call or
    # the cancel). Cleared only when no call was made after all (the breaker refused it), or
    # when the backend answers that it holds the debit unsent and can withdraw it (the bank
    # backend's entry waiting for its file, which guards itself: payments.services.cancel).
    submission_started_at = models.DateTimeField(null=True, blank=True, editable=False)
    # The client's own keys and strings, as Stripe's metadata (bounded by the API's input). The
    # database's own default too: code or a bulk load that predates the column still inserts.
    metadata = models.JSONField(default=dict, db_default={}, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    updated_at = models.DateTimeField(auto_now=True)
    state_changed_at = models.DateTimeField(auto_now_add=True)
    # A reinitiation (payments.services.reinitiation): the original entry of its chain, and
    # which reinitiation of it this is (1 or 2, NACHA's limit); empty for an original entry.
    reinitiation_of = models.ForeignKey(
        "self", on_delete=models.PROTECT, null=True, blank=True, related_name="reinitiations"
    )
    reinitiation_number = models.PositiveSmallIntegerField(null=True, blank=True)
    authorization_reference = models.CharField(
        max_length=64,
        blank=True,
        # A database default too: rows written by hand (a host's loader, COPY) need not know
        # the column, which most payments leave empty.
        default="",
        db_default="",
        help_text="The client's reference of the new authorization a reinitiation after an "
        "unauthorized return was made under.",
    )

    # A micro-entry's validation (``purpose=micro_entry`` only): its return fails it.
    account_validation = models.ForeignKey(
        "payments.AccountValidation",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="micro_entries",
        editable=False,
        db_index=False,  # the partial index below: most payments have none
    )

    # The entry's standard entry class (payments.originator): "" only on a row written before
    # the column; the file cut then takes the vault account's class, as it did.
    sec_code = models.CharField(max_length=3, blank=True, default="", db_default="")
    # Its company entry description as the receiver's statement shows it: a mandated word
    # (RETRY PYMT, REFUND, PAYOUT, PAYROLL, PURCHASE), the merchant's own, or "" for the
    # originator's default (the bank path's NACHA_ORIGINATOR, a processor's own).
    entry_description = models.CharField(max_length=10, blank=True, default="", db_default="")

    class Meta:
        ordering = ["-created_at"]
        permissions = [("review_payment", "Can approve or reject a payment held for review")]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(amount__gt=0), name="payment_amount_positive"
            ),
            # At most two reinitiations per original entry, each number once: a lost race to
            # reinitiate cannot write a third.
            models.UniqueConstraint(
                fields=["reinitiation_of", "reinitiation_number"],
                name="payment_reinitiation_number_unique",
            ),
            models.CheckConstraint(
                condition=(
                    models.Q(reinitiation_of__isnull=True, reinitiation_number__isnull=True)
                    | models.Q(
                        reinitiation_of__isnull=False,
                        reinitiation_number__gte=1,
                        reinitiation_number__lte=2,
                    )
                ),
                name="payment_reinitiation_number_range",
            ),
            # A collection is a debit, money out a credit; a refund names its debit, nothing
            # else does; a micro-entry goes either way.
            models.CheckConstraint(
                condition=(
                    models.Q(purpose="collection", direction="debit", refund_of__isnull=True)
                    | models.Q(purpose="refund", direction="credit", refund_of__isnull=False)
                    | models.Q(purpose="payout", direction="credit", refund_of__isnull=True)
                    | models.Q(purpose="micro_entry", refund_of__isnull=True)
                ),
                name="payment_purpose_direction",
            ),
            # A micro-entry names its validation, nothing else does.
            models.CheckConstraint(
                condition=(
                    models.Q(purpose="micro_entry", account_validation__isnull=False)
                    | (~models.Q(purpose="micro_entry") & models.Q(account_validation__isnull=True))
                ),
                name="payment_micro_entry_validation",
            ),
        ]
        indexes = [
            models.Index(fields=["state", "state_changed_at"]),
            # The API's list: a merchant's payments, newest first, one page after a cursor.
            models.Index(
                fields=["merchant_id", "-created_at", "-id"], name="payment_merchant_created"
            ),
            # The fraud rules' history: when the merchant first used an account, and its debits
            # from it (payments.services.fraud), without reading the merchant's every payment.
            models.Index(
                fields=["merchant_id", "source_token", "created_at"],
                name="payment_merchant_account",
            ),
            # The debits an account's validation releases or fails (payments.services.validation).
            models.Index(
                fields=["source_token"],
                condition=models.Q(review_status="validation"),
                name="payment_held_for_validation",
            ),
            # A validation's micro-entries (the admin's page of it).
            models.Index(
                fields=["account_validation"],
                condition=models.Q(account_validation__isnull=False),
                name="payment_micro_entries",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.id} {self.amount} {self.currency} ({self.state})"

    # The transitions only change the state in memory; payments.services saves them. They are
    # the one statement of the state graph (``payments.state_graph`` derives every table from
    # them): ``events`` names the processor event types that may take a transition.
    @transition(
        field=state,
        source=PaymentState.PENDING,
        target=PaymentState.SUBMITTED,
        custom={"events": (SUBMITTED.name,)},
    )
    def submit(self) -> None:
        pass

    @transition(field=state, source=PaymentState.PENDING, target=PaymentState.FAILED)
    def reject(self) -> None:
        """The processor refused the submission (4xx): it never reached the ACH network. Only
        that answer takes this transition; no processor event does."""

    @transition(
        field=state,
        source=PaymentState.SUBMITTED,
        target=PaymentState.CONFIRMED,
        custom={"events": (SETTLED.name,)},
    )
    def confirm(self) -> None:
        pass

    @transition(
        field=state,
        source=PaymentState.SUBMITTED,
        target=PaymentState.FAILED,
        custom={"events": (FAILED.name, RETURNED.name)},
    )
    def fail(self) -> None:
        """A ``failed`` event, or a return that arrives before settlement."""

    @transition(
        field=state,
        source=PaymentState.CONFIRMED,
        target=PaymentState.RETURNED,
        custom={"events": (RETURNED.name,)},
    )
    def return_after_settlement(self) -> None:
        """A settled debit came back (a NACHA return): final, the credit is reversed."""

    @transition(
        field=state,
        source=PaymentState.FAILED,
        target=PaymentState.RETURNED,
        custom={"events": (SETTLED.name,)},
    )
    def settle_before_return(self) -> None:
        """A debit that failed by a return learns late that it had settled before that return
        (the settlement's callback was lost and pulled back after the return's, or the two
        overtook each other): the processor's history is settled, then returned, and so is the
        payment's, with its credit and the credit's reversal (``payments.services.returns``).
        Only a settlement older than the return the payment failed by takes it."""

    @transition(field=state, source=PaymentState.PENDING, target=PaymentState.CANCELED)
    def cancel(self) -> None:
        """The merchant canceled the debit before it reached the processor or a bank file
        (``payments.services.cancel``): final, no money moved. No processor event takes it."""


PAYMENT_GRAPH = StateGraph.of(Payment, "state")
# How far along a state is; an event whose target ranks below the current state is stale.


STATE_RANK = PAYMENT_GRAPH.rank
