"""The bank path's records: each payment's entry with its trace number, and each file cut.

``NachaEntry`` is the idempotency of the bank path, as the idempotency key is the processor
path's: one row per payment (unique), one trace number per row (unique), and a file set once,
under a row lock, so an entry is in exactly one file however often submission or the cut is
retried. A file keeps its bytes: a delivery retried later sends exactly what was cut.

The bytes of a file, ours or the bank's, hold raw account numbers: they are kept only sealed by
the vault (``bank.nacha.sealing``) and read through ``content_bytes()``.
"""

import uuid

from django.db import models

from bank.nacha import sealing


class SealedContent(models.Model):
    """A file's bytes as the vault seals them: key version, wrapped data key, nonce and
    ciphertext (``bank.vault.crypto.Sealed``). ``vault_keys_rotate`` re-wraps the data key
    of a row not under the active key."""

    key_version = models.CharField(max_length=32, db_index=True)
    wrapped_key = models.BinaryField()
    nonce = models.BinaryField()
    ciphertext = models.BinaryField()

    class Meta:
        abstract = True

    def content_aad(self) -> bytes:
        raise NotImplementedError

    def content_bytes(self) -> bytes:
        """The file's clear bytes (asks the key holder: call it outside any transaction)."""
        return sealing.content_open(self)


class NachaTraceCounter(models.Model):
    """The last trace sequence given out under one ODFI identification (locked to take one)."""

    odfi_identification = models.CharField(max_length=8, primary_key=True)
    last_sequence = models.PositiveBigIntegerField(default=0)

    class Meta:
        db_table = "payments_nachatracecounter"

    def __str__(self) -> str:
        return f"{self.odfi_identification}: {self.last_sequence}"


class NachaFile(SealedContent):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    window_name = models.CharField(max_length=64)
    bank_cutoff_at = models.DateTimeField()
    effective_entry_date = models.DateField()
    creation_date = models.DateField(help_text="Eastern time, as the file header carries it")
    file_id_modifier = models.CharField(max_length=1)
    name = models.CharField(max_length=128, unique=True)
    sha256 = models.CharField(max_length=64, help_text="Of the clear bytes, as cut")
    entry_count = models.PositiveIntegerField()
    total_debit_cents = models.PositiveBigIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    delivered_to = models.CharField(max_length=255, blank=True)
    # When the bank's drop first held other bytes under this name: the alert is raised then,
    # once, however often later rounds meet the same conflict.
    delivery_conflict_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "payments_nachafile"
        constraints = [
            # The header's creation date and modifier tell a day's files apart at the bank.
            models.UniqueConstraint(
                fields=["creation_date", "file_id_modifier"], name="nacha_file_modifier_per_day"
            )
        ]
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return self.name

    def content_aad(self) -> bytes:
        return sealing.outbound_aad(file_id=self.pk, sha256=self.sha256)


class NachaEntry(models.Model):
    payment = models.OneToOneField(
        "payments.Payment", on_delete=models.PROTECT, related_name="nacha_entry"
    )
    trace_number = models.CharField(max_length=15, unique=True)
    file = models.ForeignKey(
        NachaFile, null=True, blank=True, on_delete=models.PROTECT, related_name="entries"
    )
    sec_code = models.CharField(max_length=3, blank=True)
    # Its batch's number in the file (the bank settles per batch and names it); null for an
    # entry written before the cut recorded it: the books match those per file and SEC code.
    batch_number = models.PositiveIntegerField(null=True, blank=True)
    # Why the entry cannot be written (the vault has no such token, a closed account...): it
    # is left out of every file, and its payment fails. Never an account number.
    refused_reason = models.CharField(max_length=255, blank=True)
    # When its ``settled`` event was promised (the outbox row written): ACH confirms nothing, so
    # an entry is taken as settled once its effective entry date has passed (returns may still
    # follow, as returns after settlement).
    settled_event_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "payments_nachaentry"
        indexes = [
            models.Index(
                fields=["created_at"],
                condition=models.Q(file__isnull=True, refused_reason=""),
                name="nacha_entry_not_in_a_file",
            )
        ]

    def __str__(self) -> str:
        return self.trace_number


