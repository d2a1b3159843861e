"""Every happening a merchant is told of writes its event in the transaction of what it reports:
a payment, refund or payout made; a review decision; a NOC received and applied; a dishonor
and its contest; a double loss opened and closed. The event rolls back with its cause, carries
its object's id and kind, and never the bank details or an operator's note."""

from decimal import Decimal

import pytest
from django.contrib.auth.models import Permission
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction

from payments.models import DoubleLoss, NotificationOfChange, Payment, PaymentState
from payments.services import payment_apply_event, payment_create
from payments.services.nocs import noc_mark_applied
from payments.services.payouts import payout_create
from payments.services.refunds import double_loss_resolve, refund_create
from payments.services.review import payment_review_approve, payment_review_reject
from payments.webhooks.catalogue import EVENT_TYPES
from payments.webhooks.events import event_record
from payments.webhooks.models import Event
from payments.webhooks.services import endpoint_fields_checked
from tests.factories import PaymentFactory, UserFactory, processor_event

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("event_write_path")]

TOKEN = "tok_webhook_src_0001"


def events_of(object_id) -> list[tuple[str, dict]]:
    rows = Event.objects.filter(object_id=str(object_id)).order_by("created_at", "id")
    return [(row.type, row.data["object"]) for row in rows]


def types_of(object_id) -> list[str]:
    return [kind for kind, _ in events_of(object_id)]


def reviewer():
    user = UserFactory(is_staff=True, username="reviewer")
    user.user_permissions.add(Permission.objects.get(codename="review_payment"))
    return type(user).objects.get(pk=user.pk)


def returned_after_settlement(merchant_id: str = "m-src") -> Payment:
    debit = PaymentFactory(state=PaymentState.SUBMITTED, merchant_id=merchant_id)
    payment_apply_event(event=processor_event(debit, "settled"))
    payment_apply_event(event=processor_event(debit, "returned", reason_code="R01"))
    return debit


def test_a_payment_made_writes_payment_created_in_the_api_shape():
    payment = payment_create(merchant_id="m-src", amount=Decimal("12.34"), source_token=TOKEN)
    [(kind, obj)] = events_of(payment.id)
    assert kind == "payment.created"
    assert (obj["id"], obj["object"], obj["state"], obj["amount"]) == (
        str(payment.id),
        "payment",
        "pending",
        "12.34",
    )
    assert TOKEN not in str(obj)


def test_a_create_that_rolls_back_leaves_no_event():
    with pytest.raises(RuntimeError), transaction.atomic():
        payment_create(merchant_id="m-src", amount=Decimal("1.00"), source_token=TOKEN)
        raise RuntimeError("the caller's transaction fails after the create")
    assert not Event.objects.exists() and not Payment.objects.exists()


def test_a_refund_and_a_payout_made_write_their_created_events(module_settings):
    module_settings.AVAILABLE_AFTER_BANKING_DAYS = 0
    debit = PaymentFactory(state=PaymentState.SUBMITTED, merchant_id="m-src")
    payment_apply_event(event=processor_event(debit, "settled"))
    refund = refund_create(payment_id=debit.id, amount=Decimal("5.00"))
    payout = payout_create(merchant_id="m-src", amount=Decimal("7.00"), destination_token=TOKEN)
    assert events_of(refund.id)[0][0] == "refund.created"
    assert events_of(refund.id)[0][1]["payment_id"] == str(debit.id)
    assert [(k, o["object"]) for k, o in events_of(payout.id)] == [("payout.created", "payout")]


def test_each_state_of_a_refund_writes_its_event():
    refund = refund_create(
        payment_id=PaymentFactory(state=PaymentState.CONFIRMED).id, amount=Decimal("5.00")
    )
    Payment.objects.filter(pk=refund.pk).update(state=PaymentState.SUBMITTED)
    payment_apply_event(event=processor_event(refund, "settled", direction="credit"))
    assert types_of(refund.id) == ["refund.created", "refund.confirmed"]


@pytest.fixture
def held(module_settings):
    module_settings.OVER_LIMIT = "hold"
    module_settings.EXPOSURE_LIMITS = {"USD": {"debit": {"single": "10.00"}}}
    payment = payment_create(merchant_id="m-src", amount=Decimal("20.00"), source_token=TOKEN)
    assert payment.review_status == "held"
    return payment


def test_an_approval_writes_review_approved_with_the_reason_and_never_the_note(held):
    payment_review_approve(payment_id=held.id, user=reviewer(), note="known customer, OPS-9")
    assert types_of(held.id) == ["payment.created", "payment.review_approved"]
    event = Event.objects.get(type="payment.review_approved")
    assert event.data["review_reason"] == held.review_reason and event.data["review_reason"]
    assert "OPS-9" not in str(event.data)


