"""Properties of the callback edge, on the real endpoint (signed), the local SQS and the worker.

A signed callback, however hostile its body, is refused with 4xx or accounted for after the
worker drains: never 202 and then nothing. And an accepted event's money fields are compared
with the payment's: only a matching event is applied or recorded, a mismatch reaches a human."""

import json
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from callbacks.models import ParkedMessage, ProcessingError, QueueMessage, QueueMessageStatus
from callbacks.serializers import PROCESSOR_EVENT_ID_RE, ProcessorEventSerializer
from payments.catalogue import event_type_names
from payments.models import LedgerEntry, PaymentEvent, PaymentState
from tests.callbacks.accounting import unaccounted
from tests.callbacks.test_endpoint import post
from tests.callbacks.worker_support import drain, run_worker
from tests.factories import PaymentFactory

SPECIAL = ["\x00", "\ud800", "\udfff", "\u2028", "\ufeff", "\U0001f4b8", "é", '"', "\\"]
text = st.lists(st.one_of(st.text(max_size=8), st.sampled_from(SPECIAL)), max_size=4).map("".join)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    text,
)
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(text, children, max_size=3),
    max_leaves=8,
)
offsets = st.integers(min_value=-23 * 60, max_value=23 * 60).map(
    lambda minutes: timezone(timedelta(minutes=minutes))
)
# Whole calendar, any offset: the ends of it do not exist in UTC.
timestamps = st.builds(
    lambda moment, tz: moment.replace(tzinfo=tz).isoformat(),
    st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31, 23, 59, 59)),
    offsets,
)
FIELDS = ["payment_id", "event_type", "processor_event_id", "amount", "timestamp"]
OPTIONAL = ["reason_code", "message", "note", "kind", "event", "redrive", "dead_letter"]


@st.composite
def hostile_bodies(draw, payments) -> bytes:
    payment = draw(st.sampled_from(payments))
    body = {
        "payment_id": str(payment.id),
        "event_type": draw(st.sampled_from(event_type_names())),
        "processor_event_id": draw(st.from_regex(PROCESSOR_EVENT_ID_RE, fullmatch=True)),
        "amount": f"{payment.amount:.2f}",
        "timestamp": draw(timestamps),
    }
    body.update(draw(st.dictionaries(st.sampled_from(FIELDS + OPTIONAL), json_values, max_size=3)))
    depth = draw(st.integers(min_value=0, max_value=50))
    if depth:
        nested: list = []
        for _ in range(depth):
            nested = [nested]
        body["deep"] = nested
    encoding = draw(st.sampled_from(["ascii", "utf-8"]))
    raw = json.dumps(body, ensure_ascii=encoding == "ascii", allow_nan=True)
    # Lone surrogates written raw make bytes that are not UTF-8: the edge must say so.
    return raw.encode("utf-8", errors="surrogatepass")


