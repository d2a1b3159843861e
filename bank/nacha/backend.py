"""The bank as a processor backend (``bank.nacha.backend.NachaBankBackend``).

A submission gives the payment its entry and trace number (``nacha_entry_add``: the trace
number is the bank path's idempotency key, as the idempotency key is the HTTP processor's).
The entry then waits for its window, and the answer is ``DebitQueued``: the payment stays
``pending`` and the submit message is done. No retry waits for the file (which over a long
weekend is days away, more than any retry budget), and nothing of the payment's queue waits
behind it. Delivering a file (``nacha_file_deliver``) puts a ``submit_payment`` message on the
outbox for each of its entries in the transaction that records the delivery, and that
submission is answered "accepted": the payment moves to ``submitted`` once its file is at the
bank, not before, and exactly once.

A credit (a refund or payout) goes the same way: ``credit_create`` queues the payment's entry,
which the file cut writes as a credit (``bank.nacha.services``), and ``credit_get`` finds it
as ``debit_get`` finds a debit.

The bank sends no callbacks: its return and NOC files are collected (``manage.py
nacha_collect``), so a callback to this backend is refused as unsigned.
"""

from __future__ import annotations

import uuid
from decimal import Decimal
from typing import Any

from django.utils import timezone

from bank.nacha import settings as nacha_settings
from bank.nacha.models import NachaEntry
from bank.nacha.services import nacha_entry_add, nacha_entry_withdraw, nacha_prenote_add
from bank.nacha.windows import window_next
from bank.vault.selectors import (
    UNKNOWN_TOKEN_MESSAGE,
    vault_accounts_last4,
    vault_token_account,
    vault_token_held_for,
    vault_token_is_vaults,
)
from payments.models import Payment, PaymentDirection
from payments.processor.backend import (
    CallbackRequest,
    CallTimer,
    CreditAccepted,
    CreditQueued,
    CreditStatus,
    DebitAccepted,
    DebitQueued,
    DebitStatus,
    ProcessorBackend,
    ProcessorCallRejected,
    TokenChecked,
)
from payments.signing import SignatureError

# After the window's cutoff, the cut and the delivery take a few minutes.
DELIVERY_SLACK_SECONDS = 15 * 60
URL = "nacha:"


