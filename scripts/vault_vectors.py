"""Writes docs/security/vault-vectors.json: test vectors of the vault's sealed format, for an
independent implementation to check itself against (docs/security/vault.md says the format).

Every key and nonce is derived from a label (SHA-256), so the file is the same each time it is
written; tests/bank/vault/test_vectors.py opens every vector with the vault's own code and with
a second implementation written from the page, and fails when the file differs from what this
script writes. Standard library and ``cryptography`` only: no Django.

Usage: python scripts/vault_vectors.py [--check]
"""

import base64
import hashlib
import json
import sys
from pathlib import Path

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "docs" / "security" / "vault-vectors.json"


def derived(label: str, size: int) -> bytes:
    return hashlib.sha256(f"payments-vault-vectors:{label}".encode()).digest()[:size]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


KEKS = {"v1": derived("kek:v1", 32), "v2": derived("kek:v2", 32)}


def sealed(name: str, *, version: str, aad: str, plaintext: bytes) -> dict:
    data_key = derived(f"{name}:data-key", 32)
    wrap_nonce = derived(f"{name}:wrap-nonce", 12)
    nonce = derived(f"{name}:nonce", 12)
    wrapped = wrap_nonce + AESGCM(KEKS[version]).encrypt(
        wrap_nonce, data_key, b"dek:" + aad.encode("ascii")
    )
    ciphertext = AESGCM(data_key).encrypt(nonce, plaintext, aad.encode("ascii"))
    return {
        "name": name,
        "aad": aad,
        "key_version": version,
        "wrapped_key": b64(wrapped),
        "nonce": b64(nonce),
        "ciphertext": b64(ciphertext),
        "plaintext": b64(plaintext),
        "data_key": b64(data_key),
    }


def vectors() -> dict:
    account = json.dumps({"routing": "011000015", "account": "123456789", "name": "Ada Lovelace"})
    token = "vtok_" + derived("token", 12).hex()
    file_bytes = b"101 011000015 1234567890" + b" " * 70 + b"\n"
    file_id = "2f1d5c9e-7a3b-4c1e-9d2f-5b6a7c8d9e0f"
    file_aad = f"nacha-file:{file_id}:{hashlib.sha256(file_bytes).hexdigest()}"
    records = [
        sealed("account", version="v1", aad=token, plaintext=account.encode()),
        sealed("account rotated to v2", version="v2", aad=token, plaintext=account.encode()),
        sealed("outbound NACHA file", version="v1", aad=file_aad, plaintext=file_bytes),
        sealed("empty plaintext", version="v1", aad="vtok_empty", plaintext=b""),
    ]
    first = records[0]
    flipped = bytearray(base64.b64decode(first["ciphertext"]))
    flipped[0] ^= 1
    flipped_key = bytearray(base64.b64decode(first["wrapped_key"]))
    flipped_key[-1] ^= 0x80
    # The data key wrapped with the record's token but without the "dek:" prefix.
    bare = derived("account:wrap-nonce", 12)
    unprefixed = bare + AESGCM(KEKS["v1"]).encrypt(
        bare, base64.b64decode(first["data_key"]), token.encode("ascii")
    )
    refused = [
        {**first, "name": "moved onto another record (other aad)", "aad": "vtok_other"},
        {**first, "name": "ciphertext altered (one bit)", "ciphertext": b64(bytes(flipped))},
        {**first, "name": "wrapped key altered (one bit)", "wrapped_key": b64(bytes(flipped_key))},
        {**first, "name": "wrapped key named under another version", "key_version": "v2"},
        {
            **first,
            "name": "data key wrapped without the dek: prefix",
            "wrapped_key": b64(unprefixed),
        },
        {**first, "name": "key version the holder does not have", "key_version": "v3"},
    ]
    for vector in refused:
        vector.pop("plaintext")
        vector.pop("data_key")
    return {
        "description": (
            "Test vectors of the vault's sealed records (docs/security/vault.md). Each record: "
            "wrapped_key = wrap_nonce (12 bytes) || AES-256-GCM(KEK[key_version], wrap_nonce, "
            "data_key, aad='dek:' + aad) with its 16-byte tag; ciphertext = AES-256-GCM(data_key, "
            "nonce, plaintext, aad) with its 16-byte tag. Binary values are base64; aad is ASCII. "
            "'sealed' records open to 'plaintext' (their 'data_key' given to check the unwrap); "
            "'refused' records must not open."
        ),
        "keys": {version: b64(key) for version, key in KEKS.items()},
        "sealed": records,
        "refused": refused,
    }


def text() -> str:
    return json.dumps(vectors(), indent=2) + "\n"


if __name__ == "__main__":
    if "--check" in sys.argv[1:]:
        sys.exit(0 if OUTPUT.read_text() == text() else f"{OUTPUT} differs: run {__file__}")
    OUTPUT.write_text(text())
    print(f"wrote {OUTPUT.relative_to(ROOT)}")
