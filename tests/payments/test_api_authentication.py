"""The API's token authentication (``payments.api.authentication``): DRF's token, read with the
user's merchant grants in one statement, which the default access policy answers from."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from payments import access
from payments.models import MerchantAccess, Payment
from tests.factories import UserFactory, grant

pytestmark = pytest.mark.django_db

BODY = {"merchant_id": "m-1", "amount": "25.00", "currency": "USD", "source_token": "tok_abcdef12"}


def _client(user) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return client


def test_a_create_reads_no_grant_apart_from_the_token():
    user = UserFactory()
    grant(user, "m-1")

    with CaptureQueriesContext(connection) as queries:
        response = _client(user).post("/api/payments/", BODY, format="json")

    assert response.status_code == 201
    grant_reads = [q["sql"] for q in queries if "payments_merchantaccess" in q["sql"]]
    assert len(grant_reads) == 1 and "authtoken_token" in grant_reads[0]


def test_a_merchant_not_among_the_carried_grants_is_refused():
    user = UserFactory()
    grant(user, "m-2")

    response = _client(user).post("/api/payments/", BODY, format="json")

    assert response.status_code == 403
    assert response.json()["error"]["param"] == "merchant_id"
    assert not Payment.objects.exists()


def test_a_user_granted_more_merchants_than_carried_is_asked_per_request():
    user = UserFactory()
    MerchantAccess.objects.bulk_create(
        MerchantAccess(user=user, merchant_id=f"a-{i:04}") for i in range(access.GRANTS_CARRIED)
    )
    grant(user, "m-1")  # sorts after every a-*: not among the carried ones

    with CaptureQueriesContext(connection) as queries:
        response = _client(user).post("/api/payments/", BODY, format="json")

    assert response.status_code == 201
    grant_reads = [q["sql"] for q in queries if "payments_merchantaccess" in q["sql"]]
    assert len(grant_reads) == 2  # the token's (too many to carry), then the policy's own


def test_a_list_across_merchants_lists_the_carried_grants():
    user = UserFactory()
    grant(user, "m-1", "m-2")
    client = _client(user)
    client.post("/api/payments/", BODY, format="json")
    client.post("/api/payments/", {**BODY, "merchant_id": "m-2"}, format="json")
    client.post("/api/payments/", {**BODY, "merchant_id": "m-3"}, format="json")  # not granted

    response = client.get("/api/payments/")

    assert response.status_code == 200
    assert sorted(p["merchant_id"] for p in response.json()["results"]) == ["m-1", "m-2"]


def test_an_inactive_users_token_answers_401():
    user = UserFactory(is_active=False)
    grant(user, "m-1")

    response = _client(user).post("/api/payments/", BODY, format="json")

    assert response.status_code == 401
    assert not Payment.objects.exists()


def test_an_unknown_token_answers_401():
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token " + "0" * 40)

    response = client.post("/api/payments/", BODY, format="json")

    assert response.status_code == 401
    assert response.json()["error"]["request_id"]


def test_the_token_reads_the_user_as_the_orm_reads_it_with_its_token_and_grants():
    from django.contrib.auth import get_user_model

    from payments.api.authentication import TokenAuthentication

    user = UserFactory(first_name="Ada", email="ada@example.com")
    grant(user, "m-2")
    grant(user, "m-1")
    token = Token.objects.create(user=user)

    read, read_token = TokenAuthentication().authenticate_credentials(token.key)

    orm = get_user_model().objects.get(pk=user.pk)
    for field in get_user_model()._meta.concrete_fields:
        assert getattr(read, field.attname) == getattr(orm, field.attname), field.name
    assert read._state.adding is False and read._state.db == "default"
    assert read.merchants_granted == ["m-1", "m-2"]
    assert (read_token.key, read_token.user, read_token.created) == (token.key, orm, token.created)
