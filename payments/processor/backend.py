"""The processor backend interface: what the module asks of a processor, whoever it is.

A backend submits a debit under our idempotency key, looks a debit up by that key (the status
check reconciliation relies on), optionally does the same for a credit (money out: a refund or
a payout, ``credit_create`` and ``credit_get``), tells an authentic callback from a forged one
over the raw request, and turns a callback into a ``ProcessorEvent``. ``PROCESSOR_BACKEND``
names the class; the reference backend is the HTTP client of
``payments/processor/backends/http.py``.

Everything after the call is the module's and stays as it is whatever the backend: the attempt
row, the circuit breaker and the worker's retry decision read only what a backend returns or
raises, so a backend speaks in the types below (docs/how-to/processor-backend.md maps them).
"""

from __future__ import annotations

import abc
import enum
import functools
import inspect
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils import timezone
from django.utils.module_loading import import_string

from payments import conf as payments_conf
from payments.exceptions import ProcessorRejected, ProcessorUnavailable

if TYPE_CHECKING:
    from payments.events import ProcessorEvent


class CallErrorKind(enum.StrEnum):
    """What went wrong with a call, as the processor-attempt row stores it."""

    NONE = ""  # accepted
    TIMEOUT = "timeout"  # no answer within the read timeout
    CONNECTION = "connection"  # no connection (refused, reset, connect timeout)
    HTTP = "http"  # an answer that is not a usable success


@dataclass(frozen=True)
class CallRecord:
    """What one call did; the service turns it into a ProcessorAttempt row.

    ``http_status`` is also what the breaker reads: 429 pauses every caller for ``retry_after``
    seconds, 409 ("this key is still being processed") never opens it. A backend whose processor
    is not spoken to over HTTP states the status its answer corresponds to.
    """

    method: str
    url: str
    started_at: datetime
    latency_ms: float
    http_status: int | None = None
    error_kind: CallErrorKind = CallErrorKind.NONE
    error: str = ""
    response_body: str = ""
    retry_after: float | None = None


@dataclass(frozen=True)
class CallTimer:
    """When a call started, and its record with the time it took so far."""

    method: str
    url: str
    started_at: datetime = field(default_factory=timezone.now)
    start: float = field(default_factory=time.perf_counter)

    def record(self, **fields: Any) -> CallRecord:
        latency_ms = (time.perf_counter() - self.start) * 1000
        return CallRecord(
            method=self.method,
            url=self.url,
            started_at=self.started_at,
            latency_ms=latency_ms,
            **fields,
        )


@dataclass(frozen=True)
class DebitAccepted:
    processor_id: str
    status: str
    created: bool  # a new debit; False: the processor already knew the key (original result)
    call: CallRecord


@dataclass(frozen=True)
class DebitQueued:
    """The backend took the debit and submits it itself later: a bank file's delivery queues
    the submission that answers it. The payment stays ``pending`` and the submit message is
    done, so no retry waits for the file (over a long weekend, days) and nothing of the
    payment's queue waits behind it."""

    reason: str
    call: CallRecord


@dataclass(frozen=True)
class DebitStatus:
    found: bool  # False: the processor has no debit under this idempotency key
    processor_id: str
    status: str  # the processor's word, compared by reconciliation: submitted, settled, returned
    call: CallRecord


@dataclass(frozen=True)
class DishonorAccepted:
    """The processor took a request to dishonor a return; its answer comes later as a callback
    (``return_dishonored`` or ``dishonor_contested``)."""

    dishonor_id: str
    status: str
    created: bool  # False: the processor already knew the key (original result)
    call: CallRecord


@dataclass(frozen=True)
class EventsPage:
    """One page of the processor's events after a cursor, oldest first.

    ``data`` holds each event as the processor sent it, not yet checked: the caller validates
    each one as the callback endpoint validates a body (``callback_parse``), so one malformed
    event is set aside with its error instead of failing the page. ``next_cursor`` is the
    processor's opaque cursor after the last event of the page (None: it gave none, the caller
    keeps its own); ``has_more`` is what the processor says, never trusted to end a loop.
    """

    data: tuple[Any, ...]
    next_cursor: str | None
    has_more: bool
    call: CallRecord
    # By position in ``data``: the errors of an event whose JSON itself could not be taken (a
    # NUL, an unpaired surrogate, a number out of range); ``data`` holds it with those values
    # replaced by notes. The caller refuses it alone, as it does an event that breaks the
    # contract.
    unreadable: dict[int, dict[str, list[str]]] = field(default_factory=dict)


