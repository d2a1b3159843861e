"""The ways an account is validated before its first WEB debit, each a plug-in of one interface.

NACHA's rule accepts a prenote, micro-entries, or a commercial validation service. Each is a
``Method``: ``begin`` fills in the account's ``AccountValidation`` row as its start leaves it
(under the row's lock, in the start's transaction, with no network call), and ``after_commit``
does what needs the network, outside any transaction; its answer, when it has one already (a
service's), is the outcome the service records. A method the host adds is one more class in
``METHODS``.

- **prenote**: a zero-dollar entry (transaction code 23/28 for checking and savings, 33/38 for
  credits) in the next file. The account takes live entries from the third banking day after
  the prenote's settlement date (``live_from``); a return before then fails it, a NOC records
  the change (``payments.services.validation``).
- **micro_entries**: two credits under $1.00 and an offsetting debit of their sum, under
  ``ACCTVERIFY`` and the merchant's company name, each a payment (``purpose=micro_entry``).
  The amounts are drawn here and sent once; the validation keeps only their keyed digest, and
  nothing logs them or shows them to the merchant.
- **service**: the class ``PAYMENTS["ACCOUNT_VALIDATION_SERVICE"]`` names, called with the
  account; its answer is recorded as the evidence.
"""

from __future__ import annotations

import abc
import hashlib
import hmac
import logging
import secrets
import uuid
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from decimal import Decimal

import requests
from django.conf import settings
from django.utils.module_loading import import_string

from payments import conf as payments_conf
from payments import originator
from payments.banking_days import add_banking_days
from payments.models import AccountValidation, ValidationMethod

logger = logging.getLogger(__name__)

# Prenote entries' transaction codes: checking and savings, debit and credit.
PRENOTE_TRANSACTION_CODES = {
    ("checking", "debit"): "28",
    ("checking", "credit"): "23",
    ("savings", "debit"): "38",
    ("savings", "credit"): "33",
}
# A prenote settles the next banking day; live entries may follow from the third banking day
# after that (the end of the second is the start of the third).
PRENOTE_SETTLEMENT_BANKING_DAYS = 1
PRENOTE_WAIT_BANKING_DAYS = 2
MICRO_ENTRY_CREDITS = 2
# How long a started service validation waits for its first call's answer before the periodic
# round may ask again (``payments.services.validation.service_validations_retry``).
SERVICE_ANSWER_WAIT = timedelta(minutes=5)
MICRO_ENTRY_DIGEST_CONTEXT = b"payments.micro_entries.v1"


@dataclass
class Outcome:
    """What a method found: ``validated`` True or False, the evidence to keep, the reason of a
    failure. None from ``after_commit``: the answer comes later (a return, the amounts).
    ``retry``: no answer yet (the service could not be reached): ask again later."""

    validated: bool
    evidence: dict = field(default_factory=dict)
    reason: str = ""
    retry: bool = False


class ValidationServiceUnavailable(Exception):
    """A validation service raises this when it could not answer this time (its own outage):
    the validation stays pending and is asked again, as for a connection error, a timeout or
    an HTTP 5xx or 429."""


class Method(abc.ABC):
    name: str

    def unavailable(self, backend) -> str | None:
        """Why this method cannot run with ``backend`` and the host's settings, or None."""
        return None

    @abc.abstractmethod
    def begin(self, validation: AccountValidation, *, now: datetime) -> None:
        """Fill in the row (locked, state pending) as the start leaves it; no network call."""

    def after_commit(self, validation: AccountValidation) -> Outcome | None:
        """The network part, outside any transaction: send, or ask. None: nothing to record."""
        return None


class Prenote(Method):
    """The zero-dollar entry goes in the next file of a backend that can send one (the bank's
    ``prenote_queue``); the row waits for ``live_from``, set once the file is at the bank."""

    name = ValidationMethod.PRENOTE

    def unavailable(self, backend) -> str | None:
        if getattr(backend, "supports_prenotes", False):
            return None
        return f"{type(backend).__name__} cannot send prenotes (a bank backend's file can)"

    def begin(self, validation: AccountValidation, *, now: datetime) -> None:
        from payments.processor.backend import get_backend

        validation.expires_at = None
        queue = getattr(get_backend(), "prenote_queue", None)
        if queue is not None:
            # The backend writes the entry into a file of its own later (the bank's next cut),
            # in this transaction: the wait starts from the file's settlement date, set when
            # the file is delivered (``prenote_sent``). Until then nothing matures.
            trace_number = queue(
                validation_id=validation.pk,
                account_token=validation.account_token,
                merchant_id=validation.merchant_id,
            )
            validation.live_from = None
            validation.evidence = {
                "prenote": {"queued_at": now.isoformat(), "trace_number": trace_number}
            }
            return
        settlement = add_banking_days(now, PRENOTE_SETTLEMENT_BANKING_DAYS)
        validation.live_from = prenote_live_from(settlement)
        validation.evidence = {
            "prenote": {
                "sent_at": now.isoformat(),
                "settlement_date": settlement.date().isoformat(),
                "live_from": validation.live_from.isoformat(),
            }
        }


