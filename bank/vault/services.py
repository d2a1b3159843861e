"""Storing, reading and re-keying vaulted accounts.

``vault_account_store`` is the module's one entry point for raw bank numbers: it checks them
(the routing number's check digit, the account number's form) and answers a ``VaultAccount``
whose token payments carry. ``vault_account_reveal`` is the bank path's resolver. Neither logs
a number, and a refusal names the field, never its value.
"""

from __future__ import annotations

import json
import logging
import secrets

from django.db import transaction
from django.utils import timezone

from bank.nacha.accounts import AccountUnavailable, BankAccount
from bank.nacha.routing import routing_number_problem
from bank.nacha.writer import clean_text
from bank.vault.crypto import (
    Sealed,
    VaultError,
    VaultKeyError,
    VaultUnavailable,
    key_provider,
    rewrap,
    seal,
    unseal,
)
from bank.vault.models import AccountType, SecCode, VaultAccount
from bank.vault.selectors import TOKEN_PREFIX
from payments.kernel.bank_numbers import looks_like_bank_number

logger = logging.getLogger(__name__)


class VaultInputError(ValueError):
    """Field errors of a store: {field: [message]}, no value quoted."""

    def __init__(self, errors: dict[str, list[str]]) -> None:
        super().__init__("; ".join(f"{k}: {' '.join(v)}" for k, v in errors.items()))
        self.errors = errors


def _token_mint() -> str:
    # The token must pass the module's own bank-number rule (it is a source_token): draw
    # again in the rare case that the random text holds eight digits in a row.
    while True:
        token = TOKEN_PREFIX + secrets.token_urlsafe(24)
        if not looks_like_bank_number(token):
            return token


def _problems(
    *, merchant_id, routing_number, account_number, account_type, holder_name, sec_code
) -> dict[str, list[str]]:
    errors: dict[str, list[str]] = {}
    if not isinstance(merchant_id, str) or not 1 <= len(merchant_id) <= 64:
        errors["merchant_id"] = ["1 to 64 characters"]
    if problem := routing_number_problem(routing_number):
        errors["routing_number"] = [problem]
    if not (
        isinstance(account_number, str)
        and 4 <= len(account_number) <= 17
        and account_number.isascii()
        and account_number.isalnum()
    ):
        errors["account_number"] = ["an account number is 4 to 17 letters or digits"]
    if account_type not in AccountType.values:
        errors["account_type"] = [f"one of {', '.join(AccountType.values)}"]
    if sec_code not in SecCode.values:
        errors["sec_code"] = [f"one of {', '.join(SecCode.values)}"]
    if not isinstance(holder_name, str) or not clean_text(holder_name, 22):
        errors["holder_name"] = ["the account holder's name, as the bank shows it"]
    return errors


def vault_account_store(
    *,
    merchant_id: str,
    routing_number: str,
    account_number: str,
    account_type: str,
    holder_name: str,
    sec_code: str,
) -> VaultAccount:
    """Seal the account and mint its token; ``VaultInputError`` for a detail that is wrong."""
    errors = _problems(
        merchant_id=merchant_id,
        routing_number=routing_number,
        account_number=account_number,
        account_type=account_type,
        holder_name=holder_name,
        sec_code=sec_code,
    )
    if errors:
        raise VaultInputError(errors)
    token = _token_mint()
    payload = json.dumps(
        {"routing": routing_number, "account": account_number, "name": holder_name}
    ).encode()
    sealed = seal(payload, aad=token.encode())
    account = VaultAccount.objects.create(
        token=token,
        merchant_id=merchant_id,
        account_type=account_type,
        sec_code=sec_code,
        account_last4=account_number[-4:],
        **sealed.fields(),
    )
    logger.info("vault account stored", extra={"token": token, "key_version": sealed.key_version})
    return account


def vault_account_reveal(token: str) -> BankAccount:
    """The account behind ``token``, for writing a file (``bank.nacha``'s resolver).

    A record that does not open is ``AccountUnavailable`` (its entry is refused); a key holder
    that cannot be asked (``VaultUnavailable``: KMS down, a key disabled) is raised as it is, so
    the file cut stops and runs again later instead of refusing every entry of the window."""
    account = VaultAccount.objects.filter(token=token).first()
    if account is None:
        raise AccountUnavailable("the vault holds no account for this token")
    try:
        payload = json.loads(unseal(Sealed.of(account), aad=token.encode()))
    except VaultUnavailable as exc:
        logger.error("vault key holder unavailable", extra={"token": token, "reason": str(exc)})
        raise
    except VaultKeyError as exc:
        logger.error("vault account unreadable", extra={"token": token, "reason": str(exc)})
        raise AccountUnavailable(f"the vault cannot open this account: {exc}") from None
    return BankAccount(
        routing_number=payload["routing"],
        account_number=payload["account"],
        account_type=account.account_type,
        holder_name=payload["name"],
        sec_code=account.sec_code,
        merchant_id=account.merchant_id,
    )


