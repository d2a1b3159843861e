"""The operator's dishonor of a return, from the payment's admin page: the triage right, the
rules as messages on the form, and a processor failure shown and kept."""

import uuid

import pytest
from django.contrib.auth.models import Permission
from django.contrib.messages import get_messages

from payments.models import AttemptOutcome, ProcessorAttempt, ReturnDishonor
from payments.services.dishonors import DISHONOR_OPERATION
from tests.payments.test_dishonor_requests import _returned
from tests.triage.deadletters import operator, viewer

pytestmark = pytest.mark.django_db


def _staff(client, user, *, view_payments: bool = True):
    if view_payments:
        user.user_permissions.add(
            *Permission.objects.filter(
                content_type__app_label="payments",
                codename__in=["view_payment", "view_processorattempt", "view_returndishonor"],
            )
        )
        user = type(user).objects.get(pk=user.pk)
    client.force_login(user)
    return user


def _url(payment) -> str:
    return f"/admin/payments/payment/{payment.pk}/dishonor/"


def _messages(response) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def test_an_operator_sees_the_link_on_a_returned_payment_and_the_window_on_the_page(client):
    payment = _returned()
    _staff(client, operator())

    change = client.get(f"/admin/payments/payment/{payment.pk}/change/").content.decode()
    page = client.get(_url(payment))

    assert "Dishonor the return…" in change
    assert _url(payment) in change
    assert page.status_code == 200
    content = page.content.decode()
    assert "within 5 banking days" in content
    assert "R61 Misrouted Return" in content and "R68 Untimely Return" in content


def test_a_viewer_sees_no_link_and_is_refused_the_page_by_name(client):
    payment = _returned()
    _staff(client, viewer())

    change = client.get(f"/admin/payments/payment/{payment.pk}/change/").content.decode()
    get = client.get(_url(payment))
    post = client.post(_url(payment), {"reason_code": "R61", "note": "n"})

    assert "Dishonor the return" not in change
    assert get.status_code == 403 and post.status_code == 403
    assert not ReturnDishonor.objects.exists()


def test_the_operator_asks_for_a_dishonor_and_it_is_sent(client, sandbox):
    payment = _returned(sandbox)
    user = _staff(client, operator())

    response = client.post(_url(payment), {"reason_code": "R61", "note": "misrouted, #881"})

    assert response.status_code == 302
    assert response["Location"] == f"/admin/payments/payment/{payment.pk}/change/"
    assert any("sent to the processor" in m for m in _messages(response))
    dishonor = ReturnDishonor.objects.get(payment=payment)
    assert (dishonor.requested_by, dishonor.note, dishonor.request_status) == (
        user,
        "misrouted, #881",
        "sent",
    )
    change = client.get(response["Location"]).content.decode()
    assert "R61 Misrouted Return" in change  # the request on the payment's page
    assert "Dishonor the return…" not in change  # nothing left to ask


@pytest.mark.parametrize(
    ("form", "message"),
    [
        ({"reason_code": "R68", "note": "late?"}, "needs a late return"),
        ({"reason_code": "R61", "note": ""}, "needs a note"),
        ({"reason_code": "R01", "note": "n"}, "Select a valid choice"),
        ({"reason_code": "R61\x00", "note": "n"}, "Select a valid choice"),
        ({"reason_code": "R61", "note": "a\x00b"}, "Null characters are not allowed"),
    ],
    ids=["r68-timely", "no-note", "not-a-dishonor-code", "nul-code", "nul-note"],
)
def test_a_refused_request_is_shown_on_the_form_naming_the_rule(client, form, message):
    payment = _returned()
    _staff(client, operator())

    response = client.post(_url(payment), form)

    assert response.status_code in (200, 400)
    assert message in response.content.decode()
    assert not ReturnDishonor.objects.exists()


def test_a_payment_that_was_not_returned_is_refused_with_the_rule(client):
    from tests.factories import PaymentFactory

    payment = PaymentFactory(state="confirmed")
    _staff(client, operator())

    response = client.post(_url(payment), {"reason_code": "R61", "note": "n"})

    assert response.status_code == 400
    assert "not returned after settlement" in response.content.decode()


def test_a_reinitiated_return_offers_no_dishonor_and_a_post_is_refused_naming_it(client):
    from payments.services import payment_reinitiate

    payment = _returned()
    again = payment_reinitiate(payment_id=payment.id)
    _staff(client, operator())

    change = client.get(f"/admin/payments/payment/{payment.pk}/change/").content.decode()
    response = client.post(_url(payment), {"reason_code": "R61", "note": "misrouted"})

    assert "Dishonor the return" not in change
    assert response.status_code == 400
    assert f"reinitiated as payment {again.id}" in response.content.decode()
    assert not ReturnDishonor.objects.exists()
    assert not ProcessorAttempt.objects.filter(operation=DISHONOR_OPERATION).exists()


def test_an_unknown_payment_is_a_404(client):
    _staff(client, operator())

    assert client.get(f"/admin/payments/payment/{uuid.uuid4()}/dishonor/").status_code == 404


def test_a_processor_failure_is_shown_kept_and_sent_again_from_the_page(client, sandbox):
    payment = _returned(sandbox)
    _staff(client, operator())
    sandbox.outage_start("503")

    failed = client.post(_url(payment), {"reason_code": "R69", "note": "field errors"})

    assert failed.status_code == 302
    [message] = _messages(failed)
    assert "did not take the dishonor request" in message and "HTTP 503" in message
    client.get(failed["Location"])  # the message shown once
    change = client.get(failed["Location"]).content.decode()
    # The attempt and the request's error on the payment's page.
    assert change.count("HTTP 503") >= 2
    assert "Dishonor the return…" in change  # still to be sent
    page = client.get(_url(payment)).content.decode()
    assert "Send the request again" in page

    sandbox.outage_stop()
    resent = client.post(_url(payment), {"resend": "1"})

    assert resent.status_code == 302
    assert any("sent to the processor" in m for m in _messages(resent))
    attempts = ProcessorAttempt.objects.filter(payment=payment, operation=DISHONOR_OPERATION)
    assert [a.outcome for a in attempts] == [AttemptOutcome.RETRYABLE, AttemptOutcome.ACCEPTED]
    assert ReturnDishonor.objects.get(payment=payment).request_status == "sent"
