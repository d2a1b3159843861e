"""The vault's key-encrypting keys as the settings give them (``payments.conf`` declares them)."""

from __future__ import annotations

import base64
import binascii
from typing import Any

KEY_BYTES = 32
_VERSION_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")


def parse_vault_keys(value: Any) -> dict[str, bytes]:
    """``VAULT_KEYS`` as {version: 32-byte key}: a dict of base64 texts, or the environment's
    ``"v1:<base64>,v2:<base64>"``. ValueError names the version at fault, never the key."""
    if isinstance(value, str):
        items: dict[str, Any] = {}
        for part in filter(None, (p.strip() for p in value.split(","))):
            version, sep, key = part.partition(":")
            if not sep:
                raise ValueError("each key is written version:base64")
            items[version.strip()] = key.strip()
        value = items
    if not isinstance(value, dict):
        raise ValueError("must be a dict of version: base64 key")
    keys = {}
    for version, text in value.items():
        if not (isinstance(version, str) and version and set(version) <= _VERSION_CHARS):
            raise ValueError("a key version is 1 or more of A-Z a-z 0-9 _ - .")
        try:
            key = base64.b64decode(text, validate=True) if isinstance(text, str) else b""
        except (binascii.Error, ValueError):
            raise ValueError(f"key {version!r} is not base64") from None
        if len(key) != KEY_BYTES:
            raise ValueError(f"key {version!r} must decode to {KEY_BYTES} bytes (AES-256)")
        keys[version] = key
    return keys
