import logging
import uuid

import pytest

from payments.alerts import alert_raise
from payments.signals import alert_raised

# Other apps' receivers (alert history) may write to the database.
pytestmark = pytest.mark.django_db


def alert_records(caplog):
    return [r for r in caplog.records if r.name == "payments.alerts" and r.msg.startswith("ALERT")]


@pytest.fixture
def received():
    calls = []

    def receiver(sender, **kwargs):
        calls.append(kwargs)

    alert_raised.connect(receiver, weak=False)
    yield calls
    alert_raised.disconnect(receiver)


@pytest.mark.parametrize(("severity", "level"), [("high", "ERROR"), ("medium", "ERROR")])
def test_high_and_medium_alerts_log_at_error_with_the_payment_id(caplog, severity, level):
    payment_id = uuid.uuid4()

    with caplog.at_level(logging.INFO, logger="payments.alerts"):
        alert_raise(severity=severity, key="k", summary="it broke", payment_id=payment_id)

    [record] = alert_records(caplog)
    assert record.levelname == level
    assert record.payment_id == str(payment_id)
    assert record.alert_key == "k"
    assert "it broke" in record.getMessage()


def test_low_alert_logs_at_warning(caplog):
    with caplog.at_level(logging.INFO, logger="payments.alerts"):
        alert_raise(severity="low", key="k", summary="minor")

    [record] = alert_records(caplog)
    assert record.levelname == "WARNING"
    assert record.payment_id is None


def test_alert_sends_the_signal_with_its_arguments(received):
    payment_id = uuid.uuid4()

    alert_raise(
        severity="medium", key="payment.x", summary="s", details={"a": 1}, payment_id=payment_id
    )

    assert received == [
        {
            "signal": alert_raised,
            "severity": "medium",
            "key": "payment.x",
            "summary": "s",
            "details": {"a": 1},
            "payment_id": str(payment_id),
        }
    ]


def test_unknown_severity_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match="high, medium, low"):
        alert_raise(severity="critical", key="k", summary="s")


def test_a_failing_receiver_is_logged_and_does_not_stop_the_others(caplog, received):
    def broken(sender, **kwargs):
        raise RuntimeError("sink down")

    alert_raised.connect(broken, weak=False)
    try:
        with caplog.at_level(logging.ERROR, logger="payments.alerts"):
            alert_raise(severity="high", key="k", summary="s")
    finally:
        alert_raised.disconnect(broken)

    assert len(received) == 1
    assert any("sink down" in r.getMessage() for r in caplog.records)


def test_a_key_within_its_column_is_kept_as_it_is():
    from payments.alerts import ALERT_KEY_MAX, alert_key_bounded

    key = "k" * ALERT_KEY_MAX

    assert alert_key_bounded(key) == key


def test_a_long_key_is_bounded_with_a_hash_and_two_long_keys_stay_two():
    from payments.alerts import ALERT_KEY_MAX, alert_key_bounded

    first, second = "k" * 300 + "a", "k" * 300 + "b"

    bounded = alert_key_bounded(first)

    assert len(bounded) == ALERT_KEY_MAX and bounded.startswith("k" * 200)
    assert bounded != alert_key_bounded(second)
    assert alert_key_bounded(first) == bounded  # the same alert every time


def test_an_alert_raised_with_a_long_key_is_stored_under_the_bounded_key_with_the_whole_one(
    received, django_capture_on_commit_callbacks
):
    from payments.alerts import ALERT_KEY_MAX
    from triage.models import Alert

    key = "books.statement_refused:" + "\u00e9" * 400

    with django_capture_on_commit_callbacks(execute=True):
        alert_raise(severity="high", key=key, summary="refused", details={"file": "x"})

    stored = Alert.objects.get()
    assert len(stored.key) == ALERT_KEY_MAX and received[0]["key"] == stored.key
    assert stored.details["file"] == "x" and stored.details["key"] == key
