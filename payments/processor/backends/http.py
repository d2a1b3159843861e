"""The reference processor backend: the HTTP client for the processor's ACH API.

It implements ``ProcessorBackend`` (``backend.py``) for the API of the design card, which the
sandbox processor serves in development and tests: ``/v1/ach/debits``, ``/v1/ach/credits``
(money out, called and classified as debits are), bearer auth, and
callbacks signed by ``payments.signing`` in the module's event contract.

Every call returns or raises something that carries a ``CallRecord`` (when it started, how long
it took, the HTTP status or the kind of error, the body it got back), so the service can write a
processor-attempt row for every call whatever happened.

Classification:
- accepted: 2xx with a usable body -> ``DebitAccepted`` / ``DebitStatus``;
- rejected, permanent: 4xx other than 401, 403, 408, 409 and 429 -> ``ProcessorCallRejected``;
- retryable: 5xx, 408, 409, 429 (with its ``Retry-After``), read timeout, connection error, or a
  2xx whose body cannot be read -> ``ProcessorCallUnavailable``;
- 401/403 -> ``ProcessorAuthFailed``, a retryable error of its own.

Two deliberate exceptions to "4xx is permanent":
- 409 with an ``Idempotency-Key`` means "a request with this key is still being processed" (a
  retry that overtook a slow first attempt). Failing the payment then would be wrong: the first
  attempt may well charge it.
- 401/403 say our credentials are wrong, not the payment: failing every payment submitted while
  the API key is misconfigured would fail them all for good. The payment stays pending, the
  caller raises a high alert, and once the key is fixed the retries (or a redrive) go through.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from dataclasses import replace
from datetime import datetime
from decimal import Decimal
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urlencode

import requests
from django.utils import timezone
from requests.utils import get_environ_proxies

from payments import conf as payments_conf
from payments import signing
from payments.events import ProcessorEvent
from payments.processor.backend import (
    CallbackRequest,
    CallErrorKind,
    CallRecord,
    CallTimer,
    CreditAccepted,
    CreditStatus,
    DebitAccepted,
    DebitStatus,
    DishonorAccepted,
    EventsPage,
    ProcessorAuthFailed,
    ProcessorBackend,
    ProcessorCallRejected,
    ProcessorCallUnavailable,
    get_backend,
    reset_backend,
)
from payments.processor.contract import (
    InvalidEventsPage,
    events_page_parse,
    processor_event_parse,
)
from payments.strictjson import StrictJSONError
from payments.strictjson import loads_with_items as strict_loads_with_items

logger = logging.getLogger(__name__)

RESPONSE_BODY_LIMIT = 4000
RETRYABLE_4XX = (408, 409, 429)
AUTH_FAILURES = (401, 403)


def parse_retry_after(value: str | None, *, now: datetime | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or HTTP date); None if absent
    or unreadable. A date in the past means "now": 0."""
    if value is None or not value.strip():
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        if seconds != seconds or seconds in (float("inf"), float("-inf")):
            return None
        return max(0.0, seconds)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        logger.warning("unreadable Retry-After header from the processor: %r", value)
        return None
    if when.tzinfo is None:
        return None
    current = now or timezone.now()
    return max(0.0, (when - current).total_seconds())


def _truncate(text: str) -> str:
    if len(text) <= RESPONSE_BODY_LIMIT:
        return text
    return text[:RESPONSE_BODY_LIMIT] + f"... [{len(text) - RESPONSE_BODY_LIMIT} more characters]"


