"""The API's authentication and permission classes are the host's choice
(``PAYMENTS["API_AUTHENTICATION_CLASSES"]``, ``PAYMENTS["API_PERMISSION_CLASSES"]``): a host on
JWT calls every endpoint with its own tokens, a stricter permission holds, and a path that does
not import or is not such a class stops start-up naming it."""

import pytest
from django.core.checks import run_checks
from rest_framework.test import APIClient

from tests.factories import PaymentFactory, UserFactory, grant
from tests.payments.jwt_host_auth import token_for

pytestmark = pytest.mark.django_db

JWT = "tests.payments.jwt_host_auth.HostJwtAuthentication"
BODY = {"merchant_id": "m-1", "amount": "25.00", "currency": "USD", "source_token": "tok_abcdef12"}


@pytest.fixture
def jwt_only(module_settings):
    module_settings.API_AUTHENTICATION_CLASSES = [JWT]


def _bearer(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def test_a_host_on_jwt_creates_reads_and_lists_with_its_own_tokens(jwt_only):
    user = UserFactory(username="jwt-user")
    grant(user, "m-1")
    client = _bearer(token_for("jwt-user"))

    created = client.post("/api/payments/", BODY, format="json", HTTP_IDEMPOTENCY_KEY="j-1")
    read = client.get(f"/api/payments/{created.json()['id']}/")
    listed = client.get("/api/payouts/")

    assert (created.status_code, read.status_code, listed.status_code) == (201, 200, 200)


def test_with_jwt_only_a_drf_token_and_a_forged_jwt_are_refused(jwt_only, api_client):
    forged = _bearer(token_for("jwt-user")[:-4] + "AAAA")

    drf_token = api_client.get("/api/payments/")
    bad = forged.get("/api/payments/")

    assert drf_token.status_code == 401
    assert bad.status_code == 401
    assert "bad token" in bad.json()["error"]["message"]
    assert bad["WWW-Authenticate"] == "Bearer"


def test_the_default_classes_are_drf_tokens_and_sessions(api_client, user):
    grant(user, "m-1")
    PaymentFactory(merchant_id="m-1")

    assert api_client.get("/api/payments/").status_code == 200
    assert APIClient().get("/api/payments/").status_code == 401


def test_a_stricter_permission_class_holds_on_every_endpoint(module_settings, api_client, user):
    module_settings.API_PERMISSION_CLASSES = ["rest_framework.permissions.IsAdminUser"]
    grant(user, "m-1")

    answers = [
        api_client.get("/api/payments/"),
        api_client.post("/api/payouts/", {}, format="json"),
        api_client.get("/api/merchants/m-1/balance/"),
    ]

    assert [a.status_code for a in answers] == [403, 403, 403]


@pytest.mark.parametrize(
    ("setting", "value", "named"),
    [
        ("API_AUTHENTICATION_CLASSES", ["no.such.Module"], "cannot be imported"),
        ("API_AUTHENTICATION_CLASSES", ["tests.payments.jwt_host_auth.NotAClass"], "is not a"),
        ("API_AUTHENTICATION_CLASSES", ["rest_framework.permissions.IsAuthenticated"], "is not a"),
        ("API_AUTHENTICATION_CLASSES", [], "non-empty"),
        ("API_AUTHENTICATION_CLASSES", "rest_framework.authentication.TokenAuthentication", "list"),
        ("API_PERMISSION_CLASSES", [JWT], "is not a"),
        ("API_PERMISSION_CLASSES", [None], "is not a dotted path"),
    ],
)
def test_a_bad_class_setting_stops_start_up_naming_it(module_settings, setting, value, named):
    setattr(module_settings, setting, value)

    errors = [e for e in run_checks() if e.id == "payments.E003"]

    assert len(errors) == 1, errors
    assert setting in errors[0].msg and named in errors[0].msg
