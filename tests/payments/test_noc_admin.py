"""The admin of notifications of change: open ones by deadline, the operator's close with a
note and an audit row, the payment's NOCs and reinitiation chain, and the dashboard's count."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse
from django.utils import timezone

from payments.models import NocAction, NocStatus, NotificationOfChange, PaymentState
from payments.services import payment_apply_event, payment_reinitiate
from tests.factories import PaymentFactory, UserFactory, processor_event
from tests.triage.deadletters import viewer

pytestmark = pytest.mark.django_db


def _noc(*, days_ago: int = 0, token: str | None = None) -> NotificationOfChange:
    payment = PaymentFactory(
        state=PaymentState.CONFIRMED, **({"source_token": token} if token else {})
    )
    payment_apply_event(
        event=processor_event(
            payment,
            "notification_of_change",
            change_code="C02",
            corrected_data={"routing_number_last4": "0021"},
            timestamp=timezone.now() - timedelta(days=days_ago),
        )
    )
    return NotificationOfChange.objects.get(payment=payment)


def _staff(*codenames: str):
    user = UserFactory(is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="payments", codename__in=codenames)
    )
    return type(user).objects.get(pk=user.pk)


def test_the_list_shows_open_nocs_earliest_deadline_first_and_flags_the_overdue(client):
    later, overdue = _noc(days_ago=0), _noc(days_ago=30)
    client.force_login(_staff("view_notificationofchange"))
    response = client.get(
        reverse("admin:payments_notificationofchange_changelist"), {"status__exact": "open"}
    )
    assert response.status_code == 200
    assert [n.pk for n in response.context["cl"].result_list] == [overdue.pk, later.pk]
    page = response.content.decode()
    assert "past deadline" in page and "C02 Incorrect Routing Number" in page


def test_an_operator_with_the_right_marks_a_noc_applied_with_a_note_and_an_audit_row(client):
    noc = _noc(days_ago=30)
    operator = _staff("view_notificationofchange", "apply_noc")
    client.force_login(operator)
    url = reverse("admin:payments_notificationofchange_apply", args=[noc.pk])

    page = client.get(url)
    assert page.status_code == 200 and "Mark applied" in page.content.decode()
    # Without a note nothing changes.
    assert client.post(url, {"note": "  "}).status_code == 200
    noc.refresh_from_db()
    assert noc.status == NocStatus.OPEN

    response = client.post(url, {"note": "routing updated at the processor, OPS-7"})
    assert response.status_code == 302
    noc.refresh_from_db()
    assert (noc.status, noc.applied_by, noc.applied_note) == (
        NocStatus.APPLIED,
        operator,
        "routing updated at the processor, OPS-7",
    )
    assert NocAction.objects.get(noc=noc).user == operator

    # A second close is refused on the page, and writes no second audit row.
    again = client.post(url, {"note": "again"})
    assert again.status_code == 200 and "not open" in again.content.decode()
    assert NocAction.objects.filter(noc=noc).count() == 1


def test_marking_applied_needs_the_apply_right(client):
    noc = _noc()
    client.force_login(_staff("view_notificationofchange"))
    url = reverse("admin:payments_notificationofchange_apply", args=[noc.pk])
    assert client.post(url, {"note": "x"}).status_code == 403
    noc.refresh_from_db()
    assert noc.status == NocStatus.OPEN


def test_the_noc_change_page_is_read_only(client):
    noc = _noc()
    client.force_login(UserFactory(is_staff=True, is_superuser=True))
    url = reverse("admin:payments_notificationofchange_change", args=[noc.pk])
    page = client.get(url).content.decode()
    assert 'name="status"' not in page and "Mark applied" in page
    client.post(url, {"status": "applied"})
    noc.refresh_from_db()
    assert noc.status == NocStatus.OPEN


def test_the_payment_page_shows_its_nocs_and_its_reinitiation_chain(client):
    original = PaymentFactory(state=PaymentState.SUBMITTED)
    payment_apply_event(event=processor_event(original, "settled", timestamp=timezone.now()))
    payment_apply_event(
        event=processor_event(original, "returned", reason_code="R01", timestamp=timezone.now())
    )
    again = payment_reinitiate(payment_id=original.id)
    client.force_login(UserFactory(is_staff=True, is_superuser=True))
    page = client.get(reverse("admin:payments_payment_change", args=[again.pk])).content.decode()
    assert "reinitiation 1" in page and "original" in page
    assert str(original.pk) in page and "(this payment)" in page


def test_the_dashboard_counts_nocs_due_in_the_next_two_banking_days(client):
    noc = _noc()
    NotificationOfChange.objects.filter(pk=noc.pk).update(
        deadline=timezone.now() + timedelta(hours=1)
    )
    _noc(days_ago=30)
    client.force_login(viewer())
    response = client.get(reverse("admin:triage_triagedashboard_changelist"))
    assert response.status_code == 200
    assert response.context["nocs"] == {"due_soon": 1, "overdue": 1, "open": 2}
    page = response.content.decode()
    assert '<td id="nocs-due-soon">1</td>' in page
