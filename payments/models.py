"""Payments, their append-only history, the merchant ledger and the idempotency records.

State changes go through ``payments.services`` only: the FSM field is protected, transitions
change the state in memory, and the service saves them under a row lock.
"""

import uuid
from decimal import Decimal

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models.functions import Now
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
            # else does.
            models.CheckConstraint(
                condition=(
                    models.Q(purpose="collection", direction="debit", refund_of__isnull=True)
                    | models.Q(purpose="refund", direction="credit", refund_of__isnull=False)
                    | models.Q(purpose="payout", direction="credit", refund_of__isnull=True)
                ),
                name="payment_purpose_direction",
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


class EventKind(models.TextChoices):
    CREATED = "created", "Created"
    SUBMISSION = "submission", "Submission outcome"
    PROCESSOR_EVENT = "processor_event", "Processor event"
    CANCELLATION = "cancellation", "Canceled before origination"
    REVIEW = "review", "Held for review, approved or rejected"


class EventOutcome(models.TextChoices):
    APPLIED = "applied", "Applied (state changed)"
    RECORDED = "recorded", "Recorded (no state change expected)"
    STALE = "stale", "Stale (acknowledged, nothing changed)"
    DUPLICATE = "duplicate", "Duplicate (already processed)"


class PaymentEvent(models.Model):
    """Append-only log: every transition and every processor event, whatever its outcome."""

    payment = models.ForeignKey(Payment, on_delete=models.PROTECT, related_name="events")
    kind = models.CharField(max_length=32, choices=EventKind.choices)
    outcome = models.CharField(max_length=16, choices=EventOutcome.choices)
    event_type = models.CharField(max_length=32, blank=True)
    processor_event_id = models.CharField(max_length=128, blank=True, db_index=True)
    from_state = models.CharField(max_length=16, blank=True)
    to_state = models.CharField(max_length=16, blank=True)
    payload = models.JSONField(default=dict, blank=True)
    caused_by = models.CharField(
        max_length=255, blank=True, help_text="What caused it: api:<user>, sqs:<message id>, ..."
    )
    created_at = models.DateTimeField(db_default=Now(), editable=False, db_index=True)

    class Meta:
        # Insertion order (a database sequence): created_at is the database's clock (its
        # statement time), never a worker's, but one statement's rows share it.
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.kind} {self.event_type} {self.outcome}"


class AttemptOutcome(models.TextChoices):
    ACCEPTED = "accepted", "Accepted (2xx)"
    REJECTED = "rejected", "Rejected (4xx, permanent)"
    RETRYABLE = "retryable", "Retryable (5xx, 408, 429, timeout, connection)"
    QUEUED = "queued", "Queued (the backend submits it itself, e.g. with its bank file)"


class ProcessorAttempt(models.Model):
    """One outbound call to the processor, whatever its outcome."""

    payment = models.ForeignKey(Payment, on_delete=models.PROTECT, related_name="attempts")
    attempt_number = models.PositiveIntegerField()
    operation = models.CharField(max_length=32, default="submit")
    idempotency_key = models.UUIDField()
    outcome = models.CharField(max_length=16, choices=AttemptOutcome.choices)
    http_status = models.PositiveSmallIntegerField(null=True, blank=True)
    error_kind = models.CharField(
        max_length=32, blank=True, help_text="timeout, connection, http, ... (empty when accepted)"
    )
    error = models.TextField(blank=True)
    response_body = models.TextField(blank=True)
    latency_ms = models.FloatField()
    retry_after_seconds = models.FloatField(null=True, blank=True)
    # On the database's clock too: the record's time less the call's own (monotonic) latency
    # (``payments.services.calls.attempt_record``), never the calling host's wall clock.
    started_at = models.DateTimeField(db_index=True)
    # When the attempt was recorded, on the database's clock: the breaker's failure-rate window
    # is measured on this one.
    recorded_at = models.DateTimeField(db_default=Now())

    class Meta:
        # Insertion order: two attempts' times may tie, their ids do not.
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(
                fields=["payment", "operation", "attempt_number"], name="attempt_number_unique"
            )
        ]

    def __str__(self) -> str:
        return f"attempt {self.attempt_number} {self.outcome} {self.http_status or self.error_kind}"


