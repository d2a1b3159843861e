"""/dependencies and payments_dependency_up: each shared dependency's state, checked with a
short timeout and cached, so neither a hung endpoint nor a storm of probes reaches it often."""

import threading
from datetime import datetime

import pytest

from callbacks import sqs
from tests.triage.test_breaker_operations import open_breaker
from tests.triage.test_health import database_down
from tests.triage.test_metrics import scrape, value
from triage.operations import dependencies


@pytest.fixture(autouse=True)
def fresh_results():
    dependencies.dependencies_reset()
    yield
    dependencies.dependencies_reset()


@pytest.mark.django_db
def test_dependencies_report_each_one_up_when_it_answers(client, sqs_queues):
    response = client.get("/dependencies")
    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"database", "sqs", "processor"}
    assert {name: state["ok"] for name, state in body.items()} == dict.fromkeys(body, True)
    assert body["processor"]["detail"] == "breaker closed"
    assert all(datetime.fromisoformat(state["checked_at"]) for state in body.values())


# Committed rows: the checks run in threads of their own, with connections of their own.
@pytest.mark.django_db(transaction=True)
def test_an_unreachable_queue_and_an_open_breaker_are_reported_down_with_their_gauges(
    client, module_settings, caplog
):
    module_settings.SQS_ENDPOINT_URL = "http://127.0.0.1:9"  # nothing listens there
    sqs.reset()
    open_breaker()
    response = client.get("/dependencies")
    assert response.status_code == 200  # a report, not a probe
    body = response.json()
    assert body["database"]["ok"] is True
    assert body["sqs"] == {**body["sqs"], "ok": False, "detail": "main queue unreachable"}
    assert body["processor"]["ok"] is False
    assert body["processor"]["detail"].startswith("breaker open since ")
    # Where the queue lives goes to the log, not to an unauthenticated answer.
    assert "127.0.0.1" not in response.content.decode()
    assert "127.0.0.1:9" in caplog.text
    samples = scrape(client)
    assert value(samples, "payments_dependency_up", dependency="database") == 1
    assert value(samples, "payments_dependency_up", dependency="sqs") == 0
    assert value(samples, "payments_dependency_up", dependency="processor") == 0


@pytest.mark.django_db
def test_a_missing_main_queue_is_reported_without_its_name(client, module_settings, sqs_queues):
    module_settings.SQS_QUEUE_NAME = "no-such-queue.fifo"
    sqs.reset()
    sqs_state = client.get("/dependencies").json()["sqs"]
    assert sqs_state["ok"] is False
    assert sqs_state["detail"].startswith("main queue refused the call (")
    assert "no-such-queue" not in sqs_state["detail"]


@pytest.mark.django_db(transaction=True)
def test_a_database_outage_is_reported_without_failing_the_report(client, sqs_queues):
    with database_down():
        response = client.get("/dependencies")
    assert response.status_code == 200
    body = response.json()
    assert body["database"] == {**body["database"], "ok": False}
    assert body["database"]["detail"] == "unreachable (OperationalError)"
    assert body["processor"]["detail"] == "breaker state unreadable (database unreachable)"
    assert body["sqs"]["ok"] is True
    assert "port 9" not in response.content.decode()


def test_a_storm_of_probes_costs_one_check_per_interval(client, monkeypatch):
    calls = []
    monkeypatch.setattr(dependencies, "CHECKS", {"sqs": lambda: calls.append(1) or (True, "")})
    for _ in range(20):
        assert client.get("/dependencies").json()["sqs"]["ok"] is True
    assert len(calls) == 1


def test_a_hung_check_answers_in_its_timeout_and_is_not_started_again(monkeypatch):
    release, calls = threading.Event(), []

    def hung():
        calls.append(1)
        release.wait(10)
        return True, "late"

    monkeypatch.setattr(dependencies, "CHECKS", {"sqs": hung})
    monkeypatch.setattr(dependencies, "CHECK_TIMEOUT_SECONDS", 0.2)
    try:
        for _ in range(3):
            dependencies.dependencies_reset()
            state = dependencies.dependencies_status()["sqs"]
            assert (state.ok, state.detail) == (False, "no answer within 0.2 s")
        assert len(calls) == 1
    finally:
        release.set()