def vault_keys_rotate(*, batch_size: int = 500, max_batches: int | None = None) -> int:
    """Re-key every vault record not under the active key, ``batch_size`` rows at a time: the
    accounts (re-encrypted), then the NACHA files, ours and the bank's, and the bank's
    statements (their data keys re-wrapped: the ciphertext stays as it is). Returns how many
    records were re-keyed, all kinds together; ``max_batches`` bounds the batches of the whole
    run. A row that does not open stops the rotation with ``VaultKeyError``, and a key holder
    that cannot be asked with ``VaultUnavailable``, naming the row; the batches before it stay
    committed.

    The key holder may be a network away (KMS: one or two calls a row), so a batch is read and
    re-keyed outside any transaction, and then written in one short transaction, each row
    only if it is still as it was read: a row another rotation re-keyed meanwhile keeps that
    rotation's work, and no lock is held while the holder is asked."""
    from bank.books.models import BankStatement
    from bank.nacha.models import NachaFile, NachaInboundFile

    active = key_provider().active_version()
    budget = [max_batches]
    done = _rotate_accounts(active, batch_size, budget)
    for model, kind in (
        (NachaFile, "NACHA file"),
        (NachaInboundFile, "inbound NACHA file"),
        (BankStatement, "bank statement"),
    ):
        done += _rotate_files(model, kind, active, batch_size, budget)
    return done


def _batch_allowed(budget: list[int | None]) -> bool:
    if budget[0] is None:
        return True
    if budget[0] <= 0:
        return False
    budget[0] -= 1
    return True


def _rotate_accounts(active: str, batch_size: int, budget: list[int | None]) -> int:
    done = 0
    last_pk = 0
    while True:
        rows = list(
            VaultAccount.objects.exclude(key_version=active)
            .filter(pk__gt=last_pk)
            .order_by("pk")[:batch_size]
        )
        if not rows or not _batch_allowed(budget):
            break
        last_pk = rows[-1].pk
        resealed = []
        for row in rows:
            aad = row.token.encode()
            try:
                resealed.append((row, seal(unseal(Sealed.of(row), aad=aad), aad=aad)))
            except VaultError as exc:
                raise type(exc)(f"account {row.token}: {exc}") from None
        written = 0
        with transaction.atomic():
            for row, sealed in resealed:
                written += VaultAccount.objects.filter(
                    pk=row.pk, key_version=row.key_version, nonce=bytes(row.nonce)
                ).update(**sealed.fields(), rotated_at=timezone.now())
        done += written
        logger.info("vault keys rotated", extra={"rows": written, "key_version": active})
    return done


def _rotate_files(model, kind: str, active: str, batch_size: int, budget: list) -> int:
    """The data keys of one table of sealed NACHA files re-wrapped under ``active``."""
    done = 0
    last_pk = None
    while True:
        # Only what the re-wrap needs: a file's ciphertext is read once, to check its key.
        rows = model.objects.exclude(key_version=active).order_by("pk")
        if last_pk is not None:
            rows = rows.filter(pk__gt=last_pk)
        rows = list(
            rows.only("pk", "sha256", "key_version", "wrapped_key", "nonce", "ciphertext")[
                :batch_size
            ]
        )
        if not rows or not _batch_allowed(budget):
            break
        last_pk = rows[-1].pk
        rewrapped = []
        for row in rows:
            try:
                rewrapped.append((row, rewrap(Sealed.of(row), aad=row.content_aad())))
            except VaultError as exc:
                raise type(exc)(f"{kind} {row.pk}: {exc}") from None
        written = 0
        with transaction.atomic():
            for row, sealed in rewrapped:
                written += model.objects.filter(
                    pk=row.pk, key_version=row.key_version, wrapped_key=bytes(row.wrapped_key)
                ).update(key_version=sealed.key_version, wrapped_key=sealed.wrapped_key)
        done += written
        logger.info(
            "vault keys rotated", extra={"rows": written, "kind": kind, "key_version": active}
        )
    return done