class LedgerEntryKind(models.TextChoices):
    CREDIT = "credit", "Credit"
    REVERSAL = "reversal", "Reversal (debit)"
    # A dishonored return: the return's reversal undone, and that undone again when the
    # receiving bank contests the dishonor (payments.services.dishonors).
    RECREDIT = "recredit", "Re-credit (the return was dishonored)"
    RECREDIT_REVERSAL = "recredit_reversal", "Re-credit reversed (the dishonor was contested)"
    # Money out (``payments.services.refunds``), on the credit's own payment row: held when
    # the refund or payout is made, posted when it settles, archived when it fails or is
    # canceled; its return puts the money back.
    REFUND = "refund", "Refund (money out)"
    REFUND_RETURN = "refund_return", "Refund returned (money back)"
    PAYOUT = "payout", "Payout (money out)"
    PAYOUT_RETURN = "payout_return", "Payout returned (money back)"
    # A debit returned after a refund of it was sent: the customer has the money twice, and
    # the merchant is owed the refund back, recovered outside ACH (``DoubleLoss``). Pending
    # until a person records it recovered (posted) or written off (archived).
    RECOVERY_OWED = "recovery_owed", "Recovery owed (refund sent, then the debit returned)"


# The sign each kind's amount carries, so the sum of a merchant's entries is its net balance.
LEDGER_KIND_SIGNS = {
    LedgerEntryKind.CREDIT: 1,
    LedgerEntryKind.REVERSAL: -1,
    LedgerEntryKind.RECREDIT: 1,
    LedgerEntryKind.RECREDIT_REVERSAL: -1,
    LedgerEntryKind.REFUND: -1,
    LedgerEntryKind.REFUND_RETURN: 1,
    LedgerEntryKind.PAYOUT: -1,
    LedgerEntryKind.PAYOUT_RETURN: 1,
    LedgerEntryKind.RECOVERY_OWED: 1,
}


class LedgerEntryStatus(models.TextChoices):
    """Modern Treasury's model: an entry is pending until the money has moved, then posted;
    a pending entry whose money never moves is archived (kept, counted nowhere)."""

    PENDING = "pending", "Pending"
    POSTED = "posted", "Posted"
    ARCHIVED = "archived", "Archived (the money never moved)"


class LedgerEntry(models.Model):
    """A merchant credit, written once per confirmed payment, and its reversal (a debit of the
    same amount, stored negative), written once if the payment is returned after settlement: the
    unique constraint on (payment, kind) is the guard for both. A dishonored return adds one
    re-credit, a contested dishonor one reversal of it, under the same guard."""

    payment = models.ForeignKey(Payment, on_delete=models.PROTECT, related_name="ledger_entries")
    merchant_id = models.CharField(max_length=64, db_index=True)
    kind = models.CharField(max_length=24, choices=LedgerEntryKind.choices)
    amount = models.DecimalField(max_digits=14, decimal_places=2)
    # Every entry of a debit is posted when written (the money has moved); money out is held
    # pending first.
    status = models.CharField(
        max_length=12,
        choices=LedgerEntryStatus.choices,
        default=LedgerEntryStatus.POSTED,
        db_default=LedgerEntryStatus.POSTED,
    )
    posted_at = models.DateTimeField(null=True, blank=True)
    currency = models.CharField(max_length=3)
    created_at = models.DateTimeField(db_default=Now(), editable=False)

    class Meta:
        ordering = ["created_at", "id"]
        verbose_name_plural = "ledger entries"
        constraints = [
            models.UniqueConstraint(fields=["payment", "kind"], name="ledger_one_entry_per_kind"),
            # The sign follows the kind, so the sum of a merchant's entries is its net balance.
            models.CheckConstraint(
                condition=(models.Q(kind="credit", amount__gt=0) | ~models.Q(kind="credit")),
                name="ledger_credit_positive",
            ),
            models.CheckConstraint(
                condition=(models.Q(kind="reversal", amount__lt=0) | ~models.Q(kind="reversal")),
                name="ledger_reversal_negative",
            ),
            models.CheckConstraint(
                condition=(models.Q(kind="recredit", amount__gt=0) | ~models.Q(kind="recredit")),
                name="ledger_recredit_positive",
            ),
            models.CheckConstraint(
                condition=(
                    models.Q(kind="recredit_reversal", amount__lt=0)
                    | ~models.Q(kind="recredit_reversal")
                ),
                name="ledger_recredit_reversal_negative",
            ),
            models.CheckConstraint(
                condition=(
                    models.Q(kind__in=["refund", "payout"], amount__lt=0)
                    | models.Q(
                        kind__in=["refund_return", "payout_return", "recovery_owed"],
                        amount__gt=0,
                    )
                    | ~models.Q(
                        kind__in=["refund", "payout", "refund_return", "payout_return"]
                        + ["recovery_owed"]
                    )
                ),
                name="ledger_money_out_signs",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.amount} {self.currency} to {self.merchant_id}"


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


class ProcessedEvent(models.Model):
    """The application-level dedup record of processor events, kept far past SQS's 5 minutes."""

    processor_event_id = models.CharField(max_length=128, primary_key=True)
    payment = models.ForeignKey(Payment, on_delete=models.PROTECT, related_name="processed_events")
    event_type = models.CharField(max_length=32)
    payload_hash = models.CharField(max_length=64)
    outcome = models.CharField(max_length=16, choices=EventOutcome.choices)
    processed_at = models.DateTimeField(db_default=Now(), editable=False, db_index=True)

    def __str__(self) -> str:
        return self.processor_event_id


class OutboxMessage(models.Model):
    """A message promised in the transaction of the row that caused it; a relay publishes it."""

    kind = models.CharField(max_length=32)
    group_id = models.CharField(max_length=128)
    body = models.JSONField()
    # The request id and trace of the request that caused it, sent as the message's attributes
    # (payments.kernel.propagation): the worker's records of the message name them.
    carried = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    published_at = models.DateTimeField(null=True, blank=True)
    publish_attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)

    class Meta:
        ordering = ["id"]
        indexes = [
            models.Index(
                fields=["id"],
                condition=models.Q(published_at__isnull=True),
                name="outbox_unpublished",
            )
        ]

    def __str__(self) -> str:
        return f"outbox {self.id} {self.kind} ({'published' if self.published_at else 'pending'})"

    @property
    def deduplication_id(self) -> str:
        return f"outbox-{self.id}"


