"""factory-boy factories for the models the tests build, and the few builders of state that are
not one row (an open breaker, a processor event).

A factory fills what the model requires with the values a row has in production (a dead letter
as ingestion stores it, a queue record as the worker's start writes it), so a test names only
the fields its behaviour depends on. Tests of a constraint or of the ORM itself still call
``objects.create`` where the insert is what is tested.
"""

import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import factory
from django.contrib.auth import get_user_model
from django.db.models.functions import Now
from django.utils import timezone
from factory.django import DjangoModelFactory

from callbacks.models import (
    ParkedMessage,
    PaymentHold,
    ProcessingError,
    QueueMessage,
    QueueMessageStatus,
)
from payments.events import ProcessorEvent
from payments.models import (
    ApiIdempotencyKey,
    AttemptOutcome,
    BreakerState,
    CircuitBreaker,
    CircuitBreakerTransition,
    LedgerEntry,
    MerchantAccess,
    MerchantReturnDay,
    OutboxMessage,
    Payment,
    PaymentDirection,
    PaymentEvent,
    PaymentPurpose,
    PaymentState,
    ProcessedEvent,
    ProcessorAttempt,
)
from payments.processor.breaker import PROCESSOR, processor_breaker_get
from triage.models import (
    Alert,
    AlertNotification,
    BulkTriageJob,
    BulkTriageJobItem,
    DeadLetter,
    DeadLetterSource,
    TriageAction,
)


def _uuid() -> str:
    return str(uuid.uuid4())


def _event_id() -> str:
    return f"evt_{uuid.uuid4().hex}"


class UserFactory(DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)

    username = factory.Sequence(lambda n: f"user{n}")
    password = factory.django.Password("password")


def grant(user, *merchant_ids: str) -> None:
    """Let ``user`` act for ``merchant_ids`` through the default access policy."""
    for merchant_id in merchant_ids:
        MerchantAccess.objects.get_or_create(user=user, merchant_id=merchant_id)


# --- payments --------------------------------------------------------------------------------


def account_validated(token: str, merchant_id: str):
    """Record ``token`` as validated for ``merchant_id`` (NACHA's WEB debit rule): for tests of
    something else that debit a WEB account."""
    from django.utils import timezone

    from payments.models import AccountValidation, ValidationState

    validation, _ = AccountValidation.objects.get_or_create(
        account_token=token,
        defaults={
            "merchant_id": merchant_id,
            "state": ValidationState.VALIDATED,
            "method": "service",
            "validated_at": timezone.now(),
        },
    )
    return validation


class PaymentFactory(DjangoModelFactory):
    class Meta:
        model = Payment

    merchant_id = factory.Sequence(lambda n: f"merchant-{n % 5}")
    amount = Decimal("125.00")
    currency = "USD"
    source_token = factory.Sequence(lambda n: f"tok_bank_{n:04d}abc")


class PaymentEventFactory(DjangoModelFactory):
    """A row of a payment's event log: an applied processor event unless told otherwise."""

    class Meta:
        model = PaymentEvent

    payment = factory.SubFactory(PaymentFactory)
    kind = "processor_event"
    outcome = "applied"


class ProcessedEventFactory(DjangoModelFactory):
    """The dedup record of a processor event, as applying it writes it."""

    class Meta:
        model = ProcessedEvent

    processor_event_id = factory.LazyFunction(_event_id)
    payment = factory.SubFactory(PaymentFactory)
    event_type = "settled"
    payload_hash = "0" * 64
    outcome = "applied"


class LedgerEntryFactory(DjangoModelFactory):
    """A merchant credit of the payment's amount."""

    class Meta:
        model = LedgerEntry

    payment = factory.SubFactory(PaymentFactory)
    merchant_id = factory.SelfAttribute("payment.merchant_id")
    kind = "credit"
    amount = factory.SelfAttribute("payment.amount")
    currency = "USD"


class OutboxMessageFactory(DjangoModelFactory):
    """An unpublished submission in the outbox, as ``payment_create`` leaves it."""

    class Meta:
        model = OutboxMessage

    class Params:
        payment_id = factory.LazyFunction(_uuid)

    kind = "submit_payment"
    group_id = factory.LazyAttribute(lambda o: str(o.payment_id))
    body = factory.LazyAttribute(lambda o: {"kind": "submit_payment", "payment_id": o.group_id})