@dataclass(frozen=True)
class TokenChecked:
    """What a backend says of an account token at create time: why it refuses it (None: it
    takes it) and the account's standard entry class when it knows it (the bank backend's
    vault account), else None."""

    refused: str | None
    sec_code: str | None = None
    # When the account's details last changed, when the backend knows (a fraud rule holds a
    # credit to an account changed lately: ``payments.fraud_rules.NewDestination``).
    changed_at: datetime | None = None


class DebitSent(Exception):
    """The backend has sent the debit on (a bank file holds its entry): it can no longer be
    withdrawn, and the payment is no longer the merchant's to cancel."""


# A credit (a refund or a payout) is answered as a debit is: the processor's id and status, a
# credit the backend sends later itself, or what the processor knows of it by key.
CreditAccepted = DebitAccepted
CreditQueued = DebitQueued
CreditStatus = DebitStatus


class EventsListUnsupported(Exception):
    """The backend's processor has no events API to pull from (the NACHA bank backend)."""


class ProcessorCallRejected(ProcessorRejected):
    """The processor refused the request itself: do not retry it (the payment fails)."""

    def __init__(self, message: str, *, call: CallRecord) -> None:
        super().__init__(message, status=call.http_status)
        self.call = call


class CreditsUnsupported(ProcessorCallRejected):
    """The backend's processor sends no credits: a refund or payout through it fails at once,
    recorded as a rejected attempt (never retried: no later try can succeed)."""


class ProcessorCallUnavailable(ProcessorUnavailable):
    """The call may succeed later with the same idempotency key."""

    def __init__(self, message: str, *, call: CallRecord) -> None:
        super().__init__(message, retry_after=call.retry_after)
        self.call = call


class ProcessorAuthFailed(ProcessorCallUnavailable):
    """The processor refused our credentials (the reference backend's 401/403). A configuration
    problem, not the payment's: retryable once someone fixes them (PROCESSOR_API_KEY for the
    reference backend)."""


@dataclass(frozen=True)
class CallbackRequest:
    """A callback as the endpoint received it, and what the endpoint is configured to trust.

    ``body`` is the raw bytes, before any parsing (a signature is over what was sent, not over
    re-serialised JSON); ``headers`` is case-insensitive. ``secrets`` (CALLBACK_SIGNING_SECRETS,
    the first signs, all verify) and ``tolerance_seconds`` (CALLBACK_TOLERANCE_SECONDS, the
    replay window) are the callback app's settings, handed over so a backend reads no setting
    of an app that depends on it.
    """

    body: bytes
    headers: Mapping[str, str]
    secrets: tuple[str, ...]
    tolerance_seconds: float