class NocStatus(models.TextChoices):
    OPEN = "open", "Open (to apply at the processor)"
    APPLIED = "applied", "Applied (the token was updated)"
    REFUSED = "refused", "Refused NOC (nothing to apply)"


class NotificationOfChange(models.Model):
    """A notification of change (NOC) for a payment and its ``source_token``, one per processor
    event: which detail was wrong (the change code and its title), the corrected fields, and
    the NACHA deadline to apply it by (``payments.services.nocs``). Written in the transaction
    that claims the event; it moves no state and no money. An open NOC past its deadline
    blocks new debits on its token until an operator marks it applied."""

    payment = models.ForeignKey(Payment, on_delete=models.PROTECT, related_name="nocs")
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
        return f"NOC {self.change_code} {self.change_title} for {self.payment_id}"


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


class BreakerState(models.TextChoices):
    CLOSED = "closed", "Closed (calls flow)"
    OPEN = "open", "Open (no calls until the pause ends)"
    HALF_OPEN = "half_open", "Half-open (one probe call decides)"


class CircuitBreaker(models.Model):
    """The shared state of the circuit breaker around one dependency (the processor).

    One row per dependency, read by every worker process and changed only by conditional
    UPDATEs in ``payments.processor.breaker``, so two processes never both open it, both take
    the half-open probe, or both close it.
    """

    name = models.CharField(max_length=32, primary_key=True)
    state = models.CharField(
        max_length=16, choices=BreakerState.choices, default=BreakerState.CLOSED
    )
    consecutive_failures = models.PositiveIntegerField(default=0)
    opened_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text=(
            "Start of the current incident (the database's clock); it outlasts a close by "
            "PROCESSOR_BREAKER_INCIDENT_COOLDOWN_SECONDS, so a reopening soon after is the "
            "same incident. Empty when there is none."
        ),
    )
    open_until = models.DateTimeField(
        null=True, blank=True, help_text="When the half-open probe may be taken."
    )
    reopen_count = models.PositiveIntegerField(
        default=0, help_text="Reopenings in this incident: each one doubles the pause."
    )
    probe_until = models.DateTimeField(
        null=True,
        blank=True,
        help_text="The half-open trial's lease: after it, a new trial may be started.",
    )
    trial_admitted = models.PositiveIntegerField(
        default=0, help_text="Half-open: real submissions admitted as trials in this lease."
    )
    trial_succeeded = models.PositiveIntegerField(
        default=0, help_text="Half-open: trial submissions the processor accepted."
    )
    closed_at = models.DateTimeField(
        null=True, blank=True, help_text="When the breaker last closed (the database's clock)."
    )
    window_after_attempt = models.BigIntegerField(
        default=0,
        help_text="Only submissions after this attempt id count toward the failure rate (the "
        "last attempt before the last close).",
    )
    paused_until = models.DateTimeField(
        null=True, blank=True, help_text="Calls paused by a 429 Retry-After, for every worker."
    )
    degraded_since = models.DateTimeField(
        null=True,
        blank=True,
        help_text=(
            "Since when calls fail for many payments while others go through (the database's "
            "clock): a failure then spends no payment's retry budget. Empty when not degraded."
        ),
    )
    degraded_seen_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text=(
            "The last failure judged a degradation; once none for "
            "PROCESSOR_BREAKER_INCIDENT_COOLDOWN_SECONDS, the degradation is over."
        ),
    )
    last_error = models.TextField(blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.name} breaker ({self.state})"


