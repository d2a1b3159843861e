"""The vault's key-encrypting keys held by AWS KMS: the one module of the vault that calls KMS.

Select it with ``BANK["VAULT_KEY_PROVIDER"] = "bank.vault.kms.KmsKeyProvider"`` and name
a KMS key per version in ``BANK["VAULT_KMS_KEYS"]``; ``VAULT_ACTIVE_KEY`` is the version new
records are wrapped under, as with the settings provider. Each record's 32-byte data key is sent
to KMS ``Encrypt`` under the active version's key and kept as the ciphertext blob KMS answers;
``Decrypt`` gives it back. The KEK never leaves KMS, and the account details never reach it:
only the data key travels, over TLS to AWS.

The encryption context binds a wrapped key to its record (the vault passes the record's token):
KMS refuses to decrypt a blob with any other context, so a wrapped key copied onto another row
does not open there, and CloudTrail shows which record each decryption was for. ``Decrypt``
names the key the version maps to, so a blob is opened only under the key its version says.

KMS's answers become the vault's errors: a blob that does not open under this key and context is
the record's ``VaultKeyError``; KMS unreachable, throttling, access refused, a key disabled,
pending deletion or not found is ``VaultUnavailable`` (no record is at fault). The messages name
the version and KMS's error code only: never a key, a blob, a plaintext, nor KMS's own text.

botocore at DEBUG logs each request's parameters (``botocore.endpoint``: an ``Encrypt``'s
Plaintext, the data key) and each response's body (``botocore.parsers``: a ``Decrypt``'s
Plaintext). A filter on botocore's loggers drops every record they make while the vault's KMS
call runs (a context variable marks it), so turning botocore's logging up for some other call
cannot put the vault's data keys in the logs.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

# The vault's KMS gateway: with callbacks.sqs, the only modules of the apps the lint lets import
# boto3.
import boto3  # noqa: TID251
from botocore.config import Config  # noqa: TID251
from botocore.exceptions import BotoCoreError, ClientError, NoRegionError  # noqa: TID251

from bank import conf
from bank.vault.crypto import KeyProvider, VaultKeyError, VaultUnavailable
from bank.vault.keys import parse_kms_keys

# The encryption context's one pair; its value is what the vault binds the data key to.
CONTEXT_KEY = "payments-vault-record"
# The blob does not open under this key and context: the record's problem.
_RECORD_CODES = frozenset({"InvalidCiphertextException", "IncorrectKeyException"})

_lock = threading.Lock()
_client = None
_client_key: tuple | None = None

# Set while the vault's own KMS call runs, in its thread (or task) only.
_in_vault_call: ContextVar[bool] = ContextVar("payments_vault_kms_call", default=False)

# The loggers botocore (and the HTTP library under it) write a call's records to; a filter on
# a logger sees only its own records, so each is named. The first two carry bodies at DEBUG.
BOTOCORE_LOGGERS = (
    "botocore.endpoint",
    "botocore.parsers",
    "botocore.hooks",
    "botocore.auth",
    "botocore.awsrequest",
    "botocore.httpsession",
    "botocore.httpchecksum",
    "botocore.retryhandler",
    "botocore.retries.standard",
    "botocore.client",
    "urllib3.connectionpool",
)


class VaultCallLogFilter(logging.Filter):
    """Drops the records made during a KMS call of the vault; lets every other one through."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not _in_vault_call.get()


_log_filter = VaultCallLogFilter()


def log_filter_install() -> None:
    """Put the filter on botocore's loggers (idempotent: a logger keeps one copy)."""
    for name in BOTOCORE_LOGGERS:
        logging.getLogger(name).addFilter(_log_filter)


log_filter_install()


@contextmanager
def _vault_call() -> Iterator[None]:
    token = _in_vault_call.set(True)
    try:
        yield
    finally:
        _in_vault_call.reset(token)


