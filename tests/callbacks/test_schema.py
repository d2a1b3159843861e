import uuid
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal

import pytest

from callbacks.schema import (
    InvalidMessage,
    parse_processor_event,
    processor_event_from_message,
    processor_event_message,
)

PAYMENT_ID = "7f1d3a52-4a3e-4c47-9d55-2b3f0b0c6e11"


def valid_body(**overrides) -> dict:
    body = {
        "payment_id": PAYMENT_ID,
        "event_type": "settled",
        "processor_event_id": "evt_01.A:b-c",
        "amount": "125.00",
        "timestamp": "2026-11-02T12:00:00+00:00",
    }
    body.update(overrides)
    return {k: v for k, v in body.items() if v is not ...}


def errors_of(body) -> dict[str, list[str]]:
    with pytest.raises(InvalidMessage) as info:
        parse_processor_event(body)
    return info.value.errors


def test_valid_body_is_parsed_into_typed_fields():
    event = parse_processor_event(valid_body(reason_code="R01", message="insufficient funds"))
    assert event.payment_id == uuid.UUID(PAYMENT_ID)
    assert event.event_type == "settled"
    assert event.processor_event_id == "evt_01.A:b-c"
    assert event.amount == Decimal("125.00")
    assert event.timestamp == datetime(2026, 11, 2, 12, 0, tzinfo=UTC)
    assert event.reason_code == "R01"
    assert event.message == "insufficient funds"


def test_optional_fields_default_to_empty_strings():
    event = parse_processor_event(valid_body())
    assert event.reason_code == ""
    assert event.message == ""


def test_null_optional_fields_are_treated_as_absent():
    event = parse_processor_event(valid_body(reason_code=None, message=None))
    assert (event.reason_code, event.message) == ("", "")


def test_unknown_fields_are_ignored_but_kept_in_raw():
    event = parse_processor_event(valid_body(processor_account="acme", attempt=3))
    assert event.raw["processor_account"] == "acme"
    assert event.raw["attempt"] == 3


@pytest.mark.parametrize("event_type", ["submitted", "settled", "failed", "returned"])
def test_every_event_type_of_the_contract_is_accepted(event_type):
    assert parse_processor_event(valid_body(event_type=event_type)).event_type == event_type


@pytest.mark.parametrize(
    "timestamp, expected",
    [
        ("2026-11-02T12:00:00Z", datetime(2026, 11, 2, 12, 0, tzinfo=UTC)),
        ("2026-11-02T07:00:00-05:00", datetime(2026, 11, 2, 12, 0, tzinfo=UTC)),
        ("2026-11-02T12:00:00.250+0000", datetime(2026, 11, 2, 12, 0, 0, 250000, tzinfo=UTC)),
    ],
)
def test_timestamps_with_any_offset_form_are_accepted(timestamp, expected):
    assert parse_processor_event(valid_body(timestamp=timestamp)).timestamp == expected


def test_a_body_that_is_not_an_object_is_rejected():
    assert "non_field_errors" in errors_of(["not", "an", "object"])


def test_every_missing_required_field_is_named():
    errors = errors_of({})
    assert set(errors) == {"payment_id", "event_type", "processor_event_id", "amount", "timestamp"}
    assert all(msgs == ["This field is required."] for msgs in errors.values())


def test_every_bad_field_is_named_at_once():
    errors = errors_of(valid_body(payment_id="nope", amount="1", timestamp="yesterday"))
    assert set(errors) == {"payment_id", "amount", "timestamp"}


