"""The processor's final states, read from its own list of events by when it made them, and a
settlement applied after the return it preceded: the payment follows the processor's history
and every invariant holds."""

from datetime import UTC, datetime, timedelta

import pytest

from chaos.invariants import check_invariants
from chaos.invariants.final_states import processor_final_states
from payments.models import LedgerEntry
from tests.chaos.histories import deliver, failed_checks, new_payment, totals_rebuild

T0 = datetime(2026, 12, 4, 3, 26, 18, tzinfo=UTC)


def _event(event_type: str, when: str, payment_id: str = "p-1") -> dict:
    return {"payment_id": payment_id, "event_type": event_type, "timestamp": when}


def test_a_settlement_listed_after_its_return_is_read_in_the_order_it_was_made():
    # A dropped settlement sits after the return in the list; its time is earlier.
    events = [
        _event("submitted", "2026-12-04T03:26:17.991102+00:00"),
        _event("returned", "2026-12-04T03:26:18.513516+00:00"),
        _event("settled", "2026-12-04T03:26:18.013247+00:00"),
    ]

    assert processor_final_states(events) == {"p-1": "returned"}


def test_timestamps_are_compared_as_times_not_text():
    # As text "03:26:18Z" sorts after "04:26:18.5+01:00"; as times it is the later one.
    events = [
        _event("submitted", "2026-12-04T03:26:17+00:00"),
        _event("settled", "2026-12-04T04:26:18.5+01:00"),
        _event("returned", "2026-12-04T03:26:19Z"),
    ]

    assert processor_final_states(events) == {"p-1": "returned"}


def test_a_return_made_before_the_settlement_fails_the_payment():
    events = [
        _event("submitted", "2026-12-04T03:26:17+00:00"),
        _event("returned", "2026-12-04T03:26:18+00:00"),
    ]

    assert processor_final_states(events) == {"p-1": "failed"}


@pytest.mark.parametrize("stamp", [None, "2026-12-04T03:26:18", 17])
def test_an_event_without_a_time_with_its_offset_is_refused(stamp):
    with pytest.raises(ValueError, match="timestamp"):
        processor_final_states([_event("settled", stamp)])


@pytest.mark.django_db
def test_a_settlement_applied_after_the_return_it_preceded_keeps_every_invariant(history):
    payment = new_payment("m-3", "9.99")
    deliver(history, payment, "submitted", timestamp=T0)
    deliver(history, payment, "returned", reason_code="R01", timestamp=T0 + timedelta(seconds=2))
    deliver(history, payment, "settled", timestamp=T0 + timedelta(seconds=1))
    history["stats"]["charges"][str(payment.idempotency_key)] = 1
    history["stats"]["charges_by_payment"][str(payment.id)] = 1
    history["stats"]["debits"] += 1
    history["stats"]["callbacks_sent"] = len(history["sent"])
    made = [
        _event("submitted", T0.isoformat(), str(payment.id)),
        _event("returned", (T0 + timedelta(seconds=2)).isoformat(), str(payment.id)),
        _event("settled", (T0 + timedelta(seconds=1)).isoformat(), str(payment.id)),
    ]

    totals_rebuild()
    report = check_invariants(
        sandbox_stats=history["stats"], callbacks_sent=history["sent"], processor_events=made
    )

    assert failed_checks(report) == set(), report.render()
    payment.refresh_from_db()
    assert payment.state == "returned"
    kinds = sorted(LedgerEntry.objects.filter(payment=payment).values_list("kind", flat=True))
    assert kinds == ["credit", "reversal"]