def kms_client():
    """A process-wide boto3 KMS client for the current settings (rebuilt if they change)."""
    global _client, _client_key
    timeout = float(conf.VAULT_KMS_TIMEOUT_SECONDS)
    region, endpoint = conf.VAULT_KMS_REGION or None, conf.VAULT_KMS_ENDPOINT_URL or None
    key = (region, endpoint, timeout)
    with _lock:
        if _client is None or _client_key != key:
            log_filter_install()  # again, should a logging configuration have replaced loggers
            try:
                _client = boto3.client(
                    "kms",
                    region_name=region,
                    endpoint_url=endpoint,
                    config=Config(
                        connect_timeout=timeout,
                        read_timeout=timeout,
                        retries={"max_attempts": 2, "mode": "standard"},
                    ),
                )
            except NoRegionError:
                raise VaultUnavailable(
                    "no AWS region for KMS: set BANK['VAULT_KMS_REGION'] or AWS_REGION"
                ) from None
            _client_key = key
        return _client


def reset() -> None:
    """Forget the client (tests, or after the settings change)."""
    global _client, _client_key
    with _lock:
        _client = None
        _client_key = None


def _context(aad: bytes) -> dict[str, str]:
    # The vault's associated data is ASCII (a prefix and the record's token).
    return {CONTEXT_KEY: aad.decode("ascii")}


class KmsKeyProvider(KeyProvider):
    """KEKs held by AWS KMS, one KMS key per version (``BANK["VAULT_KMS_KEYS"]``)."""

    @classmethod
    def settings_problems(cls) -> list[str]:
        try:
            keys = parse_kms_keys(conf.VAULT_KMS_KEYS)
        except ValueError:
            return []  # refused on its own (payments.E003)
        problems = []
        if not keys:
            problems.append(
                "BANK['VAULT_KMS_KEYS'] names no KMS key: the KMS key holder needs one per "
                "key version"
            )
        version = conf.VAULT_ACTIVE_KEY
        if keys and version not in keys:
            problems.append(
                f"BANK['VAULT_ACTIVE_KEY'] = {version!r} is not a version of BANK['VAULT_KMS_KEYS']"
            )
        if not conf.VAULT_KMS_REGION and boto3.session.Session().region_name is None:
            problems.append(
                "BANK['VAULT_KMS_REGION'] is not set and boto3 finds no region of its own "
                "(AWS_REGION, AWS_DEFAULT_REGION)"
            )
        return problems

    def _key_id(self, version: str) -> str:
        try:
            keys = parse_kms_keys(conf.VAULT_KMS_KEYS)
        except ValueError as exc:
            raise VaultUnavailable(f"BANK['VAULT_KMS_KEYS']: {exc}") from None
        key_id = keys.get(version)
        if key_id is None:
            raise VaultKeyError(f"no KMS key of version {version!r} in BANK['VAULT_KMS_KEYS']")
        return key_id

    def active_version(self) -> str:
        version = conf.VAULT_ACTIVE_KEY
        self._key_id(version)
        return version

    def wrap(self, version: str, data_key: bytes, *, aad: bytes) -> bytes:
        key_id = self._key_id(version)
        try:
            with _vault_call():
                answer = kms_client().encrypt(
                    KeyId=key_id, Plaintext=data_key, EncryptionContext=_context(aad)
                )
        except (BotoCoreError, ClientError) as exc:
            raise _vault_error(exc, "wrap a data key", version) from None
        return answer["CiphertextBlob"]

    def unwrap(self, version: str, wrapped: bytes, *, aad: bytes) -> bytes:
        key_id = self._key_id(version)
        try:
            with _vault_call():
                answer = kms_client().decrypt(
                    KeyId=key_id, CiphertextBlob=wrapped, EncryptionContext=_context(aad)
                )
        except (BotoCoreError, ClientError) as exc:
            raise _vault_error(exc, "unwrap a data key", version) from None
        return answer["Plaintext"]


def _vault_error(exc: BotoCoreError | ClientError, what: str, version: str) -> Exception:
    """KMS's failure as the vault's error. Only the error code is kept: the text of a boto3
    error may quote the request (the wrapped key, the context)."""
    if isinstance(exc, ClientError):
        code = str(exc.response.get("Error", {}).get("Code") or "an unnamed error")
        if code in _RECORD_CODES:
            return VaultKeyError(f"a data key does not open under key {version!r} (KMS: {code})")
        return VaultUnavailable(f"KMS refused to {what} under key {version!r}: {code}")
    return VaultUnavailable(
        f"KMS cannot be reached to {what} under key {version!r}: {type(exc).__name__}"
    )
