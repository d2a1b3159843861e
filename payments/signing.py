"""HMAC signatures of processor callbacks: one implementation for the signer and the verifier.

Header: ``X-Processor-Signature: t=<unix seconds>,v1=<hex>[,v1=<hex>...]`` where
``hex = HMAC_SHA256(secret, "<t>." + raw_body)``. Several ``v1`` values allow secret rotation.
"""

import hashlib
import hmac
import time
from collections.abc import Iterable

HEADER = "X-Processor-Signature"


class SignatureError(Exception):
    """The signature is missing, malformed, stale or does not match; the message says which."""


def compute(secret: str, timestamp: int, body: bytes) -> str:
    message = str(timestamp).encode() + b"." + body
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def sign(body: bytes, secrets: Iterable[str], *, timestamp: int | None = None) -> str:
    """The header value for ``body``, with one ``v1`` per secret given."""
    t = int(time.time()) if timestamp is None else timestamp
    parts = [f"t={t}"] + [f"v1={compute(s, t, body)}" for s in secrets]
    return ",".join(parts)


def verify(
    header: str | None,
    body: bytes,
    secrets: Iterable[str],
    *,
    tolerance_seconds: int = 300,
    now: float | None = None,
) -> None:
    """Raise ``SignatureError`` unless one ``v1`` matches one secret within the time tolerance."""
    if not header:
        raise SignatureError(f"missing {HEADER} header")
    timestamp: int | None = None
    candidates: list[str] = []
    for part in header.split(","):
        key, sep, value = part.strip().partition("=")
        if not sep:
            raise SignatureError(f"malformed {HEADER} header: expected t=<seconds>,v1=<hex>")
        if key == "t":
            try:
                timestamp = int(value)
            except ValueError:
                raise SignatureError(f"malformed timestamp in {HEADER}: {value!r}") from None
        elif key == "v1":
            candidates.append(value)
    if timestamp is None or not candidates:
        raise SignatureError(f"{HEADER} needs a t= timestamp and at least one v1= signature")
    current = time.time() if now is None else now
    if abs(current - timestamp) > tolerance_seconds:
        raise SignatureError(
            f"signature timestamp is {int(current - timestamp)} s away from now "
            f"(tolerance {tolerance_seconds} s): replayed or clock skew"
        )
    matched = False
    # Compare every pair in constant time; do not stop early on a match.
    for secret in secrets:
        expected = compute(secret, timestamp, body)
        for candidate in candidates:
            matched |= hmac.compare_digest(expected, candidate)
    if not matched:
        raise SignatureError("signature does not match any configured secret")


def secrets_parse(
    value: str | Iterable[str], *, setting: str = "CALLBACK_SIGNING_SECRETS"
) -> list[str]:
    """The secret list of ``setting`` from its comma-separated text (or a list), each stripped.

    ``"new, old"`` is two secrets, ``new`` and ``old``: a space after the comma during a rotation
    must not turn the old secret into one that never matches. An empty list (``""``, ``","``,
    ``" , "``) would refuse every callback, so it is refused here, naming the setting.
    """
    from django.core.exceptions import ImproperlyConfigured

    items = value.split(",") if isinstance(value, str) else list(value)
    secrets = [str(item).strip() for item in items if str(item).strip()]
    if not secrets:
        raise ImproperlyConfigured(
            f"{setting} is empty: set one or more signing secrets, comma-separated "
            "(the first signs, all verify)"
        )
    return secrets
