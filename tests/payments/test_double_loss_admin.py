"""A double loss in front of a person: on its payment's admin page with the refunds, in its own
list, and closed with a note (recovered posts the recovery owed, written off archives it) only
by someone allowed to."""

from decimal import Decimal

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse

from payments.models import (
    DoubleLoss,
    DoubleLossStatus,
    LedgerEntry,
    LedgerEntryKind,
    LedgerEntryStatus,
    Payment,
    PaymentState,
)
from payments.services import payment_apply_event
from payments.services.refunds import refund_create
from tests.factories import PaymentFactory, UserFactory, processor_event

pytestmark = pytest.mark.django_db


@pytest.fixture
def loss() -> DoubleLoss:
    debit = PaymentFactory(state=PaymentState.CONFIRMED, amount=Decimal("90.00"))
    refund = refund_create(payment_id=debit.id, amount=Decimal("90.00"), reason="full refund")
    Payment.objects.filter(pk=refund.pk).update(state=PaymentState.CONFIRMED)
    payment_apply_event(event=processor_event(debit, "returned", reason_code="R10"))
    return DoubleLoss.objects.get()


def _staff(*perms: str):
    user = UserFactory(is_staff=True)
    for perm in ("view_payment", "view_doubleloss", *perms):
        user.user_permissions.add(Permission.objects.get(codename=perm))
    return user


def test_the_payment_page_shows_its_refunds_and_its_double_loss(client, loss):
    client.force_login(_staff())
    page = client.get(reverse("admin:payments_payment_change", args=[loss.payment_id]))
    text = page.content.decode()
    assert page.status_code == 200
    assert str(loss.refund_id) in text and "full refund" in text
    assert "Open (to recover)" in text


def test_closing_needs_the_right_and_a_note(client, loss):
    url = reverse("admin:payments_doubleloss_resolve", args=[loss.pk])
    client.force_login(_staff())
    assert client.post(url, {"status": "recovered", "note": "paid back"}).status_code == 403

    client.force_login(_staff("resolve_double_loss"))
    blank = client.post(url, {"status": "recovered", "note": "   "})
    assert blank.status_code == 200 and "This field is required" in blank.content.decode()
    loss.refresh_from_db()
    assert loss.status == DoubleLossStatus.OPEN


@pytest.mark.parametrize(
    ("status", "entry_status"),
    [("recovered", LedgerEntryStatus.POSTED), ("written_off", LedgerEntryStatus.ARCHIVED)],
)
def test_closing_books_the_recovery_owed_by_the_outcome(client, loss, status, entry_status):
    client.force_login(_staff("resolve_double_loss"))
    url = reverse("admin:payments_doubleloss_resolve", args=[loss.pk])

    response = client.post(url, {"status": status, "note": "ticket OPS-12"})

    assert response.status_code == 302
    loss.refresh_from_db()
    assert (loss.status, loss.note) == (status, "ticket OPS-12")
    owed = LedgerEntry.objects.get(payment_id=loss.refund_id, kind=LedgerEntryKind.RECOVERY_OWED)
    assert owed.status == entry_status
    again = client.post(url, {"status": status, "note": "again"})
    assert again.status_code == 200 and "is " + status in again.content.decode()