class NachaBankBackend(ProcessorBackend):
    # A prenote is a zero-dollar entry of the next file (``bank.nacha.services``).
    supports_prenotes = True

    def prenote_queue(self, *, validation_id: int, account_token: str, merchant_id: str) -> str:
        """Queue the account's prenote for the next file (in the caller's transaction); its
        trace number."""
        return nacha_prenote_add(
            validation_id=validation_id, account_token=account_token, merchant_id=merchant_id
        )

    def micro_entries_queue(self, *, payment_ids: list[uuid.UUID]) -> None:
        """Queue a validation's micro-entries (its credits and their offsetting debit) for the
        next file, in the caller's transaction (the validation's start): a cut sees all of them
        or none, so they go in one file and settle together. Their submissions find the
        entries queued, as any payment's second submission does."""
        for payment_id in payment_ids:
            nacha_entry_add(payment_id=payment_id)

    def source_token_refused(self, *, token: str, merchant_id: str) -> str | None:
        # The vault's token is the module's own: one of another merchant (or none) is refused
        # at create time, not left for the file cut to fail.
        if vault_token_is_vaults(token) and not vault_token_held_for(
            token=token, merchant_id=merchant_id
        ):
            return UNKNOWN_TOKEN_MESSAGE
        return None

    def accounts_last4(self, *, tokens: list[str], merchant_id: str) -> dict[str, str]:
        return vault_accounts_last4(tokens=tokens, merchant_id=merchant_id)

    def source_token_check(self, *, token: str, merchant_id: str) -> TokenChecked:
        # One read of the vault's row: whether it is the merchant's, the class its debits were
        # authorized under (the payment's default SEC code), and when it was vaulted.
        if not vault_token_is_vaults(token):
            return TokenChecked(None)
        account = vault_token_account(token=token, merchant_id=merchant_id)
        if account is None:
            return TokenChecked(UNKNOWN_TOKEN_MESSAGE)
        # When it was vaulted: a fraud rule holds a payout to an account added lately.
        sec_code, vaulted_at = account
        return TokenChecked(None, sec_code, changed_at=vaulted_at)

    def debit_create(
        self,
        *,
        idempotency_key: uuid.UUID | str,
        payment_id: uuid.UUID | str,
        amount: Decimal,
        currency: str,
        source_token: str,
        sec_code: str = "",
        company_entry_description: str = "",
    ) -> DebitAccepted | DebitQueued:
        # The payment row names the class and description the cut writes.
        return self._entry_queue(payment_id, currency)

    def credit_create(
        self,
        *,
        idempotency_key: uuid.UUID | str,
        payment_id: uuid.UUID | str,
        amount: Decimal,
        currency: str,
        destination_token: str,
        sec_code: str = "",
        company_entry_description: str = "",
    ) -> CreditAccepted | CreditQueued:
        # The payment row names the account (its source_token) and the direction the cut writes.
        return self._entry_queue(payment_id, currency)

    def _entry_queue(
        self, payment_id: uuid.UUID | str, currency: str
    ) -> DebitAccepted | DebitQueued:
        """The payment's entry, queued for the next window; accepted once its file is sent."""
        timer = CallTimer("SUBMIT", f"{URL}entries/{payment_id}")
        if currency != "USD":
            raise ProcessorCallRejected(
                "ACH moves US dollars only",
                call=timer.record(http_status=422, error="ACH moves US dollars only"),
            )
        entry = nacha_entry_add(payment_id=payment_id)
        entry = NachaEntry.objects.select_related("file").get(pk=entry.pk)
        if entry.refused_reason:
            message = f"the bank path refused the entry: {entry.refused_reason}"
            raise ProcessorCallRejected(message, call=timer.record(http_status=422, error=message))
        if entry.file is not None and entry.file.delivered_at is not None:
            return DebitAccepted(
                processor_id=entry.trace_number,
                status="submitted",
                created=False,
                call=timer.record(http_status=200, response_body=entry.file.name),
            )
        window = window_next(
            timezone.now(), windows=nacha_settings.windows(), buffer=nacha_settings.bank_buffer()
        )
        reason = (
            f"entry {entry.trace_number} waits for the {window.name} window "
            f"(cutoff {window.bank_cutoff.isoformat()})"
        )
        return DebitQueued(reason=reason, call=timer.record(http_status=202, response_body=reason))

    def debit_withdraw(self, *, payment_id: uuid.UUID | str) -> None:
        nacha_entry_withdraw(payment_id=payment_id)

    def debit_get(self, *, idempotency_key: uuid.UUID | str) -> DebitStatus:
        return self._entry_status(idempotency_key, PaymentDirection.DEBIT)

    def credit_get(self, *, idempotency_key: uuid.UUID | str) -> CreditStatus:
        return self._entry_status(idempotency_key, PaymentDirection.CREDIT)

    def _entry_status(self, idempotency_key: uuid.UUID | str, direction: str) -> DebitStatus:
        """``submitted`` once the entry's file is delivered; not found before, or for a key
        of the other direction."""
        timer = CallTimer("GET", f"{URL}entries/{idempotency_key}")
        payments = Payment.objects.filter(idempotency_key=idempotency_key, direction=direction)
        entry = NachaEntry.objects.select_related("file").filter(payment__in=payments).first()
        delivered = entry is not None and entry.file is not None and entry.file.delivered_at
        return DebitStatus(
            found=bool(delivered),
            processor_id=entry.trace_number if entry else "",
            status="submitted" if delivered else "",
            call=timer.record(http_status=200 if delivered else 404),
        )

    def callback_verify(self, request: CallbackRequest) -> None:
        raise SignatureError(
            "the bank backend takes no callbacks: its files are collected with nacha_collect"
        )

    def callback_parse(self, data: Any, request: CallbackRequest):
        raise SignatureError("the bank backend takes no callbacks")

    def callback_challenge(self) -> str:
        return "None"
