import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import factory
from django.contrib.auth import get_user_model
from django.db.models.functions import Now
from factory.django import DjangoModelFactory

from payments.events import ProcessorEvent
from payments.models import BreakerState, CircuitBreaker, MerchantAccess, Payment
from payments.processor.breaker import PROCESSOR, processor_breaker_get


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


class PaymentFactory(DjangoModelFactory):
    class Meta:
        model = Payment

    merchant_id = factory.Sequence(lambda n: f"merchant-{n % 5}")
    amount = Decimal("125.00")
    currency = "USD"
    source_token = factory.Sequence(lambda n: f"tok_bank_{n:04d}abc")


def processor_event(payment: Payment, event_type: str, **overrides) -> ProcessorEvent:
    fields = {
        "payment_id": payment.id,
        "event_type": event_type,
        "processor_event_id": f"evt_{uuid.uuid4().hex}",
        "amount": payment.amount,
        "timestamp": datetime(2026, 11, 2, 12, 0, tzinfo=UTC),
    }
    fields.update(overrides)
    return ProcessorEvent(**fields)


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
