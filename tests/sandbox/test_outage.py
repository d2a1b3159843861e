"""The sandbox processor's outage mode, switched at run time over HTTP."""

import uuid

import pytest
import requests

from sandbox import FaultConfig, SandboxProcessor
from tests.waiting import wait_for

AUTH = {"Authorization": "Bearer test-processor-key"}


@pytest.fixture
def server():
    sandbox = SandboxProcessor(
        api_key="test-processor-key",
        signing_secret="secret",
        faults=FaultConfig(timeout_seconds=0.5, settle_after_seconds=0.01),
    ).start()
    yield sandbox
    sandbox.stop()


def debit(base_url, *, key=None, timeout=5.0):
    body = {
        "payment_id": str(uuid.uuid4()),
        "amount": "10.00",
        "currency": "USD",
        "source_token": "tok_sandbox_01",
    }
    headers = {**AUTH, "Idempotency-Key": str(key or uuid.uuid4())}
    return requests.post(f"{base_url}/v1/ach/debits", json=body, headers=headers, timeout=timeout)


def outage(base_url, body):
    return requests.post(f"{base_url}/_sandbox/outage", json=body, timeout=5)


def test_503_outage_fails_every_call_without_charging_then_ends_by_itself(server):
    started = outage(server.base_url, {"mode": "503", "seconds": 0.6})
    assert started.status_code == 200 and started.json()["mode"] == "503"

    during = debit(server.base_url)
    status = requests.get(
        f"{server.base_url}/v1/ach/debits/{uuid.uuid4()}", headers=AUTH, timeout=5
    )
    wait_for(lambda: not server.outage()["mode"], 5, "the outage to end by itself")
    after = debit(server.base_url)

    assert (during.status_code, status.status_code, after.status_code) == (503, 503, 201)
    assert "sandbox outage" in during.json()["error"]
    stats = server.stats()
    assert stats["total_charges"] == 1 and stats["outage_calls_failed"] == 2
    assert requests.get(f"{server.base_url}/_sandbox/outage", timeout=5).json()["mode"] == ""


def test_reset_outage_drops_connections_so_the_client_sees_a_connection_error(server):
    outage(server.base_url, {"mode": "reset"})

    with pytest.raises(requests.exceptions.ConnectionError):
        debit(server.base_url)

    outage(server.base_url, {"mode": "off"})
    assert debit(server.base_url).status_code == 201
    assert server.stats()["total_charges"] == 1


def test_timeout_outage_answers_only_after_the_client_gave_up(server):
    server.outage_start("timeout", 5)

    with pytest.raises(requests.exceptions.ReadTimeout):
        debit(server.base_url, timeout=0.2)

    server.outage_stop()
    assert server.stats()["total_charges"] == 0


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ({"mode": "down"}, "outage mode must be one of 503, timeout, reset"),
        ({"mode": "503", "seconds": -1}, "outage seconds must be within 0..86400"),
        ({"mode": "503", "seconds": "ten"}, "seconds must be a number"),
        ({"mode": "503", "until": 3}, "unknown field(s): until"),
        ({}, "mode must be one of off, 503, timeout, reset"),
    ],
)
def test_bad_outage_requests_answer_400_naming_the_problem(server, body, problem):
    answer = outage(server.base_url, body)

    assert answer.status_code == 400
    assert problem in answer.json()["error"]
    assert server.outage()["mode"] == ""


def test_outage_control_refuses_a_body_that_is_not_json(server):
    answer = requests.post(f"{server.base_url}/_sandbox/outage", data=b"{nope", timeout=5)

    assert answer.status_code == 400 and "JSON" in answer.json()["error"]