class BreakerTransitionKind(models.TextChoices):
    OPENED = "opened", "Opened"
    PROBING = "probing", "Half-open: trial submissions admitted"
    REOPENED = "reopened", "Reopened in the same incident"
    CLOSED = "closed", "Closed"
    RESOLVED = "resolved", "Incident over: closed for the cool-down"
    PAUSED = "paused", "Paused by 429 Retry-After"
    DEGRADED = "degraded", "Degraded: calls fail for many payments while others go through"
    RECOVERED = "recovered", "No longer degraded"


class CircuitBreakerTransition(models.Model):
    """Append-only history of a breaker: when each incident started and ended, and why."""

    breaker = models.ForeignKey(
        CircuitBreaker, on_delete=models.PROTECT, related_name="transitions"
    )
    kind = models.CharField(max_length=16, choices=BreakerTransitionKind.choices)
    reason = models.TextField(blank=True)
    pause_seconds = models.FloatField(null=True, blank=True)
    # The database's clock, as every time of the breaker's: a process whose clock is wrong
    # cannot misdate an incident.
    created_at = models.DateTimeField(db_default=Now(), db_index=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.breaker_id} {self.kind} at {self.created_at:%Y-%m-%d %H:%M:%S}"


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


class ValidationState(models.TextChoices):
    UNVALIDATED = "unvalidated", "Not validated"
    PENDING = "pending", "Validation under way"
    VALIDATED = "validated", "Validated"
    FAILED = "failed", "Validation failed"


class ValidationMethod(models.TextChoices):
    PRENOTE = "prenote", "Prenote (zero-dollar entry)"
    MICRO_ENTRIES = "micro_entries", "Micro-entries"
    SERVICE = "service", "Validation service"


class AccountValidation(FSMModelMixin, models.Model):
    """Whether an account may take its first WEB debit (NACHA's account validation rule): one
    row per account, named by its token (the vault token on the bank backend; the processor's
    token, or the host's account reference, elsewhere). A change of the account's number (a
    NOC C01/C03/C06/C07) makes it a new account: the row goes back to ``unvalidated``.

    The states move only through ``payments.services.validation``, under the row's lock. The
    micro-entries' amounts are never stored: only their keyed digest (``secret_digest``)."""

    account_token = models.CharField(max_length=128, unique=True)
    merchant_id = models.CharField(max_length=64, db_index=True)
    state = FSMField(
        default=ValidationState.UNVALIDATED, choices=ValidationState.choices, protected=True
    )
    method = models.CharField(max_length=16, choices=ValidationMethod.choices, blank=True)
    # What the method found (the service's answer, the prenote's entry and any NOC, the
    # micro-entries' count); never an amount or an account number.
    evidence = models.JSONField(default=dict, blank=True)
    attempts = models.PositiveSmallIntegerField(default=0)
    secret_digest = models.CharField(max_length=64, blank=True, editable=False)
    expires_at = models.DateTimeField(null=True, blank=True)
    # A prenote's account takes live entries from this moment (the third banking day after its
    # settlement date); a return before then fails it.
    live_from = models.DateTimeField(null=True, blank=True)
    failure_reason = models.CharField(max_length=255, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    validated_at = models.DateTimeField(null=True, blank=True)
    failed_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.account_token}: {self.state}"

    @transition(
        field=state,
        source=[ValidationState.UNVALIDATED, ValidationState.FAILED],
        target=ValidationState.PENDING,
    )
    def start(self) -> None:
        """A method was started for the account (again, after a failure)."""

    @transition(field=state, source=ValidationState.PENDING, target=ValidationState.VALIDATED)
    def validate(self) -> None:
        """The method's evidence says the account is open and the receiver's."""

    @transition(field=state, source=ValidationState.PENDING, target=ValidationState.FAILED)
    def fail(self) -> None:
        """A return, wrong amounts past the limit, an expiry or the service's no."""

    @transition(field=state, source="*", target=ValidationState.UNVALIDATED)
    def reset(self) -> None:
        """The account's number changed: it is a new account."""


# Events and webhooks live in their own package; imported here so the app registers them.
from payments.webhooks.models import (  # noqa: E402, F401
    DeliveryStatus,
    Event,
    WebhookAction,
    WebhookActionKind,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
)


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