@pytest.mark.django_db(transaction=True)
def test_every_signed_callback_is_refused_or_accounted_for(sqs_queues, module_settings):
    module_settings.WORKER_BACKOFF_BASE_SECONDS = (
        0  # retries of invalid transitions come back at once
    )
    # Several payments in several states, so one dead letter (and its hold) does not turn
    # every later event into a parked one.
    payments = [
        PaymentFactory(state=state)
        for state in [PaymentState.SUBMITTED] * 6 + [PaymentState.PENDING, PaymentState.CONFIRMED]
    ]
    accepted: list[str] = []

    @hypothesis_settings(
        max_examples=120,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(raw=hostile_bodies(payments))
    def post_one(raw: bytes) -> None:
        response = post(raw)
        assert response.status_code == 202 or 400 <= response.status_code < 500, (
            response.status_code,
            raw[:300],
        )
        if response.status_code == 202:
            accepted.append(response.json()["processor_event_id"])
        else:
            assert response.json()  # a 4xx names the problem

    post_one()
    run_worker()

    assert accepted, "no example was accepted: the property would hold vacuously"
    assert drain(sqs_queues.client, sqs_queues.url) == []
    assert unaccounted(accepted) == []


# --- Money fields --------------------------------------------------------------------------

# What a human must see: the event's money disagrees with the payment's. The callback contract
# names ``currency`` only once it is compared; until then it is an extra field and not checked.
HUMAN_STATUSES = (QueueMessageStatus.DEAD_LETTERED, QueueMessageStatus.PARKED)
RECORDED_OUTCOMES = ("applied", "recorded", "stale", "duplicate")


def currency_is_compared() -> bool:
    return "currency" in ProcessorEventSerializer().fields


@st.composite
def money_bodies(draw, payments) -> tuple[dict, object]:
    """A well-formed event for one of the payments, its money fields right or wrong."""
    payment = draw(st.sampled_from(payments))
    # Mostly right, so events get applied before a mismatch puts the payment on hold.
    wrong = st.one_of(
        st.sampled_from([Decimal("0.01"), payment.amount + Decimal("0.01")]),
        st.decimals(min_value=Decimal("0.01"), max_value=Decimal("99999.99"), places=2),
    )
    amount = draw(st.one_of(*[st.just(payment.amount)] * 3, wrong))
    body = {
        "payment_id": str(payment.id),
        "event_type": draw(st.sampled_from(["submitted", "settled", "failed", "returned"])),
        # A few ids, so resends of one id (same or other money) happen.
        "processor_event_id": draw(st.sampled_from([f"evt_{i}" for i in range(12)]))
        + f"_{payment.id.hex[:8]}",
        "amount": f"{amount:.2f}",
        "timestamp": "2026-11-02T12:00:00+00:00",
    }
    currency = draw(st.sampled_from([None, None, None, "USD", "EUR"]))
    if currency is not None:
        body["currency"] = currency
    if body["event_type"] == "returned":
        body["reason_code"] = draw(st.sampled_from(["R01", "R10"]))
    return body, payment


def _money_agrees(body: dict, payment) -> bool:
    if Decimal(body["amount"]) != payment.amount:
        return False
    if currency_is_compared() and body.get("currency", payment.currency) != payment.currency:
        return False
    return True


def _before_a_human(body: dict) -> bool:
    """The message carrying exactly this body was dead-lettered with an error row, or parked."""
    event_id, amount = body["processor_event_id"], body["amount"]
    for message in QueueMessage.objects.filter(
        body__event__processor_event_id=event_id,
        body__event__amount=amount,
        status__in=HUMAN_STATUSES,
    ):
        if message.status == QueueMessageStatus.PARKED or (
            ProcessingError.objects.filter(message_id=message.message_id).exists()
        ):
            return True
    return ParkedMessage.objects.filter(
        body__event__processor_event_id=event_id, body__event__amount=amount
    ).exists()


@pytest.mark.django_db(transaction=True)
def test_every_accepted_event_is_applied_recorded_or_shown_with_its_money_compared(
    sqs_queues, module_settings
):
    """For any body answered 202: once the worker drains, the event was applied, or recorded as
    stale or a duplicate, only if its money matches the payment's; an event whose money does
    not match is in front of a human (dead letter with an error, or parked), never credited."""
    module_settings.WORKER_BACKOFF_BASE_SECONDS = 0
    module_settings.WORKER_BACKOFF_CAP_SECONDS = 0
    # Many payments: a mismatch holds its payment, and later events of it are parked.
    payments = [
        PaymentFactory(state=state, amount=Decimal(amount))
        for state, amount in [(PaymentState.SUBMITTED, f"{10 + i}.{i:02d}") for i in range(10)]
        + [(PaymentState.PENDING, "10.00"), (PaymentState.CONFIRMED, "310.20")]
    ]
    accepted: list[tuple[dict, object]] = []

    @hypothesis_settings(
        max_examples=60,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(drawn=money_bodies(payments))
    def post_one(drawn) -> None:
        body, payment = drawn
        response = post(json.dumps(body).encode())
        assert response.status_code in (202, 400), (response.status_code, response.content)
        if response.status_code == 202:
            accepted.append((body, payment))

    post_one()
    run_worker()

    assert drain(sqs_queues.client, sqs_queues.url) == []
    assert any(not _money_agrees(b, p) for b, p in accepted), "no mismatch was tried"
    assert any(_money_agrees(b, p) for b, p in accepted), "no matching event was tried"
    assert unaccounted([b["processor_event_id"] for b, _ in accepted]) == []
    for body, payment in accepted:
        if not _money_agrees(body, payment):
            assert _before_a_human(body), f"mismatch not in front of a human: {body}"
    # Whatever was recorded against a payment (applied, stale, duplicate) carried its money.
    for payment in payments:
        payment.refresh_from_db()
        for event in PaymentEvent.objects.filter(
            payment=payment, kind="processor_event", outcome__in=RECORDED_OUTCOMES
        ):
            assert Decimal(event.payload["amount"]) == payment.amount, event.payload
            if currency_is_compared():
                assert event.payload.get("currency", payment.currency) == payment.currency
        # A credit, and a return's reversal (negative), each for the payment's money only.
        for entry in LedgerEntry.objects.filter(payment=payment):
            assert (abs(entry.amount), entry.currency) == (payment.amount, payment.currency)
