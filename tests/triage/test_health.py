"""/healthz and /readyz: readiness fails only on what this replica lacks (its database, the
module's migrations), never on a dependency every replica shares (SQS, the processor)."""

from contextlib import contextmanager

import pytest
from django.db import connection
from django.db.migrations.recorder import MigrationRecorder

from callbacks import sqs
from tests.triage.test_breaker_operations import open_breaker
from triage.operations.health import migrations_reset


@pytest.fixture(autouse=True)
def fresh_migrations_check():
    migrations_reset()
    yield
    migrations_reset()


@contextmanager
def database_down():
    original_port = connection.settings_dict["PORT"]
    connection.close()
    connection.settings_dict["PORT"] = 9  # nothing listens there
    try:
        yield
    finally:
        connection.close()
        connection.settings_dict["PORT"] = original_port


def test_healthz_answers_without_touching_database_or_queue(client, module_settings):
    # No django_db mark: any database access here would raise. The queue endpoint is closed.
    module_settings.SQS_ENDPOINT_URL = "http://127.0.0.1:9"
    sqs.reset()
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


@pytest.mark.django_db
def test_readyz_is_ok_when_the_database_answers_and_every_migration_is_applied(client):
    response = client.get("/readyz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "checks": {"database": "ok", "migrations": "ok"}}


@pytest.mark.django_db
def test_readyz_stays_ok_when_sqs_is_unreachable_and_the_breaker_is_open(
    client, module_settings, django_assert_num_queries
):
    # A shared dependency down is every replica's: failing readiness would empty the pool.
    module_settings.SQS_ENDPOINT_URL = "http://127.0.0.1:9"  # nothing listens there
    sqs.reset()
    open_breaker()
    assert client.get("/readyz").status_code == 200
    # Once the migrations were seen applied, a probe is one trivial query.
    with django_assert_num_queries(1):
        response = client.get("/readyz")
    assert response.status_code == 200
    assert response.json()["checks"] == {"database": "ok", "migrations": "ok"}


def leaf_migration(app: str) -> str:
    from django.db.migrations.loader import MigrationLoader

    ((_app, name),) = MigrationLoader(None, ignore_no_migrations=True).graph.leaf_nodes(app)
    return name


@pytest.mark.django_db
def test_readyz_is_503_naming_the_migrations_when_one_is_not_applied(client, caplog):
    # Undone with the test's transaction.
    leaf = leaf_migration("triage")
    MigrationRecorder(connection).migration_qs.filter(app="triage", name=leaf).delete()
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json() == {
        "status": "unavailable",
        "reason": "migrations not applied",
        "failed": ["migrations"],
    }
    assert f"triage.{leaf}" in caplog.text


@pytest.mark.django_db(transaction=True)
def test_readyz_is_503_naming_the_database_when_it_is_down(client, caplog):
    with database_down():
        response = client.get("/readyz")
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
    assert client.get("/dependencies").status_code == 200