def prenote_live_from(settlement: date | datetime) -> datetime:
    """When an account whose prenote settles on ``settlement`` takes live entries: the start of
    the third banking day after it (the end of the second)."""
    return add_banking_days(settlement, PRENOTE_WAIT_BANKING_DAYS)


def prenote_transaction_code(account_type: str, direction: str = "debit") -> str:
    """The prenote's transaction code for an account of ``account_type``."""
    return PRENOTE_TRANSACTION_CODES[(account_type, direction)]


class MicroEntries(Method):
    """Two credits of 1 to 99 cents and a debit of their sum, each a payment of its own
    (``purpose=micro_entry``, PPD, ``ACCTVERIFY``, the merchant's), written with their submit
    commands in the start's transaction: sent exactly once through the path every payment
    takes (the outbox, the worker, the processor's callbacks or the bank's files), in the
    ledger, the admin and triage. A start retried or raced finds the validation pending and
    writes nothing. A backend that cuts files (the bank's ``micro_entries_queue``) queues the
    three entries in the same transaction, so one file carries them all and they settle
    together."""

    name = ValidationMethod.MICRO_ENTRIES

    def unavailable(self, backend) -> str | None:
        if backend.supports_credits:
            return None
        return f"{type(backend).__name__} cannot send credits, so no micro-entries"

    def begin(self, validation: AccountValidation, *, now: datetime) -> None:
        from payments.processor.backend import get_backend

        credits = [Decimal(secrets.randbelow(99) + 1) / 100 for _ in range(MICRO_ENTRY_CREDITS)]
        validation.secret_digest = micro_entries_digest(validation.account_token, credits)
        validation.expires_at = now + timedelta(days=payments_conf.MICRO_ENTRY_EXPIRY_DAYS)
        validation.live_from = None
        # The payments name the validation: its row is saved before them (it exists, locked).
        entries = micro_entries_build(validation, credits)
        queue = getattr(get_backend(), "micro_entries_queue", None)
        if queue is not None:
            queue(payment_ids=[entry.id for entry in entries])
        validation.evidence = {
            "micro_entries": {
                "round": str(uuid.uuid4()),
                "credits": len(credits),
                "debits": 1,
                "description": originator.ACCTVERIFY,
                "payments": [str(entry.id) for entry in entries],
            }
        }


def micro_entries_build(validation: AccountValidation, credits: list[Decimal]) -> list:
    """The round's payments, written in the caller's transaction with their submit commands:
    the credits to the account, then the debit of their sum from it."""
    from payments.models import PaymentDirection, PaymentPurpose
    from payments.services.create import payment_build

    moves = [(PaymentDirection.CREDIT, amount) for amount in credits]
    moves.append((PaymentDirection.DEBIT, sum(credits)))
    return [
        payment_build(
            merchant_id=validation.merchant_id,
            amount=amount,
            currency="USD",
            account_token=validation.account_token,
            sec_code="PPD",
            entry_description=originator.ACCTVERIFY,
            direction=direction,
            purpose=PaymentPurpose.MICRO_ENTRY,
            account_validation=validation,
            # The audit row keeps no amount: the amounts are the validation's secret.
            audit={"amount": "(micro-entry)", "validation_id": validation.pk},
            caused_by=f"validation:{validation.pk}",
        )
        for direction, amount in moves
    ]


def micro_entries_digest(account_token: str, amounts: list[Decimal]) -> str:
    """The keyed digest of the amounts in any order: what the row keeps instead of them."""
    canonical = ",".join(f"{amount:.2f}" for amount in sorted(amounts))
    key = hmac.new(settings.SECRET_KEY.encode(), MICRO_ENTRY_DIGEST_CONTEXT, hashlib.sha256)
    return hmac.new(
        key.digest(), f"{account_token}|{canonical}".encode(), hashlib.sha256
    ).hexdigest()


