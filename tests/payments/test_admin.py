import pytest

from payments.models import EventKind, PaymentEvent
from payments.services import payment_apply_event
from tests.factories import PaymentFactory, UserFactory, processor_event

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(client):
    client.force_login(UserFactory(username="root", is_staff=True, is_superuser=True))
    return client


def test_payment_changelist_renders_with_filters_and_search(admin_client):
    PaymentFactory.create_batch(3)
    response = admin_client.get("/admin/payments/payment/", {"state": "pending", "q": "merchant"})
    assert response.status_code == 200
    assert response.context["cl"].result_count == 3


def test_payment_change_page_shows_history_inlines_and_no_editable_state(admin_client):
    payment = PaymentFactory(state="submitted")
    payment_apply_event(event=processor_event(payment, "settled"))

    response = admin_client.get(f"/admin/payments/payment/{payment.pk}/change/")

    assert response.status_code == 200
    content = response.content.decode()
    assert 'name="state"' not in content  # no form field: the state is read-only
    assert "confirmed" in content
    assert "settled" in content  # the event log inline
    assert "credit" in content  # the ledger inline


def test_posting_a_state_change_through_the_admin_changes_nothing(admin_client):
    payment = PaymentFactory()
    admin_client.post(
        f"/admin/payments/payment/{payment.pk}/change/", {"state": "confirmed", "_save": "Save"}
    )
    payment.refresh_from_db()
    assert payment.state == "pending"


@pytest.mark.parametrize(
    "url",
    [
        "/admin/payments/paymentevent/",
        "/admin/payments/processorattempt/",
        "/admin/payments/ledgerentry/",
        "/admin/payments/processedevent/",
        "/admin/payments/outboxmessage/",
    ],
)
def test_history_changelists_render_and_offer_no_add(admin_client, url):
    PaymentFactory()
    response = admin_client.get(url)
    assert response.status_code == 200
    assert admin_client.get(url + "add/").status_code == 403


def test_event_log_rows_cannot_be_deleted(admin_client):
    payment = PaymentFactory(state="submitted")
    payment_apply_event(event=processor_event(payment, "settled"))
    event = payment.events.get()
    response = admin_client.post(
        f"/admin/payments/paymentevent/{event.pk}/delete/", {"post": "yes"}
    )
    assert response.status_code == 403
    assert payment.events.count() == 1


def test_returned_payment_page_shows_the_code_with_its_title_and_the_reversal(admin_client):
    payment = PaymentFactory(state="confirmed")
    payment_apply_event(event=processor_event(payment, "returned", reason_code="R10"))

    content = admin_client.get(f"/admin/payments/payment/{payment.pk}/change/").content.decode()

    assert "R10 Customer Advises Originator is Not Known to Receiver" in content
    assert "reversal" in content and "-125.00" in content
    assert "unauthorized" in content


def test_the_returns_list_shows_codes_with_titles_and_filters_flagged_ones(admin_client):
    flagged = PaymentFactory(state="confirmed")
    payment_apply_event(event=processor_event(flagged, "returned", reason_code="R42X"))
    payment_apply_event(
        event=processor_event(PaymentFactory(state="confirmed"), "returned", reason_code="R01")
    )

    everything = admin_client.get("/admin/payments/paymentreturn/").content.decode()
    unknown = admin_client.get("/admin/payments/paymentreturn/", {"unknown_code__exact": "1"})

    assert "R01 Insufficient Funds" in everything
    assert "R42X (unknown code)" in everything
    assert unknown.context["cl"].result_count == 1
    assert "unknown code" in unknown.content.decode()
    assert admin_client.get("/admin/payments/paymentreturn/add/").status_code == 403


def test_circuit_breaker_is_shown_with_its_history_and_cannot_be_edited(admin_client):
    from payments.models import CircuitBreaker, CircuitBreakerTransition

    breaker = CircuitBreaker.objects.create(name="processor", state="open")
    CircuitBreakerTransition.objects.create(
        breaker=breaker, kind="opened", reason="5 consecutive failures", pause_seconds=15
    )

    listing = admin_client.get("/admin/payments/circuitbreaker/")
    page = admin_client.get("/admin/payments/circuitbreaker/processor/change/")
    admin_client.post(
        "/admin/payments/circuitbreaker/processor/change/", {"state": "closed", "_save": "Save"}
    )

    assert listing.status_code == 200 and "processor" in listing.content.decode()
    content = page.content.decode()
    assert page.status_code == 200
    assert 'name="state"' not in content
    assert "5 consecutive failures" in content
    breaker.refresh_from_db()
    assert breaker.state == "open"


def test_an_event_stored_with_bank_numbers_in_its_payload_shows_them_masked(admin_client):
    # As the edge stored a callback before it masked: the processor's extra members and
    # message whole. The row is kept as written; the page shows the last 4 digits only.
    payment = PaymentFactory(state="confirmed")
    event = PaymentEvent.objects.create(
        payment=payment,
        kind=EventKind.PROCESSOR_EVENT,
        outcome="recorded",
        event_type="notification_of_change",
        processor_event_id="evt_noc_1",
        payload={
            "payment_id": str(payment.id),
            "processor_event_id": "evt_noc_1",
            "amount": "12500.00",
            "timestamp": "2026-11-02T12:00:00+00:00",
            "message": "C01: account now 77668056869313516",
            "corrected_dfi_account_number": "77668056869313516",
            "extra": {"7766805686931": ["7766 8056 8693 1", 7766805686931]},
        },
    )
    page = admin_client.get(f"/admin/payments/paymentevent/{event.pk}/change/")
    text = page.content.decode()
    assert page.status_code == 200
    assert "C01: account now ****3516" in text and "&quot;****6931&quot;" in text
    assert "12500.00" in text and str(payment.id) in text and "evt_noc_1" in text
    for number in ("77668056869313516", "7766805686931", "7766 8056"):
        assert number not in text


def test_a_canceled_payment_is_filtered_and_shown_with_its_cancellation(admin_client):
    from payments.services import payment_cancel

    canceled = PaymentFactory()
    PaymentFactory()
    payment_cancel(payment_id=canceled.pk, caused_by="api:alice")

    listed = admin_client.get("/admin/payments/payment/", {"state": "canceled"})
    page = admin_client.get(f"/admin/payments/payment/{canceled.pk}/change/")

    assert listed.status_code == 200 and listed.context["cl"].result_count == 1
    assert "Canceled before origination" in listed.content.decode()  # the filter's choice
    content = page.content.decode()
    assert page.status_code == 200
    assert "api:alice" in content and "cancellation" in content.lower()
    assert "Submission started at" in content
