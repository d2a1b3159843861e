"""Standard Webhooks signatures (``webhook-id``, ``webhook-timestamp``, ``webhook-signature``),
made by the ``standardwebhooks`` package that receivers verify with."""

import base64
import secrets
from datetime import datetime

from standardwebhooks.webhooks import Webhook

SECRET_PREFIX = "whsec_"


def secret_new() -> str:
    """A ``whsec_`` secret: base64 of 32 random bytes, as Standard Webhooks defines it."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode("ascii")


def signature_headers(
    *, secrets_in_use: list[str], msg_id: str, timestamp: datetime, body: bytes
) -> dict[str, str]:
    """The three headers; one ``v1,`` signature per secret, space-separated (rotation: the
    receiver accepts the delivery if any signature matches a secret it holds)."""
    signatures = [
        Webhook(secret).sign(msg_id=msg_id, timestamp=timestamp, data=body)
        for secret in secrets_in_use
    ]
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(timestamp.timestamp())),
        "webhook-signature": " ".join(signatures),
    }