class MerchantReturnDayFactory(DjangoModelFactory):
    """One merchant's debits and returns of one day, ``days_ago`` (default 1) days back."""

    class Meta:
        model = MerchantReturnDay

    class Params:
        days_ago = 1

    merchant_id = "m-1"
    day = factory.LazyAttribute(lambda o: timezone.now().date() - timedelta(days=o.days_ago))


class ProcessorAttemptFactory(DjangoModelFactory):
    """One call to the processor: a 503 the breaker counts as a failure, unless told otherwise."""

    class Meta:
        model = ProcessorAttempt

    payment = factory.SubFactory(PaymentFactory)
    attempt_number = 1
    idempotency_key = factory.SelfAttribute("payment.idempotency_key")
    outcome = AttemptOutcome.RETRYABLE
    http_status = 503
    latency_ms = 1
    started_at = factory.LazyFunction(timezone.now)


class ApiIdempotencyKeyFactory(DjangoModelFactory):
    """An ``Idempotency-Key`` a request is still working under (no response stored yet)."""

    class Meta:
        model = ApiIdempotencyKey

    user = factory.SubFactory(UserFactory)
    key = factory.Sequence(lambda n: f"key-{n}")
    request_hash = "h"


class CircuitBreakerTransitionFactory(DjangoModelFactory):
    """A line of the processor breaker's history."""

    class Meta:
        model = CircuitBreakerTransition

    breaker = factory.LazyFunction(processor_breaker_get)
    kind = "opened"


def refund_held(
    debit: Payment, amount: str | Decimal, state: str = PaymentState.PENDING
) -> Payment:
    """A refund of ``debit`` in ``state``, its money held by its pending ledger entry, as
    ``refund_create`` leaves it."""
    refund = PaymentFactory(
        state=state,
        amount=Decimal(amount),
        merchant_id=debit.merchant_id,
        source_token=debit.source_token,
        direction=PaymentDirection.CREDIT,
        purpose=PaymentPurpose.REFUND,
        refund_of=debit,
    )
    LedgerEntry.objects.create(
        payment=refund,
        merchant_id=refund.merchant_id,
        kind="refund",
        amount=-refund.amount,
        currency=refund.currency,
        status="pending",
    )
    return refund


def open_breaker(
    *,
    opened_ago: timedelta = timedelta(0),
    open_for: timedelta = timedelta(seconds=30),
    last_error: str | None = None,
) -> CircuitBreaker:
    """The processor's breaker open, written straight to its row (times from the database's
    clock, as the breaker's own are): for tests of what an open breaker does to the rest. How
    failures open it is tested through its failures (tests/payments/test_breaker.py)."""
    processor_breaker_get()
    fields = {"state": BreakerState.OPEN, "opened_at": Now() - opened_ago}
    fields["open_until"] = Now() + open_for
    if last_error is not None:
        fields["last_error"] = last_error
    CircuitBreaker.objects.filter(name=PROCESSOR).update(**fields)
    return processor_breaker_get()


def processor_event(payment: Payment, event_type: str, **overrides) -> ProcessorEvent:
    fields = {
        "payment_id": payment.id,
        "event_type": event_type,
        "processor_event_id": _event_id(),
        "amount": payment.amount,
        "timestamp": datetime(2026, 11, 2, 12, 0, tzinfo=UTC),
    }
    fields.update(overrides)
    return ProcessorEvent.of(**fields)


# --- callbacks: the worker's records ---------------------------------------------------------


class QueueMessageFactory(DjangoModelFactory):
    """The worker's record of one received message as its start writes it: a processor event of
    a payment of its own (the message group), first received now, in progress."""

    class Meta:
        model = QueueMessage

    message_id = factory.LazyFunction(_uuid)
    kind = "processor_event"
    group_id = factory.LazyFunction(_uuid)
    payment_id = factory.SelfAttribute("group_id")
    first_started_at = factory.LazyFunction(timezone.now)
    last_started_at = factory.SelfAttribute("first_started_at")
    attempts = 1
    status = QueueMessageStatus.IN_PROGRESS