class ProcessorBackend(abc.ABC):
    """One processor. Built once per process (``get_backend``) and shared by its threads."""

    @abc.abstractmethod
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
    ) -> DebitAccepted | DebitQueued:
        """Submit a debit. Every attempt of a payment sends the same ``idempotency_key``: the
        processor must charge it once and answer a known key with its original result. A
        backend that submits later on its own (a bank file) answers ``DebitQueued``. Raises
        ``ProcessorCallRejected`` or ``ProcessorCallUnavailable`` (``ProcessorAuthFailed``).

        ``sec_code`` and ``company_entry_description`` are the entry's standard entry class and
        description (``payments.originator``; "" for the processor's default). A backend whose
        ``debit_create`` does not name them (written before them) is called without them."""

    @abc.abstractmethod
    def debit_get(self, *, idempotency_key: uuid.UUID | str) -> DebitStatus:
        """What the processor knows of the debit submitted under ``idempotency_key``;
        ``found=False`` when it has none. Raises as ``debit_create`` does."""

    def debit_withdraw(self, *, payment_id: uuid.UUID | str) -> None:  # noqa: B027
        """Withdraw the debit of a pending payment that the backend holds but has not sent,
        for the merchant's cancel (``payments.services.cancel``). Called inside the cancel's
        transaction, under the payment's row lock, with no network call: it takes whatever lock
        the backend's own sending takes, so the two have one winner. Raises ``DebitSent`` when
        the debit has left. Optional: a backend that holds nothing keeps this, as the reference
        backend does (its debit leaves with the submission's call, which the payment's
        ``submission_started_at`` guards)."""

    @property
    def withdraws_debits(self) -> bool:
        """Whether ``debit_withdraw`` is written for this backend: only then may a debit it
        answered ``DebitQueued`` for still be canceled (the backend guards it itself); a queued
        debit of a backend without it is treated as sent."""
        return type(self).debit_withdraw is not ProcessorBackend.debit_withdraw

    def source_token_refused(self, *, token: str, merchant_id: str) -> str | None:
        """Why this backend will not take ``token`` as ``merchant_id``'s account, checked when a
        debit or a payout is created (so a bad one is a 400 naming the field, not a failed file
        cut later), or None. Called outside any transaction, with no network call. The default
        takes any token: a processor's token is the processor's to judge. The bank backend
        takes only a vault token the vault holds for the merchant."""
        return None

    def accounts_last4(self, *, tokens: list[str], merchant_id: str) -> dict[str, str]:
        """The last four digits of the accounts ``tokens`` name, for those this backend knows
        (a token it does not know is left out): what a payout's ``destination`` shows. One
        query for a page of payouts; no network call. The default knows none: a processor's
        token carries no digits the module may read."""
        return {}

    def source_token_check(self, *, token: str, merchant_id: str) -> TokenChecked:
        """``source_token_refused`` and the account's standard entry class in one look (the
        create path asks once): the default knows no class. The bank backend reads both from
        the vault account's row."""
        return TokenChecked(self.source_token_refused(token=token, merchant_id=merchant_id))

    @property
    def describes_entries(self) -> bool:
        """Whether this backend's ``debit_create`` and ``credit_create`` take ``sec_code`` and
        ``company_entry_description`` (a backend written before them is called without)."""
        return _describes_entries(type(self))

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
    ) -> CreditAccepted | CreditQueued:
        """Send a credit (money out: ``payment_id`` is the refund's or payout's id) to the
        account ``destination_token`` names. As ``debit_create``: every attempt sends the same
        ``idempotency_key``, the processor credits it once and answers a known key with its
        original result; a backend that sends later on its own answers ``CreditQueued``.
        Optional: a backend whose processor sends no credits keeps this refusal,
        ``CreditsUnsupported`` (a ``ProcessorCallRejected``), so the credit fails at once with
        the backend's name instead of waiting for retries that cannot succeed."""
        raise self._credits_unsupported("SUBMIT")

    def credit_get(self, *, idempotency_key: uuid.UUID | str) -> CreditStatus:
        """What the processor knows of the credit sent under ``idempotency_key``;
        ``found=False`` when it has none. Optional, with ``credit_create``: the same refusal."""
        raise self._credits_unsupported("GET")

    @property
    def supports_credits(self) -> bool:
        """Whether ``credit_create`` is written for this backend (money out can go through it)."""
        return type(self).credit_create is not ProcessorBackend.credit_create

    def _credits_unsupported(self, method: str) -> CreditsUnsupported:
        message = f"{type(self).__name__} cannot send credits (refunds, payouts) to its processor"
        timer = CallTimer(method=method, url="")
        return CreditsUnsupported(
            message, call=timer.record(error_kind=CallErrorKind.HTTP, error=message)
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
        """Ask the processor to dishonor the return (``return_event_id``, the processor's id of
        the ``returned`` event) of the debit submitted under ``debit_idempotency_key`` (the
        processor's ``processor_id``) with ``reason_code`` (R61-R69).
        Every attempt of one request sends the same ``idempotency_key``: the processor must
        dishonor once. Raises as ``debit_create`` does. Optional: a backend whose processor
        takes no dishonors keeps this refusal, which the module records as a rejected attempt
        and shows the operator."""
        timer = CallTimer(method="DISHONOR", url="")
        message = f"{type(self).__name__} cannot ask its processor to dishonor a return"
        raise ProcessorCallRejected(
            message, call=timer.record(error_kind=CallErrorKind.HTTP, error=message)
        )

    def events_list(self, *, after: str | None, limit: int) -> EventsPage:
        """The processor's events after the opaque cursor ``after`` (None: from its first),
        at most ``limit`` of them, in the order it made them: the pull that recovers callbacks
        the processor never delivered (``callbacks.events_pull``). Raises
        ``ProcessorCallUnavailable`` for a failure worth a later try and
        ``ProcessorCallRejected`` for a refusal (an unknown cursor). Optional: a backend whose
        processor has no such API keeps this refusal, and the pull says so and does nothing."""
        raise EventsListUnsupported(f"{type(self).__name__} cannot list its processor's events")

    @property
    def supports_events(self) -> bool:
        """Whether ``events_list`` is written for this backend (a pull has something to ask)."""
        return type(self).events_list is not ProcessorBackend.events_list

    def connections_renew(self) -> None:  # noqa: B027
        """Drop the connections kept open to the processor, so the next call opens a new one:
        a balancer may have pinned a kept connection to a dead backend of the processor's
        (``payments.services.submission`` calls again on a new connection). Optional: a backend
        that keeps no connection keeps this."""

    @abc.abstractmethod
    def callback_verify(self, request: CallbackRequest) -> None:
        """Raise ``payments.signing.SignatureError`` (answered 401) unless the callback is
        authentic and fresh. Compare in constant time."""

    @abc.abstractmethod
    def callback_parse(self, data: Any, request: CallbackRequest) -> ProcessorEvent:
        """The verified callback as an event; ``data`` is its JSON body, decoded. Build it with
        ``payments.processor.contract.processor_event_parse``, which checks it against the
        event contract the worker reads it back with; raise ``InvalidCallback`` (answered 400
        with its ``errors``) for a body that cannot be one."""

    def callback_challenge(self) -> str:
        """The ``WWW-Authenticate`` value of a 401: the scheme a callback must use."""
        return "Signature"

    def close(self) -> None:  # noqa: B027 - optional: a backend holding nothing has nothing to do
        """Release what the backend holds (connections); called when it is replaced."""


@functools.cache
def _describes_entries(cls: type[ProcessorBackend]) -> bool:
    parameters = inspect.signature(cls.debit_create).parameters.values()
    return any(
        p.kind is inspect.Parameter.VAR_KEYWORD or p.name == "company_entry_description"
        for p in parameters
    )


_backend: ProcessorBackend | None = None
_backend_path = ""
_backend_lock = threading.Lock()


def backend_class_problem(path: Any) -> str | None:
    """What is wrong with ``path`` as ``PROCESSOR_BACKEND``, or None: it must import and be a
    ``ProcessorBackend`` subclass that can be instantiated (every abstract method written)."""
    if not isinstance(path, str):
        return f"{type(path).__name__} is not a dotted path"
    try:
        cls = import_string(path)
    except ImportError as exc:
        return f"cannot be imported: {exc}"
    if not (isinstance(cls, type) and issubclass(cls, ProcessorBackend)):
        return "is not a subclass of payments.processor.backend.ProcessorBackend"
    if missing := sorted(getattr(cls, "__abstractmethods__", ())):
        return f"does not implement {', '.join(missing)}"
    return None


def get_backend() -> ProcessorBackend:
    """The process-wide backend of class ``PROCESSOR_BACKEND``, created on first use."""
    global _backend, _backend_path
    backend = _backend
    if backend is not None:  # the callback endpoint's hot path takes no lock
        return backend
    with _backend_lock:
        if _backend is None:
            _backend_path = payments_conf.PROCESSOR_BACKEND
            _backend = import_string(_backend_path)()
        return _backend


def reset_backend() -> None:
    """Close and forget the process-wide backend (tests; after a fork; a changed setting)."""
    global _backend
    with _backend_lock:
        if _backend is not None:
            _backend.close()
        _backend = None


@receiver(setting_changed)
def _backend_setting_changed(**kwargs: Any) -> None:
    """A test's ``override_settings`` (or ``settings`` fixture) naming another backend gets it on
    the next call; any setting name is looked at, so the check holds whatever the settings'
    layout, and the backend in use is kept while the path stays the same."""
    if _backend is not None and payments_conf.PROCESSOR_BACKEND != _backend_path:
        reset_backend()
