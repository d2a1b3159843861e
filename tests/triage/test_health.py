import pytest
from django.db import connection

from callbacks import sqs


def test_healthz_answers_without_touching_database_or_queue(client, module_settings):
    # No django_db mark: any database access here would raise. The queue endpoint is closed.
    module_settings.SQS_ENDPOINT_URL = "http://127.0.0.1:9"
    sqs.reset()
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


@pytest.mark.django_db
def test_readyz_is_ok_when_database_and_queue_answer(client, sqs_queues):
    response = client.get("/readyz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "checks": {"database": "ok", "queue": "ok"}}


@pytest.mark.django_db
def test_readyz_is_503_naming_the_queue_when_its_endpoint_is_down(
    client, module_settings, sqs_queues, caplog
):
    module_settings.SQS_ENDPOINT_URL = "http://127.0.0.1:9"  # nothing listens there
    sqs.reset()
    response = client.get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "unavailable"
    assert body["reason"] == "queue unreachable"
    assert body["failed"] == ["queue"]
    # Where the queue lives goes to the log, not to an unauthenticated answer.
    assert "127.0.0.1" not in response.content.decode()
    assert "127.0.0.1:9" in caplog.text


@pytest.mark.django_db
def test_readyz_is_503_when_the_main_queue_does_not_exist(
    client, module_settings, sqs_queues, caplog
):
    module_settings.SQS_QUEUE_NAME = "no-such-queue.fifo"
    sqs.reset()
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["failed"] == ["queue"]
    assert "no-such-queue" not in response.content.decode()
    assert "no-such-queue.fifo" in caplog.text


@pytest.mark.django_db(transaction=True)
def test_readyz_is_503_naming_the_database_when_it_is_down(client, sqs_queues, caplog):
    original_port = connection.settings_dict["PORT"]
    connection.close()
    connection.settings_dict["PORT"] = 9  # nothing listens there
    try:
        response = client.get("/readyz")
    finally:
        connection.close()
        connection.settings_dict["PORT"] = original_port
    assert response.status_code == 503
    body = response.json()
    assert body["reason"] == "database unreachable"
    assert body["failed"] == ["database"]
    assert "port 9" not in response.content.decode() and "OperationalError" in caplog.text


@pytest.mark.django_db
def test_operations_endpoints_need_no_authentication(client, settings, sqs_queues):
    # Documented: restricted by the network, not by credentials.
    assert client.get("/healthz").status_code == 200
    assert client.get("/metrics").status_code == 200