class ProcessingErrorFactory(DjangoModelFactory):
    """One failed attempt of a queue message, retryable."""

    class Meta:
        model = ProcessingError

    queue_message = factory.SubFactory(QueueMessageFactory)
    payment_id = factory.SelfAttribute("queue_message.payment_id")
    message_id = factory.SelfAttribute("queue_message.message_id")
    attempt_number = 1
    error_class = "payments.exceptions.InvalidTransition"
    retryable = True


class PaymentHoldFactory(DjangoModelFactory):
    """An open triage hold on a payment's message group."""

    class Meta:
        model = PaymentHold

    payment_id = factory.LazyFunction(_uuid)
    reason = "dead-lettered"


class ParkedMessageFactory(DjangoModelFactory):
    """A message parked behind its payment's hold."""

    class Meta:
        model = ParkedMessage

    hold = factory.SubFactory(PaymentHoldFactory)
    payment_id = factory.SelfAttribute("hold.payment_id")
    message_id = factory.LazyFunction(_uuid)
    body = factory.LazyFunction(dict)


# --- triage ----------------------------------------------------------------------------------


def _dead_body(o) -> dict:
    return {
        "kind": "processor_event",
        "payment_id": o.group_id,
        "event_type": "settled",
        "processor_event_id": o.event_id,
        "amount": str(o.payment.amount) if o.payment is not None else "125.00",
        "timestamp": "2026-11-02T12:00:00+00:00",
    }


class DeadLetterFactory(DjangoModelFactory):
    """A dead letter as ingestion stores it: a "settled" event the worker gave up on after six
    attempts (of ``payment`` if given, else of a payment id of its own), open.

    ``DeadLetterFactory.bulk(count)`` stores many in one insert per 2,000."""

    class Meta:
        model = DeadLetter

    class Params:
        payment = None
        event_id = factory.LazyFunction(_event_id)

    original_message_id = factory.LazyFunction(_uuid)
    dlq_message_id = factory.LazyFunction(_uuid)
    group_id = factory.LazyAttribute(
        lambda o: str(o.payment.id) if o.payment is not None else _uuid()
    )
    payment_id = factory.LazyAttribute(lambda o: uuid.UUID(o.group_id))
    kind = "processor_event"
    deduplication_id = factory.SelfAttribute("event_id")
    processor_event_id = factory.SelfAttribute("event_id")
    body = factory.LazyAttribute(_dead_body)
    source = DeadLetterSource.WORKER
    attempts = 6
    first_failed_at = factory.LazyFunction(timezone.now)
    last_failed_at = factory.SelfAttribute("first_failed_at")
    last_error_class = "payments.exceptions.InvalidTransition"
    last_error_message = "settled event cannot move payment from pending to confirmed"

    @classmethod
    def bulk(cls, count: int, **fields) -> list[DeadLetter]:
        rows = cls.build_batch(count, **fields)
        return DeadLetter.objects.bulk_create(rows, batch_size=2000)


class TriageActionFactory(DjangoModelFactory):
    """An operator's decision on a dead letter, as the audit log records it: resolved."""

    class Meta:
        model = TriageAction

    dead_letter = factory.SubFactory(DeadLetterFactory)
    action = "resolve"
    user = factory.SubFactory(UserFactory)
    note = "n"
    status_before = "open"
    status_after = "resolved"


class BulkTriageJobFactory(DjangoModelFactory):
    """A bulk job as its confirmation page creates it, before it has run."""

    class Meta:
        model = BulkTriageJob

    action = "discard"
    note = "n"
    user = factory.SubFactory(UserFactory)


class BulkTriageJobItemFactory(DjangoModelFactory):
    """A dead letter frozen into a bulk job's selection."""

    class Meta:
        model = BulkTriageJobItem

    job = factory.SubFactory(BulkTriageJobFactory)
    dead_letter = factory.SubFactory(DeadLetterFactory)
    position = factory.Sequence(lambda n: n)


class AlertFactory(DjangoModelFactory):
    """A firing alert."""

    class Meta:
        model = Alert

    key = factory.Sequence(lambda n: f"alert-{n}")
    severity = "high"
    summary = factory.SelfAttribute("key")


class AlertNotificationFactory(DjangoModelFactory):
    """An alert's notification, sent to the log."""

    class Meta:
        model = AlertNotification

    alert = factory.SubFactory(AlertFactory)
    kind = "fired"
    sink = "log"
    ok = True