class NachaPrenote(models.Model):
    """An account's prenote (``payments.validation_methods.Prenote`` on the bank backend): a
    zero-dollar entry with a trace number of the ODFI's sequence, in exactly one file, as a
    payment's ``NachaEntry`` is. Queued in the transaction that starts the validation; the cut
    writes it in the merchant's batch; the delivery of its file sets the validation's
    ``live_from``; a return or NOC of its trace number comes back to the validation
    (``bank.nacha.prenotes``). A validation started again sends a new one: its evidence names
    the current trace number, and an older prenote's answer changes nothing."""

    validation = models.ForeignKey(
        "payments.AccountValidation", on_delete=models.PROTECT, related_name="nacha_prenotes"
    )
    account_token = models.CharField(max_length=128, db_index=True)
    merchant_id = models.CharField(max_length=64)
    trace_number = models.CharField(max_length=15, unique=True)
    file = models.ForeignKey(
        NachaFile, null=True, blank=True, on_delete=models.PROTECT, related_name="prenotes"
    )
    sec_code = models.CharField(max_length=3, blank=True)
    # Why it was not written (the vault has no such account, the validation ended first).
    refused_reason = models.CharField(max_length=255, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [
            models.Index(
                fields=["created_at"],
                condition=models.Q(file__isnull=True, refused_reason=""),
                name="nacha_prenote_not_in_a_file",
            )
        ]

    def __str__(self) -> str:
        return f"prenote {self.trace_number}"


class InboundStatus(models.TextChoices):
    IMPORTED = "imported", "Imported: every entry became an event"
    REFUSED = "refused", "Refused whole: malformed, nothing imported"


class ReceivedFile(SealedContent):
    """A whole file taken from one of the bank's drops, stored sealed, imported or refused
    (with the record and the reason): the bank's return and NOC files here, its statements in
    ``bank.books``. Each names its ``status`` choices."""

    name = models.CharField(max_length=255)
    sha256 = models.CharField(max_length=64, unique=True, help_text="Of the clear bytes")
    refused_record = models.PositiveIntegerField(null=True, blank=True)
    refused_reason = models.TextField(blank=True)
    received_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        abstract = True
        ordering = ["-received_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.status})"


class NachaInboundFile(ReceivedFile):
    """A file the bank sent us, kept whole (sealed), imported or refused. The bytes hold
    account numbers: never shown; ``nacha_inspect`` masks them."""

    status = models.CharField(max_length=16, choices=InboundStatus.choices)
    entry_count = models.PositiveIntegerField(default=0)

    class Meta(ReceivedFile.Meta):
        db_table = "payments_nachainboundfile"
        pass

    def content_aad(self) -> bytes:
        return sealing.inbound_aad(sha256=self.sha256)


class NachaInboundEvent(models.Model):
    """One return or NOC of a bank file, as the processor event it becomes.

    ``deduplication_id`` (the original trace number and a fingerprint of the code) is unique:
    the same return read again, in the same file or a resent one, is one row and one message.
    ``payment`` is empty when the trace number matches no entry of ours: the event then goes to
    the dead-letter queue for a human instead of the main queue. An answer to a prenote names
    it (``prenote``) and is applied to its account's validation as it is imported.
    """

    file = models.ForeignKey(NachaInboundFile, on_delete=models.PROTECT, related_name="events")
    record_number = models.PositiveIntegerField()
    original_trace_number = models.CharField(max_length=15, db_index=True)
    code = models.CharField(max_length=3)
    event_type = models.CharField(max_length=32)
    payment = models.ForeignKey("payments.Payment", null=True, blank=True, on_delete=models.PROTECT)
    # The answer to a prenote of ours: applied to its validation in the import's transaction,
    # never published (``published_at`` is set when it is written).
    prenote = models.ForeignKey(
        NachaPrenote, null=True, blank=True, on_delete=models.PROTECT, related_name="answers"
    )
    deduplication_id = models.CharField(max_length=128, unique=True)
    event = models.JSONField(help_text="The processor event; never an account number")
    published_at = models.DateTimeField(null=True, blank=True)
    message_id = models.CharField(max_length=128, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "payments_nachainboundevent"
        indexes = [
            models.Index(
                fields=["id"],
                condition=models.Q(published_at__isnull=True),
                name="nacha_inbound_unpublished",
            )
        ]

    def __str__(self) -> str:
        return f"{self.code} for {self.original_trace_number}"
