"""docs/security/vault-vectors.json: the vault's sealed format as test vectors. The vault's own
code opens every sealed vector and refuses every refused one, and so does a second
implementation written here from docs/security/vault.md alone (``cryptography``'s AES-GCM, none
of ``bank.vault``), so the page, the vectors and the code say the same thing."""

import base64
import importlib.util
import json
from pathlib import Path

import pytest
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from bank.vault.crypto import Sealed, SettingsKeyProvider, VaultKeyError, seal, unseal

ROOT = Path(__file__).resolve().parents[3]
VECTORS_PATH = ROOT / "docs" / "security" / "vault-vectors.json"
VECTORS = json.loads(VECTORS_PATH.read_text())
SEALED = {vector["name"]: vector for vector in VECTORS["sealed"]}
REFUSED = {vector["name"]: vector for vector in VECTORS["refused"]}


def page_open(keys: dict[str, str], record: dict) -> tuple[bytes, bytes]:
    """The page's format: wrapped_key = 12-byte nonce || AES-256-GCM(KEK, nonce, data key,
    'dek:' + aad); ciphertext = AES-256-GCM(data key, nonce, plaintext, aad). Returns the data
    key and the plaintext; raises InvalidTag, KeyError or ValueError for a record that does not
    open."""
    kek = base64.b64decode(keys[record["key_version"]])
    wrapped = base64.b64decode(record["wrapped_key"])
    aad = record["aad"].encode("ascii")
    data_key = AESGCM(kek).decrypt(wrapped[:12], wrapped[12:], b"dek:" + aad)
    plaintext = AESGCM(data_key).decrypt(
        base64.b64decode(record["nonce"]), base64.b64decode(record["ciphertext"]), aad
    )
    return data_key, plaintext


def stored(record: dict) -> Sealed:
    return Sealed(
        record["key_version"],
        base64.b64decode(record["wrapped_key"]),
        base64.b64decode(record["nonce"]),
        base64.b64decode(record["ciphertext"]),
    )


@pytest.fixture
def vector_keys(module_settings):
    module_settings.VAULT_KEYS = VECTORS["keys"]
    module_settings.VAULT_ACTIVE_KEY = "v1"
    module_settings.VAULT_KEY_PROVIDER = "bank.vault.crypto.SettingsKeyProvider"
    return SettingsKeyProvider()


def test_the_committed_vectors_are_what_the_script_writes():
    spec = importlib.util.spec_from_file_location(
        "vault_vectors", ROOT / "scripts/vault_vectors.py"
    )
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)

    assert VECTORS_PATH.read_text() == script.text()


def test_the_vectors_cover_accounts_a_rotation_a_file_and_every_way_a_record_is_refused():
    assert {r["key_version"] for r in SEALED.values()} == {"v1", "v2"}
    assert any(r["aad"].startswith("nacha-file:") for r in SEALED.values())
    assert len(REFUSED) >= 6


@pytest.mark.parametrize("name", sorted(SEALED))
def test_the_vaults_code_opens_each_sealed_vector(vector_keys, name):
    record = SEALED[name]

    opened = unseal(stored(record), aad=record["aad"].encode("ascii"), provider=vector_keys)

    assert opened == base64.b64decode(record["plaintext"])


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_the_vaults_code_refuses_each_refused_vector(vector_keys, name):
    record = REFUSED[name]

    with pytest.raises(VaultKeyError):
        unseal(stored(record), aad=record["aad"].encode("ascii"), provider=vector_keys)


@pytest.mark.parametrize("name", sorted(SEALED))
def test_an_implementation_from_the_page_opens_each_sealed_vector(name):
    record = SEALED[name]

    data_key, plaintext = page_open(VECTORS["keys"], record)

    assert data_key == base64.b64decode(record["data_key"])
    assert plaintext == base64.b64decode(record["plaintext"])


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_an_implementation_from_the_page_refuses_each_refused_vector(name):
    with pytest.raises((InvalidTag, KeyError)):
        page_open(VECTORS["keys"], REFUSED[name])


def test_a_record_the_vault_seals_today_opens_with_the_implementation_from_the_page(vector_keys):
    sealed = seal(b'{"routing": "011000015"}', aad=b"vtok_today", provider=vector_keys)
    record = {
        "key_version": sealed.key_version,
        "wrapped_key": base64.b64encode(sealed.wrapped_key),
        "nonce": base64.b64encode(sealed.nonce),
        "ciphertext": base64.b64encode(sealed.ciphertext),
        "aad": "vtok_today",
    }

    assert page_open(VECTORS["keys"], record)[1] == b'{"routing": "011000015"}'
    assert len(sealed.nonce) == 12 and len(sealed.wrapped_key) == 12 + 32 + 16


@pytest.mark.parametrize(
    "wrapped_key", [b"", b"\x00" * 5, b"\x00" * 12, b"\xff" * 28], ids=["empty", "5", "12", "28"]
)
def test_a_truncated_wrapped_key_is_a_record_that_does_not_open_not_a_crash(
    vector_keys, wrapped_key
):
    record = SEALED["account"]
    broken = Sealed("v1", wrapped_key, base64.b64decode(record["nonce"]), b"")

    with pytest.raises(VaultKeyError):
        unseal(broken, aad=record["aad"].encode("ascii"), provider=vector_keys)


@pytest.mark.parametrize("nonce", [b"", b"\x00" * 4], ids=["empty", "4"])
def test_a_record_whose_nonce_is_cut_short_does_not_open_rather_than_crash(vector_keys, nonce):
    record = SEALED["account"]
    broken = Sealed("v1", base64.b64decode(record["wrapped_key"]), nonce, b"\x00" * 20)

    with pytest.raises(VaultKeyError):
        unseal(broken, aad=record["aad"].encode("ascii"), provider=vector_keys)
