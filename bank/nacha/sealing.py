"""NACHA files sealed at rest: the bytes of a file hold raw account numbers, so the database
keeps them only as the vault seals them (``bank.vault.crypto``: a data key of the file's own,
wrapped by the vault's key holder, AES-GCM over the bytes).

The associated data binds the ciphertext and the wrapped key to the file's row: an outbound file
by its id and SHA-256, an inbound file by its SHA-256 (unique among inbound files). A sealed
content copied onto another row does not open there (``VaultKeyError``), and what opens is
checked against the row's SHA-256 once more, so the identity checks stay over the clear bytes.

``content_open`` is the one reader (``NachaFile.content_bytes()`` and
``NachaInboundFile.content_bytes()``); ``content_seal`` the one writer. Both call the key holder
(a KMS call with ``bank.vault.kms``): callers do so outside any transaction.
"""

from __future__ import annotations

import hashlib
import uuid
from typing import Any, Protocol

from bank.vault.crypto import Sealed, VaultKeyError, seal, unseal


class SealedRow(Protocol):
    sha256: str
    key_version: str
    wrapped_key: Any
    nonce: Any
    ciphertext: Any

    def content_aad(self) -> bytes: ...


def outbound_aad(*, file_id: uuid.UUID | str, sha256: str) -> bytes:
    return f"nacha-file:{file_id}:{sha256}".encode("ascii")


def inbound_aad(*, sha256: str) -> bytes:
    return f"nacha-inbound-file:{sha256}".encode("ascii")


def statement_aad(*, sha256: str) -> bytes:
    """A bank statement's (``bank.books``): it names our bank account."""
    return f"bank-statement:{sha256}".encode("ascii")


def content_seal(content: bytes, *, aad: bytes) -> dict[str, Any]:
    """The model fields of ``content`` sealed under a fresh data key: ``VaultUnavailable`` when
    the key holder cannot be asked (nothing is stored then)."""
    return seal(content, aad=aad).fields()


def content_open(row: SealedRow) -> bytes:
    """The clear bytes of a stored file. ``VaultKeyError`` when they do not open for this row
    (moved, altered, a key version no longer held) or are not the bytes its SHA-256 names;
    ``VaultUnavailable`` when the key holder cannot be asked."""
    content = unseal(Sealed.of(row), aad=row.content_aad())
    if hashlib.sha256(content).hexdigest() != row.sha256:
        raise VaultKeyError("a sealed NACHA file does not match its SHA-256")
    return content
