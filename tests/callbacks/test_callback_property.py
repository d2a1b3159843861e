"""Property: a signed callback, however hostile its body, is refused with 4xx or accounted for
after the worker drains. Never 202 and then nothing."""

import json
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from callbacks.serializers import PROCESSOR_EVENT_ID_RE
from payments.events import EVENT_TYPES
from payments.models import PaymentState
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
        "event_type": draw(st.sampled_from(EVENT_TYPES)),
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
def test_every_signed_callback_is_refused_or_accounted_for(sqs_queues, settings):
    settings.WORKER_BACKOFF_BASE_SECONDS = 0  # retries of invalid transitions come back at once
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