def test_a_rejection_writes_the_cancel_and_review_rejected(held):
    payment_review_reject(payment_id=held.id, user=reviewer(), note="fraud ring")
    assert types_of(held.id) == ["payment.created", "payment.canceled", "payment.review_rejected"]
    assert Event.objects.get(type="payment.review_rejected").data["object"]["state"] == "canceled"


def test_a_noc_received_and_applied_writes_both_without_the_corrected_data():
    payment = PaymentFactory(state=PaymentState.CONFIRMED, merchant_id="m-src")
    payment_apply_event(
        event=processor_event(
            payment,
            "notification_of_change",
            change_code="C01",
            corrected_data={"account_number_last4": "6789"},
        )
    )
    noc = NotificationOfChange.objects.get()
    noc_mark_applied(noc_id=noc.id, user=UserFactory(), note="token updated")

    [(received, first), (applied, second)] = events_of(payment.id)
    assert (received, applied) == ("noc.received", "noc.applied")
    assert first["id"] == str(noc.id) and first["object"] == "notification_of_change"
    assert (first["status"], second["status"], first["change_code"]) == ("open", "applied", "C01")
    assert "6789" not in str(first) + str(second) and "token updated" not in str(second)


def test_a_dishonor_and_its_contest_write_their_events():
    debit = returned_after_settlement()
    payment_apply_event(event=processor_event(debit, "return_dishonored", reason_code="R61"))
    payment_apply_event(event=processor_event(debit, "dishonor_contested", reason_code="R76"))
    payment_apply_event(event=processor_event(debit, "dishonor_contested", reason_code="R76"))
    assert types_of(debit.id) == [
        "payment.confirmed",
        "payment.returned",
        "return.dishonored",
        "return.dishonor_contested",
    ]
    contested = events_of(debit.id)[-1][1]
    assert (contested["object"], contested["reason_code"], contested["contest_reason_code"]) == (
        "return_dishonor",
        "R61",
        "R76",
    )


def test_a_double_loss_opened_and_resolved_writes_both_once():
    debit = PaymentFactory(state=PaymentState.CONFIRMED, merchant_id="m-src")
    refund = refund_create(payment_id=debit.id, amount=Decimal("45.00"))
    Payment.objects.filter(pk=refund.pk).update(state=PaymentState.SUBMITTED)
    returned = processor_event(debit, "returned", reason_code="R10")
    payment_apply_event(event=returned)
    payment_apply_event(event=returned)  # a repeat: one double loss, one event
    loss = DoubleLoss.objects.get()
    double_loss_resolve(loss_id=loss.id, status="written_off", user=UserFactory(), note="small")

    losses = [(k, o["status"]) for k, o in events_of(refund.id) if o["object"] == "double_loss"]
    assert losses == [("double_loss.opened", "open"), ("double_loss.resolved", "written_off")]
    opened = Event.objects.get(type="double_loss.opened").data["object"]
    assert (opened["payment_id"], opened["refund_id"], opened["amount"]) == (
        str(debit.id),
        str(refund.id),
        "45.00",
    )


def test_a_double_loss_undone_by_the_refund_failing_writes_resolved_undone():
    debit = PaymentFactory(state=PaymentState.CONFIRMED, merchant_id="m-src")
    refund = refund_create(payment_id=debit.id, amount=Decimal("45.00"))
    Payment.objects.filter(pk=refund.pk).update(state=PaymentState.SUBMITTED)
    payment_apply_event(event=processor_event(debit, "returned", reason_code="R10"))
    payment_apply_event(event=processor_event(refund, "failed", direction="credit"))

    assert types_of(refund.id)[-3:] == [
        "double_loss.opened",
        "refund.failed",
        "double_loss.resolved",
    ]
    assert Event.objects.get(type="double_loss.resolved").data["object"]["status"] == "undone"


def test_the_account_validation_hook_writes_its_catalogue_types_and_refuses_others():
    with transaction.atomic():
        event = event_record(
            type="account_validation.validated",
            merchant_id="m-src",
            obj={"id": "av_1", "object": "account_validation", "status": "validated"},
        )
    assert (event.object_id, event.data["object"]["id"]) == ("av_1", "av_1")
    with pytest.raises(ImproperlyConfigured, match="not an event type"):
        event_record(type="account_validation.maybe", merchant_id="m", obj={"id": "x"})
    with pytest.raises(ImproperlyConfigured, match="needs its id and object"):
        event_record(type="account_validation.failed", merchant_id="m", obj={"id": "x"})
    assert Event.objects.count() == 1


def test_every_new_type_is_one_an_endpoint_may_ask_for():
    new = [
        "payment.created",
        "payout.review_rejected",
        "noc.received",
        "noc.applied",
        "return.dishonored",
        "return.dishonor_contested",
        "double_loss.opened",
        "double_loss.resolved",
        "account_validation.validated",
        "account_validation.failed",
    ]
    assert set(new) <= set(EVENT_TYPES) and len(set(EVENT_TYPES)) == len(EVENT_TYPES)
    endpoint_fields_checked(event_types=new)