class ProcessorClient(ProcessorBackend):
    """One reused ``requests.Session`` (connection pooling, keep-alive) for all calls.

    Base URL, API key and timeouts are read from settings on every call unless given here, so
    a settings change (or a test's override) takes effect without rebuilding the session.
    """

    def __init__(
        self,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        connect_timeout: float | None = None,
        read_timeout: float | None = None,
    ) -> None:
        self._base_url = base_url
        self._api_key = api_key
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self.session = requests.Session()
        self.session.headers.update({"Accept": "application/json", "User-Agent": "payments/1"})
        # requests reads the environment on every call when it trusts it (the proxy variables,
        # walking all of os.environ, the CA bundle, ~/.netrc): a sixth of a submission's CPU.
        # It is read once per base URL instead (``_environment``). A netrc login was never
        # wanted: the Authorization header carries the API key.
        self.session.trust_env = False
        self._environments: dict[str, tuple[dict[str, str], bool | str]] = {}

    def close(self) -> None:
        self.session.close()

    def connections_renew(self) -> None:
        """Close the session's kept connections; it opens new ones as calls need them (the
        calls of other threads under way finish on theirs)."""
        self.session.close()

    # --- configuration, resolved per call
    @property
    def base_url(self) -> str:
        return (self._base_url or payments_conf.PROCESSOR_BASE_URL).rstrip("/")

    @property
    def timeout(self) -> tuple[float, float]:
        return (
            self._connect_timeout or payments_conf.PROCESSOR_CONNECT_TIMEOUT_SECONDS,
            self._read_timeout or payments_conf.PROCESSOR_TIMEOUT_SECONDS,
        )

    def _environment(self, base_url: str) -> tuple[dict[str, str], bool | str]:
        """The proxies and the CA bundle the environment gives calls to ``base_url``, as requests
        reads them when it trusts the environment; read once per base URL, so a proxy variable
        set after the process started is not seen."""
        known = self._environments.get(base_url)
        if known is None:
            verify = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")
            known = (get_environ_proxies(base_url), verify or True)
            self._environments[base_url] = known
        return known

    def _headers(self, idempotency_key: uuid.UUID | str | None = None) -> dict[str, str]:
        headers = {"Authorization": f"Bearer {self._api_key or payments_conf.PROCESSOR_API_KEY}"}
        if idempotency_key is not None:
            headers["Idempotency-Key"] = str(idempotency_key)
        return headers

    # --- API
    def debit_create(
        self,
        *,
        idempotency_key: uuid.UUID | str,
        payment_id: uuid.UUID | str,
        amount: Decimal,
        currency: str,
        source_token: str,
        sec_code: str = "",
        company_entry_description: str = "",
    ) -> DebitAccepted:
        """POST /v1/ach/debits. The same key on every attempt: the processor charges once."""
        return self._transfer_create(
            "/v1/ach/debits",
            idempotency_key,
            _transfer_payload(
                payment_id,
                amount,
                currency,
                _entry_fields(sec_code, company_entry_description),
                source_token=source_token,
            ),
        )

    def debit_get(self, *, idempotency_key: uuid.UUID | str) -> DebitStatus:
        """GET /v1/ach/debits/<key>: what the processor knows of the debit; 404 = nothing."""
        return self._transfer_get(f"/v1/ach/debits/{idempotency_key}")

    def credit_create(
        self,
        *,
        idempotency_key: uuid.UUID | str,
        payment_id: uuid.UUID | str,
        amount: Decimal,
        currency: str,
        destination_token: str,
        sec_code: str = "",
        company_entry_description: str = "",
    ) -> CreditAccepted:
        """POST /v1/ach/credits (``payment_id``: the refund's or payout's id). The same key on
        every attempt: the processor credits once."""
        return self._transfer_create(
            "/v1/ach/credits",
            idempotency_key,
            _transfer_payload(
                payment_id,
                amount,
                currency,
                _entry_fields(sec_code, company_entry_description),
                destination_token=destination_token,
            ),
        )

    def credit_get(self, *, idempotency_key: uuid.UUID | str) -> CreditStatus:
        """GET /v1/ach/credits/<key>: what the processor knows of the credit; 404 = nothing."""
        return self._transfer_get(f"/v1/ach/credits/{idempotency_key}")

    def _transfer_create(
        self, path: str, idempotency_key: uuid.UUID | str, payload: dict[str, str]
    ) -> DebitAccepted:
        """A debit or a credit: ``201`` (new) or ``200`` (known key) ``{processor_id, status}``."""
        response, call = self._send(
            "POST", path, headers=self._headers(idempotency_key), json_body=payload
        )
        body, call = self._accepted_body(response, call)
        return DebitAccepted(
            processor_id=str(body["processor_id"]),
            status=str(body["status"]),
            created=response.status_code == 201,
            call=call,
        )

    def _transfer_get(self, path: str) -> DebitStatus:
        """A debit or a credit by key: its status, or ``found=False`` for a 404."""
        response, call = self._send("GET", path, headers=self._headers())
        if response.status_code == 404:
            return DebitStatus(found=False, processor_id="", status="", call=call)
        body, call = self._accepted_body(response, call)
        return DebitStatus(
            found=True,
            processor_id=str(body["processor_id"]),
            status=str(body["status"]),
            call=call,
        )

    def return_dishonor(
        self,
        *,
        idempotency_key: uuid.UUID | str,
        debit_idempotency_key: uuid.UUID | str,
        payment_id: uuid.UUID | str,
        processor_id: str,
        return_event_id: str,
        reason_code: str,
        amount: Decimal,
        currency: str,
    ) -> DishonorAccepted:
        """POST /v1/ach/debits/<debit's key>/dishonors with the request's own Idempotency-Key:
        ``202`` (new) or ``200`` (known key, original result) ``{dishonor_id, status}``."""
        payload = {
            "payment_id": str(payment_id),
            "processor_id": processor_id,
            "return_event_id": return_event_id,
            "reason_code": reason_code,
            "amount": f"{Decimal(amount):.2f}",
            "currency": currency,
        }
        response, call = self._send(
            "POST",
            f"/v1/ach/debits/{debit_idempotency_key}/dishonors",
            headers=self._headers(idempotency_key),
            json_body=payload,
        )
        body, call = self._accepted_body(response, call, id_field="dishonor_id")
        return DishonorAccepted(
            dishonor_id=str(body["dishonor_id"]),
            status=str(body["status"]),
            created=response.status_code == 202,
            call=call,
        )

    def events_list(self, *, after: str | None, limit: int) -> EventsPage:
        """GET /v1/events?after=<cursor>&limit=<n>: ``{"data": [...], "next_cursor": ...,
        "has_more": ...}``. The page is read as strict JSON (what the callback endpoint's parser
        refuses is refused here too) and held to its contract; a page that breaks it is
        retryable (``ProcessorCallUnavailable``): the cursor stays where it was. What strict
        JSON refuses inside one event is that event's alone (``EventsPage.unreadable``)."""
        query = {"limit": str(limit)} if after is None else {"after": after, "limit": str(limit)}
        path = f"/v1/events?{urlencode(query)}"
        response, call = self._send("GET", path, headers=self._headers())
        if response.status_code == 404:
            message = f"GET {call.url}: HTTP 404: the processor has no events API here"
            raise ProcessorCallRejected(
                message, call=replace(call, error_kind=CallErrorKind.HTTP, error=message)
            )
        try:
            body, unreadable = strict_loads_with_items(response.content, key="data")
            data, next_cursor, has_more = events_page_parse(body, limit=limit)
        except (StrictJSONError, InvalidEventsPage) as exc:
            message = f"HTTP {response.status_code} with an unusable events page: {exc}"
            raise ProcessorCallUnavailable(
                f"GET {call.url}: {message}",
                call=replace(call, error_kind=CallErrorKind.HTTP, error=message[:1000]),
            ) from exc
        return EventsPage(
            data=data,
            next_cursor=next_cursor,
            has_more=has_more,
            call=call,
            unreadable=unreadable,
        )

    # --- callbacks
    def callback_verify(self, request: CallbackRequest) -> None:
        """``X-Processor-Signature: t=<unix seconds>,v1=<hex>``: HMAC-SHA256 over ``"<t>."`` and
        the raw body, against any configured secret, within the replay window."""
        signing.verify(
            request.headers.get(signing.HEADER),
            request.body,
            request.secrets,
            tolerance_seconds=request.tolerance_seconds,
        )

    def callback_parse(self, data: Any, request: CallbackRequest) -> ProcessorEvent:
        """This processor posts the module's event contract itself."""
        return processor_event_parse(data)

    def callback_challenge(self) -> str:
        return f'HMAC-SHA256 header="{signing.HEADER}"'

    # --- plumbing
    def _send(
        self,
        method: str,
        path: str,
        *,
        headers: dict[str, str],
        json_body: dict[str, Any] | None = None,
    ) -> tuple[requests.Response, CallRecord]:
        """One call, classified as the module docstring says: a 2xx (or a GET's 404) is returned
        with its record; anything else raises an error carrying it."""
        timer = CallTimer(method=method, url=self.base_url + path)
        response = self._request(timer, headers=headers, json_body=json_body)
        status = response.status_code
        text = _truncate(response.text)
        retry_after = parse_retry_after(response.headers.get("Retry-After"))
        if 200 <= status < 300 or (status == 404 and method == "GET"):
            return response, timer.record(http_status=status, response_body=text)
        error = f"HTTP {status}: {_error_summary(text)}"
        call = timer.record(
            http_status=status,
            error_kind=CallErrorKind.HTTP,
            error=error,
            response_body=text,
            retry_after=retry_after,
        )
        where = f"{method} {timer.url}"
        if status in AUTH_FAILURES:
            raise ProcessorAuthFailed(f"{where}: {error} (check PROCESSOR_API_KEY)", call=call)
        if status >= 500 or status in RETRYABLE_4XX:
            raise ProcessorCallUnavailable(f"{where}: {error}", call=call)
        raise ProcessorCallRejected(f"{where}: {error}", call=call)

    def _request(
        self,
        timer: CallTimer,
        *,
        headers: dict[str, str],
        json_body: dict[str, Any] | None,
    ) -> requests.Response:
        """The HTTP exchange; no answer at all raises ``ProcessorCallUnavailable``."""
        method, url = timer.method, timer.url
        if json_body is not None:
            headers = {**headers, "Content-Type": "application/json"}
        proxies, verify = self._environment(self.base_url)
        try:
            return self.session.request(
                method,
                url,
                headers=headers,
                data=None if json_body is None else json.dumps(json_body),
                timeout=self.timeout,
                proxies=proxies,
                verify=verify,
            )
        except requests.exceptions.ConnectTimeout as exc:
            call = timer.record(
                error_kind=CallErrorKind.CONNECTION, error=f"connect timeout: {exc}"
            )
            raise ProcessorCallUnavailable(
                f"{method} {url}: could not connect within {self.timeout[0]} s", call=call
            ) from exc
        except requests.exceptions.Timeout as exc:
            call = timer.record(error_kind=CallErrorKind.TIMEOUT, error=f"read timeout: {exc}")
            raise ProcessorCallUnavailable(
                f"{method} {url}: no answer within {self.timeout[1]} s (the request may still "
                "have been processed; retry with the same idempotency key)",
                call=call,
            ) from exc
        except requests.exceptions.RequestException as exc:
            call = timer.record(
                error_kind=CallErrorKind.CONNECTION, error=f"{type(exc).__name__}: {exc}"
            )
            raise ProcessorCallUnavailable(
                f"{method} {url}: {type(exc).__name__}: {exc}", call=call
            ) from exc

    def _accepted_body(
        self, response: requests.Response, call: CallRecord, *, id_field: str = "processor_id"
    ) -> tuple[dict[str, Any], CallRecord]:
        """The JSON body of a 2xx, with its ``id_field`` and ``status``; an unreadable one is
        retryable: the same key gets it again."""
        try:
            body = response.json()
            if not isinstance(body, dict) or not body.get(id_field) or not body.get("status"):
                raise ValueError(f"expected a JSON object with {id_field} and status")
        except ValueError as exc:
            bad = replace(
                call,
                error_kind=CallErrorKind.HTTP,
                error=f"HTTP {response.status_code} with an unusable body: {exc}",
            )
            raise ProcessorCallUnavailable(
                f"{call.method} {call.url}: HTTP {response.status_code} with an unusable body "
                f"({exc})",
                call=bad,
            ) from exc
        return body, call


