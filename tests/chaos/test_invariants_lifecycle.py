"""Notifications of change and reinitiation chains: a clean history passes, and each corruption
fails the one check that names it."""

import uuid

import pytest
from django.utils import timezone

from payments.models import NotificationOfChange, Payment, PaymentEvent
from payments.services import payment_reinitiate
from tests.chaos.histories import check, deliver, failed_checks, new_payment, redeliver

pytestmark = pytest.mark.django_db

NOC = {"change_code": "C01", "corrected_data": {"account_number_last4": "6789"}}


@pytest.fixture
def lifecycle(history):
    """The clean history, plus a returned payment reinitiated and a NOC delivered twice."""
    original = new_payment("m-1", "5.00")
    deliver(history, original, "submitted")
    deliver(history, original, "settled", timestamp=timezone.now())
    deliver(history, original, "returned", reason_code="R01", timestamp=timezone.now())
    again = payment_reinitiate(payment_id=original.id)

    noticed = new_payment("m-1", "3.00")
    deliver(history, noticed, "submitted")
    deliver(history, noticed, "settled")
    when = timezone.now()
    event_id = deliver(history, noticed, "notification_of_change", timestamp=when, **NOC)
    redeliver(history, noticed, "notification_of_change", event_id, timestamp=when, **NOC)
    history["payments"].update(noticed=noticed, original=original, again=again)
    history["noc_event"] = event_id
    return history


def test_a_clean_lifecycle_passes_both_checks(lifecycle):
    report = check(lifecycle)
    assert not failed_checks(report) & {"nocs_recorded_once", "reinitiations_within_limits"}
    assert report.checked["nocs_recorded_once"] == {
        "NOCs": 1,
        "NOC events recorded": 1,
        "NOCs of prenotes": 0,
    }
    assert report.checked["reinitiations_within_limits"] == {"chains": 1, "reinitiations": 1}
    assert failed_checks(check(lifecycle)) == failed_checks(report)


def test_a_recorded_noc_event_without_its_noc_fails_nocs_recorded_once(lifecycle):
    before = failed_checks(check(lifecycle))
    NotificationOfChange.objects.all().delete()
    report = check(lifecycle)
    assert failed_checks(report) - before == {"nocs_recorded_once"}
    [violation] = report.violations_of("nocs_recorded_once")
    assert violation.ids == (lifecycle["noc_event"],)


def test_a_noc_without_its_event_fails_nocs_recorded_once(lifecycle):
    before = failed_checks(check(lifecycle))
    noc = NotificationOfChange.objects.get()
    noc.pk, noc.processor_event_id = None, f"evt_{uuid.uuid4().hex}"
    noc.save()
    report = check(lifecycle)
    assert failed_checks(report) - before == {"nocs_recorded_once"}
    assert any(
        "without a recorded event" in v.detail for v in report.violations_of("nocs_recorded_once")
    )


def test_a_prenotes_noc_needs_no_payment_event_and_is_counted_apart(lifecycle):
    from payments.models import AccountValidation
    from payments.services.nocs import noc_record_of_prenote

    before = failed_checks(check(lifecycle))
    validation = AccountValidation.objects.create(account_token="vtok_chaos_01", merchant_id="m-1")
    noc_record_of_prenote(
        validation=validation,
        processor_event_id="ach.021000020000001.C01",
        change_code="C01",
        corrected_data={},
        received_at=timezone.now(),
    )
    report = check(lifecycle)
    assert failed_checks(report) == before
    assert report.checked["nocs_recorded_once"]["NOCs of prenotes"] == 1
    assert report.checked["nocs_recorded_once"]["NOCs"] == 1


def test_a_noc_row_that_moved_a_state_fails_nocs_recorded_once(lifecycle):
    PaymentEvent.objects.filter(event_type="notification_of_change", outcome="recorded").update(
        from_state="submitted"
    )
    report = check(lifecycle)
    assert "nocs_recorded_once" in failed_checks(report)
    assert any("moved a state" in v.detail for v in report.violations_of("nocs_recorded_once"))


def test_a_reinitiation_for_another_amount_fails_reinitiations_within_limits(lifecycle):
    before = failed_checks(check(lifecycle))
    Payment.objects.filter(pk=lifecycle["payments"]["again"].pk).update(amount="6.00")
    report = check(lifecycle)
    assert failed_checks(report) - before == {"reinitiations_within_limits"}
    [violation] = report.violations_of("reinitiations_within_limits")
    assert violation.ids == (str(lifecycle["payments"]["again"].pk),)


def test_a_second_reinitiation_without_a_first_fails_reinitiations_within_limits(lifecycle):
    before = failed_checks(check(lifecycle))
    Payment.objects.filter(pk=lifecycle["payments"]["again"].pk).update(reinitiation_number=2)
    report = check(lifecycle)
    assert failed_checks(report) - before == {"reinitiations_within_limits"}


def test_a_reinitiation_of_an_entry_that_never_came_back_fails(lifecycle):
    before = failed_checks(check(lifecycle))
    original = lifecycle["payments"]["original"]
    original.ach_return.delete()
    report = check(lifecycle)
    assert "reinitiations_within_limits" in failed_checks(report) - before
    assert any("came back" in v.detail for v in report.violations_of("reinitiations_within_limits"))
