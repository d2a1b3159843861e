import pytest
from rest_framework.test import APIClient

from tests.factories import UserFactory
from tests.localsqs import LocalSqs, aws_test_environment


@pytest.fixture(scope="session")
def local_sqs():
    """The local SQS server for the whole test session, over real HTTP on loopback."""
    aws_test_environment()
    server = LocalSqs().start()
    yield server
    server.stop()


@pytest.fixture
def user(db):
    return UserFactory()


@pytest.fixture
def api_client(user):
    from rest_framework.authtoken.models import Token

    client = APIClient()
    token = Token.objects.create(user=user)
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    return client