@pytest.mark.parametrize(
    "field, value",
    [
        ("payment_id", "not-a-uuid"),
        ("payment_id", 12345),
        ("event_type", "refunded"),
        ("event_type", "SETTLED"),
        ("processor_event_id", ""),
        ("processor_event_id", "x" * 129),
        ("processor_event_id", "evt 1"),
        ("processor_event_id", "evt/1"),
        ("processor_event_id", "évt1"),
        ("amount", 125.0),
        ("amount", "125"),
        ("amount", "125.0"),
        ("amount", "125.000"),
        ("amount", "-125.00"),
        ("amount", "+125.00"),
        ("amount", "0.00"),
        ("amount", "1e2"),
        ("amount", "0125.00"),
        ("amount", "1000000000000.00"),
        ("amount", "١٢٥.00"),
        ("timestamp", "2026-11-02T12:00:00"),
        ("timestamp", "2026-11-02"),
        ("timestamp", "20261102T120000Z"),
        ("timestamp", "2026-13-02T12:00:00Z"),
        ("timestamp", 1793620800),
        ("reason_code", "R" * 65),
        ("reason_code", 1),
        ("message", "m" * 1001),
        ("message", {"text": "x"}),
    ],
)
def test_a_bad_field_is_rejected_and_named(field, value):
    errors = errors_of(valid_body(**{field: value}))
    assert list(errors) == [field]
    assert errors[field][0]


def test_the_longest_allowed_values_are_accepted():
    event = parse_processor_event(
        valid_body(
            processor_event_id="e" * 128,
            amount="999999999999.99",
            reason_code="R" * 64,
            message="m" * 1000,
        )
    )
    assert len(event.processor_event_id) == 128
    assert event.amount == Decimal("999999999999.99")


def test_invalid_message_str_names_the_fields():
    with pytest.raises(InvalidMessage, match="amount"):
        parse_processor_event(valid_body(amount="abc"))


def test_queue_message_is_an_envelope_with_the_event_nested_as_strings():
    event = parse_processor_event(valid_body(reason_code="R01"))
    received = datetime(2026, 11, 2, 12, 0, 5, tzinfo=UTC)
    body = processor_event_message(event, received_at=received)
    assert body == {
        "kind": "processor_event",
        "event": {
            "payment_id": PAYMENT_ID,
            "event_type": "settled",
            "processor_event_id": "evt_01.A:b-c",
            "amount": "125.00",
            "timestamp": "2026-11-02T12:00:00+00:00",
            "reason_code": "R01",
            "message": "",
        },
        "received_at": "2026-11-02T12:00:05+00:00",
    }


def test_queue_message_parses_back_to_the_same_event():
    event = parse_processor_event(
        valid_body(timestamp="2026-11-02T07:00:00-05:00", message="late", extra_field="kept")
    )
    back = processor_event_from_message(processor_event_message(event))
    assert back == event
    assert back.fingerprint == event.fingerprint
    assert back.raw["extra_field"] == "kept"
    assert "kind" not in back.raw


def test_queue_message_received_at_defaults_to_now():
    body = processor_event_message(parse_processor_event(valid_body()))
    received = datetime.fromisoformat(body["received_at"])
    assert received.tzinfo is not None
    assert abs(datetime.now(UTC) - received) < timedelta(seconds=5)


def test_queue_message_fields_beyond_the_contract_stay_inside_the_nested_event():
    event = parse_processor_event(
        valid_body(kind="submit_payment", redrive={"original_message_id": "m"}, dead_letter={})
    )
    body = processor_event_message(event)
    assert set(body) == {"kind", "event", "received_at"}
    assert body["kind"] == "processor_event"
    assert body["event"]["redrive"] == {"original_message_id": "m"}


def test_a_flat_message_is_not_taken_for_an_envelope():
    with pytest.raises(InvalidMessage, match="event"):
        processor_event_from_message({"kind": "processor_event", **valid_body()})


def test_offset_is_kept_in_the_queue_message():
    event = parse_processor_event(valid_body(timestamp="2026-11-02T17:30:00+05:30"))
    body = processor_event_message(event)["event"]
    assert datetime.fromisoformat(body["timestamp"]).utcoffset() == timedelta(hours=5, minutes=30)
    assert event.timestamp.tzinfo == timezone(timedelta(hours=5, minutes=30))


@pytest.mark.parametrize("timestamp", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"])
def test_a_timestamp_outside_the_utc_calendar_is_rejected_and_named(timestamp):
    errors = errors_of(valid_body(timestamp=timestamp))
    assert list(errors) == ["timestamp"]
    assert "UTC" in errors["timestamp"][0]
