import pytest

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