class ValidationService(abc.ABC):
    """A commercial validation service (a bank-data API, a consortium), as the host writes it
    and names it in ``PAYMENTS["ACCOUNT_VALIDATION_SERVICE"]``. ``validate`` is called outside
    any transaction. A failure that may pass (``ValidationServiceUnavailable``, a connection
    error, a timeout, an HTTP 5xx or 429 raised by ``requests``) leaves the validation pending,
    asked again a bounded number of times; any other exception (an HTTP 4xx: the service
    refused the question) fails it with its name, as its definite no does."""

    @abc.abstractmethod
    def validate(self, *, account_token: str, merchant_id: str) -> Outcome:
        """Whether the account is open and valid, with the service's evidence (no numbers)."""


class Service(Method):
    name = ValidationMethod.SERVICE

    def unavailable(self, backend) -> str | None:
        if payments_conf.ACCOUNT_VALIDATION_SERVICE:
            return None
        return 'no validation service is configured (PAYMENTS["ACCOUNT_VALIDATION_SERVICE"])'

    def begin(self, validation: AccountValidation, *, now: datetime) -> None:
        validation.expires_at = None
        validation.live_from = None
        validation.evidence = {"service": payments_conf.ACCOUNT_VALIDATION_SERVICE}
        # Due for the periodic round's retry unless the call's answer is recorded first: a
        # start cut after its commit (a process killed, the database gone mid-call) would
        # otherwise stay pending, unasked, its held debits held for good.
        validation.retry_at = now + SERVICE_ANSWER_WAIT

    def after_commit(self, validation: AccountValidation) -> Outcome | None:
        service = validation_service()
        try:
            outcome = service.validate(
                account_token=validation.account_token, merchant_id=validation.merchant_id
            )
        except Exception as exc:  # noqa: BLE001 - the service's failure is the outcome, named
            if service_failure_passes(exc):
                logger.warning(
                    "the validation service could not answer validation %s: %s",
                    validation.id,
                    type(exc).__name__,
                    exc_info=True,
                )
                reason = f"the validation service is unavailable: {_passing_failure(exc)}"
                return Outcome(False, reason=reason[:255], retry=True)
            logger.exception("the validation service failed on validation %s", validation.id)
            return Outcome(False, reason=f"the validation service failed: {exc}"[:255])
        if not isinstance(outcome, Outcome):
            return Outcome(False, reason="the validation service answered no Outcome")
        return outcome


def service_failure_passes(exc: BaseException) -> bool:
    """Whether the service's failure may pass if asked again: its own word for it, a connection
    error or a timeout (``requests``' or the standard library's), an HTTP 5xx or 429."""
    if isinstance(exc, (ValidationServiceUnavailable, ConnectionError, TimeoutError)):
        return True
    if isinstance(exc, (requests.ConnectionError, requests.Timeout)):
        return True
    if isinstance(exc, requests.HTTPError) and exc.response is not None:
        status = exc.response.status_code
        return status >= 500 or status == 429
    return False


def _passing_failure(exc: BaseException) -> str:
    """The failure as the evidence keeps it (the API shows it): the HTTP status or the kind of
    error, never the message of a library's error, which names the service's host and port;
    the service's own ``ValidationServiceUnavailable`` in its words."""
    if isinstance(exc, ValidationServiceUnavailable):
        return str(exc)
    response = getattr(exc, "response", None)
    if isinstance(exc, requests.HTTPError) and response is not None:
        return f"HTTP {response.status_code}"
    return type(exc).__name__


def validation_service() -> ValidationService:
    return import_string(payments_conf.ACCOUNT_VALIDATION_SERVICE)()


def service_class_problem(path: str) -> str | None:
    """Why ``path`` cannot be the validation service, or None ("" is none configured)."""
    if not path:
        return None
    try:
        cls = import_string(path)
    except ImportError as exc:
        return f"cannot be imported: {exc}"
    if not (isinstance(cls, type) and issubclass(cls, ValidationService)):
        return "is not a subclass of payments.validation_methods.ValidationService"
    return None


METHODS: dict[str, type[Method]] = {
    method.name: method for method in (Prenote, MicroEntries, Service)
}


def method_for(name: str) -> Method:
    return METHODS[name]()