def _transfer_payload(
    payment_id: uuid.UUID | str,
    amount: Decimal,
    currency: str,
    entry: dict[str, str] | None = None,
    **token: str,
) -> dict[str, str]:
    """A debit's or a credit's body; ``token`` is its ``source_token`` or ``destination_token``,
    ``entry`` its SEC code and company entry description when it has them."""
    return {
        "payment_id": str(payment_id),
        "amount": f"{Decimal(amount):.2f}",
        "currency": currency,
        **token,
        **(entry or {}),
    }


def _entry_fields(sec_code: str, company_entry_description: str) -> dict[str, str]:
    """The entry's class and description as the API takes them; an empty one is left out (the
    processor's default), so a payment written before them sends the body it always sent."""
    fields = {"sec_code": sec_code, "company_entry_description": company_entry_description}
    return {name: value for name, value in fields.items() if value}


def _error_summary(text: str) -> str:
    """The processor's error message if the body is JSON with one, else the start of the body."""
    try:
        body = json.loads(text)
    except ValueError:
        return text[:200] or "(empty body)"
    if isinstance(body, dict):
        error = body.get("error") or body.get("message") or body.get("errors")
        if error:
            return str(error)[:500]
    return text[:200]


# The names the services and tests have always used: the configured backend, which is this
# class unless PROCESSOR_BACKEND names another.
get_client = get_backend
reset_client = reset_backend
