"""A worked example of a processor backend, written the way a team writes its own for a
processor the module does not know: copy this module into your project, change the calls and
the event shapes, and name your class in ``PAYMENTS["PROCESSOR_BACKEND"]``. The test suite runs
the whole pipeline through it against a double of "Other" (``tests/payments/other_processor.py``)
without a line of the module changed (``docs/how-to/processor-backend.md``).

"Other" speaks nothing of the reference API: transfers under ``/ach/v2/transfers`` with amounts
in cents, ``X-Api-Token`` and ``X-Request-Key`` headers, a lookup by query string, and callbacks
of its own shape signed ``X-Other-Signature: sha512=<hex>`` (HMAC-SHA512 over
``"<X-Other-Timestamp>." + body``). Its settings are its own: ``OTHER_PROCESSOR_URL`` and
``OTHER_PROCESSOR_TOKEN``.
"""

import hashlib
import hmac
import time
from decimal import Decimal

import requests
from django.conf import settings

from payments.exceptions import InvalidCallback
from payments.processor.backend import (
    CallbackRequest,
    CallErrorKind,
    CallTimer,
    DebitAccepted,
    DebitStatus,
    ProcessorAuthFailed,
    ProcessorBackend,
    ProcessorCallRejected,
    ProcessorCallUnavailable,
)
from payments.processor.backends.http import parse_retry_after
from payments.processor.contract import processor_event_parse
from payments.signing import SignatureError

SIGNATURE = "X-Other-Signature"
TIMESTAMP = "X-Other-Timestamp"
# Other's event kinds -> the module's event types.
KINDS = {"transfer.accepted": "submitted", "transfer.paid": "settled", "transfer.bounced": "failed"}


def other_signature(secret: str, timestamp: int, body: bytes) -> str:
    digest = hmac.new(secret.encode(), str(timestamp).encode() + b"." + body, hashlib.sha512)
    return f"sha512={digest.hexdigest()}"


class OtherProcessorBackend(ProcessorBackend):
    def __init__(self) -> None:
        self.session = requests.Session()

    def close(self) -> None:
        self.session.close()

    def debit_create(self, *, idempotency_key, payment_id, amount, currency, source_token):
        payload = {
            "order": str(payment_id),
            "amount_cents": int(Decimal(amount) * 100),
            "currency": currency,
            "account_token": source_token,
        }
        status, body, call = self._call("POST", "/ach/v2/transfers", idempotency_key, payload)
        transfer = body["transfer"]
        return DebitAccepted(
            processor_id=transfer["id"], status=transfer["state"], created=status == 201, call=call
        )

    def debit_get(self, *, idempotency_key):
        _, body, call = self._call("GET", f"/ach/v2/transfers?reference={idempotency_key}")
        if not body["transfers"]:
            return DebitStatus(found=False, processor_id="", status="", call=call)
        [transfer] = body["transfers"]
        return DebitStatus(
            found=True, processor_id=transfer["id"], status=transfer["state"], call=call
        )

    def _call(self, method, path, key=None, payload=None):
        """One call; its errors mapped onto the module's classes."""
        timer = CallTimer(method=method, url=settings.OTHER_PROCESSOR_URL + path)
        headers = {"X-Api-Token": settings.OTHER_PROCESSOR_TOKEN}
        if key is not None:
            headers["X-Request-Key"] = str(key)
        try:
            response = self.session.request(
                method, timer.url, headers=headers, json=payload, timeout=(1, 2)
            )
        except requests.RequestException as exc:
            call = timer.record(error_kind=CallErrorKind.CONNECTION, error=str(exc))
            raise ProcessorCallUnavailable(f"{method} {timer.url}: {exc}", call=call) from exc
        status = response.status_code
        if 200 <= status < 300:
            call = timer.record(http_status=status, response_body=response.text)
            return status, response.json(), call
        call = timer.record(
            http_status=status,
            error_kind=CallErrorKind.HTTP,
            error=f"HTTP {status}: {response.text[:200]}",
            response_body=response.text,
            retry_after=parse_retry_after(response.headers.get("X-Retry-In")),
        )
        error = f"{method} {timer.url}: HTTP {status}"
        if status == 401:
            raise ProcessorAuthFailed(error, call=call)
        if status >= 500 or status == 429:
            raise ProcessorCallUnavailable(error, call=call)
        raise ProcessorCallRejected(error, call=call)

    def callback_verify(self, request: CallbackRequest) -> None:
        signature = request.headers.get(SIGNATURE) or ""
        try:
            timestamp = int(request.headers.get(TIMESTAMP) or "")
        except ValueError:
            raise SignatureError(f"missing or malformed {TIMESTAMP}") from None
        if abs(time.time() - timestamp) > request.tolerance_seconds:
            raise SignatureError("stale signature")
        matched = False
        for secret in request.secrets:
            expected = other_signature(secret, timestamp, request.body)
            matched |= hmac.compare_digest(expected, signature)
        if not matched:
            raise SignatureError(f"{SIGNATURE} does not match")

    def callback_parse(self, data, request: CallbackRequest):
        try:
            transfer = data["transfer"]
            fields = {
                "payment_id": transfer["order"],
                "event_type": KINDS[data["kind"]],
                "processor_event_id": data["id"],
                "amount": f"{Decimal(transfer['amount_cents']) / 100:.2f}",
                "currency": transfer["currency"],
                "processor_id": transfer["id"],
                "timestamp": data["occurred_at"],
                "reason_code": (data.get("failure") or {}).get("code", ""),
            }
        except (KeyError, TypeError, ArithmeticError) as exc:
            raise InvalidCallback({"non_field_errors": [f"not an Other event: {exc!r}"]}) from None
        return processor_event_parse(fields)

    def callback_challenge(self) -> str:
        return f'HMAC-SHA512 header="{SIGNATURE}"'
