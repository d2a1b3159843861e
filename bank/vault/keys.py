"""The vault's key-encrypting keys as the settings give them (``bank.conf`` declares them):
the keys themselves (``VAULT_KEYS``), or the KMS keys that hold them (``VAULT_KMS_KEYS``)."""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any

KEY_BYTES = 32
_VERSION_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")
# How KMS names a key: its id (a UUID, or mrk-<hex> for a multi-Region key), its ARN, an alias
# name or an alias ARN.
_KMS_KEY_ID = re.compile(
    r"(?:arn:aws[a-z-]*:kms:[a-z0-9-]+:\d{12}:key/)?"
    r"(?:mrk-[0-9a-f]{32}|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})"
    r"|(?:arn:aws[a-z-]*:kms:[a-z0-9-]+:\d{12}:)?alias/[A-Za-z0-9/_-]{1,250}"
)
KMS_KEYS_ACCEPTED = (
    "a dict of version: KMS key id, key ARN, alias name or alias ARN, or "
    "'v1:<key ARN>,v2:<key ARN>'"
)


def _versioned_items(value: Any, *, form: str) -> dict[Any, Any]:
    """A dict as given, or the environment's ``"v1:<value>,v2:<value>"`` (split at the first
    colon of each item, so an ARN keeps its own)."""
    if not isinstance(value, str):
        return value
    items: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in value.split(","))):
        version, sep, rest = part.partition(":")
        if not sep:
            raise ValueError(f"each key is written {form}")
        items[version.strip()] = rest.strip()
    return items


def _version_problem(version: Any) -> str | None:
    if not (isinstance(version, str) and version and set(version) <= _VERSION_CHARS):
        return "a key version is 1 or more of A-Z a-z 0-9 _ - ."
    return None


def parse_vault_keys(value: Any) -> dict[str, bytes]:
    """``VAULT_KEYS`` as {version: 32-byte key}: a dict of base64 texts, or the environment's
    ``"v1:<base64>,v2:<base64>"``. ValueError names the version at fault, never the key."""
    value = _versioned_items(value, form="version:base64")
    if not isinstance(value, dict):
        raise ValueError("must be a dict of version: base64 key")
    keys = {}
    for version, text in value.items():
        if problem := _version_problem(version):
            raise ValueError(problem)
        try:
            key = base64.b64decode(text, validate=True) if isinstance(text, str) else b""
        except (binascii.Error, ValueError):
            raise ValueError(f"key {version!r} is not base64") from None
        if len(key) != KEY_BYTES:
            raise ValueError(f"key {version!r} must decode to {KEY_BYTES} bytes (AES-256)")
        keys[version] = key
    return keys


def parse_kms_keys(value: Any) -> dict[str, str]:
    """``VAULT_KMS_KEYS`` as {version: KMS key id}: a dict, or the environment's
    ``"v1:<key ARN>,v2:<key ARN>"``. ValueError names the version at fault. A key ARN is the
    safest name: an alias can be pointed at another key, and the records wrapped under the first
    then no longer open under the alias."""
    value = _versioned_items(value, form="version:<KMS key id or ARN>")
    if not isinstance(value, dict):
        raise ValueError("must be a dict of version: KMS key id")
    keys = {}
    for version, key_id in value.items():
        if problem := _version_problem(version):
            raise ValueError(problem)
        if not (isinstance(key_id, str) and _KMS_KEY_ID.fullmatch(key_id)):
            raise ValueError(
                f"key {version!r} is not a KMS key id, key ARN, alias name or alias ARN"
            )
        keys[version] = key_id
    return keys
