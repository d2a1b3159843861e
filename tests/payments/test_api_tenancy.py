"""Each API user acts only for the merchants its access policy grants."""

from decimal import Decimal

import pytest
from rest_framework.test import APIClient

from payments.access import merchant_access_allowed
from payments.models import MerchantAccess, Payment
from payments.services import payment_apply_event
from tests.factories import PaymentFactory, UserFactory, grant, processor_event

pytestmark = pytest.mark.django_db

BODY = {"merchant_id": "acme", "amount": "25.00", "currency": "USD", "source_token": "tok_abcdef12"}


def client_for(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def only_globex(user, merchant_id: str) -> bool:
    """A host's own policy, by dotted path: every authenticated user acts for globex only."""
    return user.is_authenticated and merchant_id == "globex"


def test_granted_user_creates_and_reads_its_merchants_payment(api_client, user):
    grant(user, "acme")

    created = api_client.post("/api/payments/", BODY, format="json")
    detail = api_client.get(f"/api/payments/{created.json()['id']}/")

    assert created.status_code == 201
    assert detail.status_code == 200 and detail.json()["merchant_id"] == "acme"


def test_creating_a_payment_for_an_ungranted_merchant_answers_403_naming_merchant_id(
    api_client, user
):
    grant(user, "globex")

    response = api_client.post("/api/payments/", BODY, format="json")

    assert response.status_code == 403
    assert list(response.json()["error"]["errors"]) == ["merchant_id"]
    assert Payment.objects.count() == 0


def test_another_merchants_payment_answers_404_like_a_missing_one(api_client, user):
    grant(user, "globex")
    theirs = PaymentFactory(merchant_id="acme")
    missing = PaymentFactory.build()

    foreign = api_client.get(f"/api/payments/{theirs.id}/")
    absent = api_client.get(f"/api/payments/{missing.id}/")

    assert foreign.status_code == absent.status_code == 404
    # The same answer but for the request's own id.
    foreign_error, absent_error = foreign.json()["error"], absent.json()["error"]
    assert foreign_error.pop("request_id") != absent_error.pop("request_id")
    assert foreign_error == absent_error


def test_another_merchants_balance_answers_404(api_client, user):
    grant(user, "globex")
    payment = PaymentFactory(state="submitted", merchant_id="acme", amount=Decimal("10.00"))
    payment_apply_event(event=processor_event(payment, "settled"))

    response = api_client.get("/api/merchants/acme/balance/")

    assert response.status_code == 404
    assert "10.00" not in response.content.decode()


def test_a_grant_to_one_user_gives_nothing_to_another():
    owner, stranger = UserFactory(), UserFactory()
    grant(owner, "acme")
    payment = PaymentFactory(merchant_id="acme")

    assert client_for(owner).get(f"/api/payments/{payment.id}/").status_code == 200
    assert client_for(stranger).get(f"/api/payments/{payment.id}/").status_code == 404
    assert client_for(stranger).get("/api/merchants/acme/balance/").status_code == 404
    assert client_for(stranger).post("/api/payments/", BODY, format="json").status_code == 403


def test_revoking_the_grant_revokes_access(api_client, user):
    grant(user, "acme")
    payment = PaymentFactory(merchant_id="acme")
    assert api_client.get(f"/api/payments/{payment.id}/").status_code == 200

    MerchantAccess.objects.filter(user=user, merchant_id="acme").delete()

    assert api_client.get(f"/api/payments/{payment.id}/").status_code == 404


def test_inactive_user_is_granted_nothing_by_the_default_policy():
    user = UserFactory(is_active=False)
    grant(user, "acme")
    assert merchant_access_allowed(user=user, merchant_id="acme") is False


def test_a_host_policy_named_in_settings_replaces_the_grants(api_client, user, module_settings):
    module_settings.PAYMENTS_MERCHANT_ACCESS_POLICY = "tests.payments.test_api_tenancy.only_globex"
    grant(user, "acme")  # ignored: the host's policy decides
    acme = PaymentFactory(merchant_id="acme")
    globex = PaymentFactory(merchant_id="globex")

    assert api_client.get(f"/api/payments/{acme.id}/").status_code == 404
    assert api_client.get(f"/api/payments/{globex.id}/").status_code == 200
    assert api_client.post("/api/payments/", BODY, format="json").status_code == 403
    created = api_client.post("/api/payments/", {**BODY, "merchant_id": "globex"}, format="json")
    assert created.status_code == 201


def test_admin_shows_every_merchants_payments_whatever_the_grants(admin_client):
    payment = PaymentFactory(merchant_id="acme")

    assert admin_client.get(f"/admin/payments/payment/{payment.id}/change/").status_code == 200
    listing = admin_client.get("/admin/payments/payment/")
    assert listing.status_code == 200 and str(payment.id) in listing.content.decode()


def test_a_grant_added_in_the_admin_opens_the_api(admin_client, api_client, user):
    response = admin_client.post(
        "/admin/payments/merchantaccess/add/",
        {"user": user.pk, "merchant_id": "acme", "note": "onboarding"},
    )

    assert response.status_code == 302
    assert MerchantAccess.objects.filter(user=user, merchant_id="acme").exists()
    assert api_client.post("/api/payments/", BODY, format="json").status_code == 201


def test_the_demos_api_client_may_create_payments_for_every_demo_merchant():
    from rest_framework.authtoken.models import Token

    from demo.traffic import MERCHANTS, create_demo_users

    key = create_demo_users(password="demo-password")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    user = Token.objects.get(key=key).user

    for merchant_id in MERCHANTS:
        assert merchant_access_allowed(user=user, merchant_id=merchant_id)
    response = client.post("/api/payments/", {**BODY, "merchant_id": MERCHANTS[0]}, format="json")
    assert response.status_code == 201
