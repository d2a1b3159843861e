"""Envelope encryption with AES-GCM: each record its own data key, wrapped by a key-encrypting
key (KEK) that a ``KeyProvider`` holds.

The data key never leaves the process unwrapped, and the KEK never leaves its provider: the
settings provider below keeps versioned KEKs in ``BANK["VAULT_KEYS"]``; the KMS provider
(``bank.vault.kms``: AWS KMS ``Encrypt``/``Decrypt`` of the 32-byte data key) implements the
same methods, named by ``BANK["VAULT_KEY_PROVIDER"]``. Rotation is a new active version: new
records are wrapped under it, and ``vault_rotate_keys`` re-encrypts the old ones in batches.

Both encryptions bind the record's token as associated data, so a ciphertext or a wrapped key
copied onto another row does not decrypt there.
"""

from __future__ import annotations

import abc
import os
import threading
from dataclasses import dataclass
from typing import Any, ClassVar

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from bank import conf
from bank.vault.keys import parse_vault_keys

NONCE_BYTES = 12


class VaultError(Exception):
    """The vault cannot seal or open a record. A message names a key version or a token, never
    a key, a plaintext or a number."""


class VaultKeyError(VaultError):
    """A key is missing or a ciphertext does not open with it (wrong key, altered data, moved
    to another record): the record's own problem."""


class VaultUnavailable(VaultError):
    """The key holder cannot wrap or unwrap at all just now: unreachable, refusing access, the
    key disabled or pending deletion. No record is at fault, so none may be given up for it:
    callers stop and try again once the holder answers."""


class KeyProvider(abc.ABC):
    """Holds the key-encrypting keys: wraps and unwraps data keys, never hands a KEK out."""

    @abc.abstractmethod
    def active_version(self) -> str:
        """The version new data keys are wrapped under."""

    @abc.abstractmethod
    def wrap(self, version: str, data_key: bytes, *, aad: bytes) -> bytes: ...

    @abc.abstractmethod
    def unwrap(self, version: str, wrapped: bytes, *, aad: bytes) -> bytes:
        """Raise ``VaultKeyError`` when the version is unknown or the wrapped key does not
        open, ``VaultUnavailable`` when the holder cannot be asked."""

    @classmethod
    def settings_problems(cls) -> list[str]:
        """What is wrong with the settings this provider reads, each naming its setting and no
        key; read by the start-up check (bank.E004), so it must not call out."""
        return []


class SettingsKeyProvider(KeyProvider):
    """KEKs from ``BANK["VAULT_KEYS"]``, the active one ``BANK["VAULT_ACTIVE_KEY"]``."""

    def _keys(self) -> dict[str, bytes]:
        try:
            return parse_vault_keys(conf.VAULT_KEYS)
        except ValueError as exc:
            raise ImproperlyConfigured(f"BANK['VAULT_KEYS']: {exc}") from None

    @classmethod
    def settings_problems(cls) -> list[str]:
        version = conf.VAULT_ACTIVE_KEY
        try:
            keys = parse_vault_keys(conf.VAULT_KEYS)
        except ValueError:
            return []  # refused on its own (payments.E003)
        if version and version not in keys:
            return [
                f"BANK['VAULT_ACTIVE_KEY'] = {version!r} is not a version of BANK['VAULT_KEYS']"
            ]
        return []

    def active_version(self) -> str:
        version = conf.VAULT_ACTIVE_KEY
        if version not in self._keys():
            raise ImproperlyConfigured(
                "BANK['VAULT_ACTIVE_KEY'] must name a version of BANK['VAULT_KEYS']"
            )
        return version

    def _kek(self, version: str) -> AESGCM:
        key = self._keys().get(version)
        if key is None:
            raise VaultKeyError(f"no key-encrypting key of version {version!r}")
        return AESGCM(key)

    def wrap(self, version: str, data_key: bytes, *, aad: bytes) -> bytes:
        nonce = os.urandom(NONCE_BYTES)
        return nonce + self._kek(version).encrypt(nonce, data_key, aad)

    def unwrap(self, version: str, wrapped: bytes, *, aad: bytes) -> bytes:
        kek = self._kek(version)
        try:
            return kek.decrypt(wrapped[:NONCE_BYTES], wrapped[NONCE_BYTES:], aad)
        # A wrapped key cut short has no nonce AES-GCM accepts (ValueError): it does not open,
        # as an altered one does.
        except (InvalidTag, ValueError):
            raise VaultKeyError(f"a data key does not open under key {version!r}") from None


_provider: KeyProvider | None = None
_provider_path = ""
_lock = threading.Lock()


def key_provider() -> KeyProvider:
    global _provider, _provider_path
    path = conf.VAULT_KEY_PROVIDER
    with _lock:
        if _provider is None or _provider_path != path:
            _provider, _provider_path = import_string(path)(), path
        return _provider


@dataclass(frozen=True)
class Sealed:
    """A sealed value as the models store it: four fields of the same names (a vault account,
    a sealed NACHA file)."""

    key_version: str
    wrapped_key: bytes
    nonce: bytes
    ciphertext: bytes

    FIELDS: ClassVar[tuple[str, ...]] = ("key_version", "wrapped_key", "nonce", "ciphertext")

    @classmethod
    def of(cls, row: Any) -> Sealed:
        """The sealed value a stored row holds (its binary fields as bytes)."""
        return cls(row.key_version, bytes(row.wrapped_key), bytes(row.nonce), bytes(row.ciphertext))

    def fields(self) -> dict[str, Any]:
        """The model fields to store it under."""
        return {name: getattr(self, name) for name in self.FIELDS}


def seal(plaintext: bytes, *, aad: bytes, provider: KeyProvider | None = None) -> Sealed:
    """``plaintext`` under a fresh data key, wrapped under the active KEK."""
    provider = provider or key_provider()
    version = provider.active_version()
    data_key = AESGCM.generate_key(bit_length=256)
    nonce = os.urandom(NONCE_BYTES)
    ciphertext = AESGCM(data_key).encrypt(nonce, plaintext, aad)
    return Sealed(version, provider.wrap(version, data_key, aad=b"dek:" + aad), nonce, ciphertext)


def rewrap(sealed: Sealed, *, aad: bytes, provider: KeyProvider | None = None) -> Sealed:
    """The same ciphertext with its data key wrapped under the active KEK instead: all that a
    rotation of the KEK needs (envelope encryption), whatever the size of the plaintext. The
    data key is checked against the ciphertext first, so a record that does not open is
    refused (``VaultKeyError``) rather than carried over."""
    provider = provider or key_provider()
    version = provider.active_version()
    data_key = provider.unwrap(sealed.key_version, sealed.wrapped_key, aad=b"dek:" + aad)
    try:
        AESGCM(data_key).decrypt(sealed.nonce, sealed.ciphertext, aad)
    except (InvalidTag, ValueError):
        raise VaultKeyError("a vault record does not open: altered or moved") from None
    wrapped = provider.wrap(version, data_key, aad=b"dek:" + aad)
    return Sealed(version, wrapped, sealed.nonce, sealed.ciphertext)


def unseal(sealed: Sealed, *, aad: bytes, provider: KeyProvider | None = None) -> bytes:
    provider = provider or key_provider()
    data_key = provider.unwrap(sealed.key_version, sealed.wrapped_key, aad=b"dek:" + aad)
    try:
        return AESGCM(data_key).decrypt(sealed.nonce, sealed.ciphertext, aad)
    except (InvalidTag, ValueError):
        raise VaultKeyError("a vault record does not open: altered or moved") from None
