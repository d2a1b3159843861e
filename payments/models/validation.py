"""Account validation before a first WEB debit."""

from django.db import models
from django.db.models.functions import Now
from django_fsm import FSMField, FSMModelMixin, transition


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
    # micro-entries' count), with the earlier rounds' under ``earlier``; never an amount or an
    # account number.
    evidence = models.JSONField(default=dict, blank=True)
    attempts = models.PositiveSmallIntegerField(default=0)
    secret_digest = models.CharField(max_length=64, blank=True, editable=False)
    expires_at = models.DateTimeField(null=True, blank=True)
    # A prenote's account takes live entries from this moment (the third banking day after its
    # settlement date); a return before then fails it.
    live_from = models.DateTimeField(null=True, blank=True)
    # A validation service that failed for a while (connection, timeout, 5xx) is asked again
    # from this moment, by the periodic round; ``attempts`` counts its tries.
    retry_at = models.DateTimeField(null=True, blank=True)
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
