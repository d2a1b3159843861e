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


@pytest.fixture
def sqs_queues(local_sqs, settings, request):
    """Fresh main FIFO queue and DLQ for one test, created on the local SQS server.

    Yields a small namespace with ``client``, ``url`` and ``dlq_url``; settings point at them.
    """
    import types
    import uuid

    import boto3

    from callbacks import sqs

    suffix = uuid.uuid4().hex[:12]
    settings.SQS_ENDPOINT_URL = local_sqs.endpoint_url
    settings.SQS_QUEUE_NAME = f"payments-{suffix}.fifo"
    settings.SQS_DLQ_NAME = f"payments-dlq-{suffix}.fifo"
    sqs.reset()
    client = boto3.client("sqs", endpoint_url=local_sqs.endpoint_url, region_name="us-east-1")
    dlq_url = client.create_queue(
        QueueName=settings.SQS_DLQ_NAME, Attributes={"FifoQueue": "true"}
    )["QueueUrl"]
    dlq_arn = client.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])[
        "Attributes"
    ]["QueueArn"]
    url = client.create_queue(
        QueueName=settings.SQS_QUEUE_NAME,
        Attributes={
            "FifoQueue": "true",
            "VisibilityTimeout": "30",
            "DeduplicationScope": "messageGroup",
            "FifoThroughputLimit": "perMessageGroupId",
            "RedrivePolicy": f'{{"deadLetterTargetArn":"{dlq_arn}","maxReceiveCount":"10"}}',
        },
    )["QueueUrl"]
    yield types.SimpleNamespace(client=client, url=url, dlq_url=dlq_url)
    sqs.reset()
