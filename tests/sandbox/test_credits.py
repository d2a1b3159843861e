"""The sandbox's credits (money out: ``/v1/ach/credits``) over real HTTP: sent once per key,
refused when malformed or reused for another request, answered with callbacks stating
``direction: "credit"``, listed by the events API, returned by the token rule."""

import uuid
from datetime import datetime, timedelta

import pytest
import requests

from payments.processor.backends.http import ProcessorCallRejected, ProcessorClient
from sandbox import FaultConfig, SandboxProcessor
from tests.sandbox.test_sandbox import AUTH, CallbackReceiver, debit
from tests.waiting import wait_for


@pytest.fixture
def receiver():
    receiver = CallbackReceiver()
    yield receiver
    receiver.stop()


@pytest.fixture
def with_callbacks(receiver):
    sandbox = SandboxProcessor(
        api_key="test-processor-key",
        signing_secret="s",
        callback_url=receiver.url,
        faults=FaultConfig(settle_after_seconds=0.01, return_after_seconds=0.01),
        callback_backoff_seconds=0.01,
        seed=3,
    ).start()
    yield sandbox
    sandbox.stop()


def credit(base_url, *, key=None, payment_id=None, amount="5.00", token="tok_refund_01", **kw):
    body = {
        "payment_id": str(payment_id or uuid.uuid4()),
        "amount": amount,
        "currency": "USD",
        "destination_token": token,
    }
    body.update(kw.pop("body", {}))
    headers = {**AUTH, "Idempotency-Key": str(key or uuid.uuid4())}
    headers.update(kw.pop("headers", {}))
    return requests.post(f"{base_url}/v1/ach/credits", json=body, headers=headers, timeout=5)


def test_a_known_credit_key_gets_the_original_answer_and_is_sent_once(sandbox):
    key, payment_id = uuid.uuid4(), uuid.uuid4()

    first = credit(sandbox.base_url, key=key, payment_id=payment_id)
    second = credit(sandbox.base_url, key=key, payment_id=payment_id)

    assert (first.status_code, second.status_code) == (201, 200)
    assert second.json() == first.json()
    stats = sandbox.stats()
    assert stats["credits_sent"] == {str(key): 1}
    assert stats["credits_sent_by_payment"] == {str(payment_id): 1}
    assert (stats["total_credits_sent"], stats["credits"]) == (1, 1)
    assert stats["total_charges"] == 0  # a credit is no charge
    assert stats["requests"] == {"credit_create": 2}


def test_a_credit_key_reused_for_another_request_is_422_and_not_sent(sandbox):
    key = uuid.uuid4()
    credit(sandbox.base_url, key=key, amount="5.00")

    answer = credit(sandbox.base_url, key=key, amount="50.00")

    assert answer.status_code == 422
    assert "different request" in answer.json()["error"]
    assert sandbox.stats()["total_credits_sent"] == 1


def test_credits_and_debits_keep_their_own_keys(sandbox):
    key = uuid.uuid4()

    debited = debit(sandbox.base_url, key=key)
    credited = credit(sandbox.base_url, key=key)

    assert (debited.status_code, credited.status_code) == (201, 201)
    assert sandbox.debit(str(key)).direction == "debit"
    assert sandbox.credit(str(key)).direction == "credit"


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        ({"amount": "5"}, "amount", "2 places"),
        ({"amount": "-1.00"}, "amount", "2 places"),
        ({"currency": "EUR"}, "currency", "unsupported currency"),
        ({"payment_id": "1; drop table"}, "payment_id", "UUID"),
        ({"destination_token": "tok with space"}, "destination_token", "characters"),
        ({"destination_token": 12}, "destination_token", "string"),
    ],
)
def test_a_malformed_credit_is_a_400_naming_the_field(sandbox, body, field, message):
    answer = credit(sandbox.base_url, body=body)

    assert answer.status_code == 400
    assert message in answer.json()["errors"][field][0]
    assert answer.json()["error"].startswith("invalid credit request")
    assert sandbox.stats()["total_credits_sent"] == 0


def test_a_credit_naming_a_source_token_instead_of_a_destination_is_refused(sandbox):
    headers = {**AUTH, "Idempotency-Key": str(uuid.uuid4())}
    body = {
        "payment_id": str(uuid.uuid4()),
        "amount": "1.00",
        "currency": "USD",
        "source_token": "tok_x",
    }

    answer = requests.post(
        f"{sandbox.base_url}/v1/ach/credits", json=body, headers=headers, timeout=5
    )

    assert answer.status_code == 400
    assert answer.json()["errors"] == {"destination_token": ["this field is required"]}


def test_a_credit_without_the_api_key_is_401_and_not_sent(sandbox):
    answer = credit(sandbox.base_url, headers={"Authorization": "Bearer wrong"})
    looked_up = requests.get(f"{sandbox.base_url}/v1/ach/credits/{uuid.uuid4()}", timeout=5)

    assert (answer.status_code, looked_up.status_code) == (401, 401)
    assert sandbox.stats()["total_credits_sent"] == 0


def test_a_credit_is_read_back_by_key_and_an_unknown_key_is_404(sandbox):
    key = uuid.uuid4()
    created = credit(sandbox.base_url, key=key).json()

    known = requests.get(f"{sandbox.base_url}/v1/ach/credits/{key}", headers=AUTH, timeout=5)
    as_debit = requests.get(f"{sandbox.base_url}/v1/ach/debits/{key}", headers=AUTH, timeout=5)

    assert known.status_code == 200
    assert known.json()["processor_id"] == created["processor_id"]
    assert as_debit.status_code == 404


def test_the_token_fault_rules_apply_to_credits_too(sandbox):
    answer = credit(sandbox.base_url, token="tok_fail5xx_1_payout")
    again = credit(sandbox.base_url, token="tok_fail5xx_1_payout")

    assert (answer.status_code, again.status_code) == (503, 201)
    assert sandbox.stats()["total_credits_sent"] == 1


def test_a_credit_settles_with_callbacks_stating_its_direction(with_callbacks, receiver):
    payment_id = uuid.uuid4()

    credit(with_callbacks.base_url, payment_id=payment_id, amount="7.25")

    wait_for(lambda: len(receiver.received) == 2)
    bodies = receiver.bodies()
    assert [b["event_type"] for b in bodies] == ["submitted", "settled"]
    assert {b["payment_id"] for b in bodies} == {str(payment_id)}
    assert {b["direction"] for b in bodies} == {"credit"}
    assert {b["amount"] for b in bodies} == {"7.25"}
    wait_for(lambda: with_callbacks.events_made() == bodies)


def test_a_credit_to_a_token_naming_r03_is_returned_r03_after_settling(with_callbacks, receiver):
    key, payment_id = uuid.uuid4(), uuid.uuid4()

    credit(with_callbacks.base_url, key=key, payment_id=payment_id, token="tok_payout_R03")

    wait_for(lambda: len(receiver.received) == 3)
    bodies = receiver.bodies()
    assert [(b["event_type"], b.get("reason_code")) for b in bodies] == [
        ("submitted", None),
        ("settled", None),
        ("returned", "R03"),
    ]
    assert {b["direction"] for b in bodies} == {"credit"}
    assert with_callbacks.credit(str(key)).status == "returned"
    page = requests.get(f"{with_callbacks.base_url}/v1/events", headers=AUTH, timeout=5).json()
    assert [(e["payment_id"], e["event_type"]) for e in page["data"]] == [
        (str(payment_id), "submitted"),
        (str(payment_id), "settled"),
        (str(payment_id), "returned"),
    ]


def test_the_reference_client_sends_a_credit_once_per_key(sandbox):
    client = ProcessorClient(base_url=sandbox.base_url)
    key = uuid.uuid4()

    first = client.credit_create(
        idempotency_key=key,
        payment_id=uuid.uuid4(),
        amount="3.10",
        currency="USD",
        destination_token="tok_refund_02",
    )
    status = client.credit_get(idempotency_key=key)

    assert first.created and status.found
    assert status.processor_id == first.processor_id
    assert not client.credit_get(idempotency_key=uuid.uuid4()).found
    with pytest.raises(ProcessorCallRejected):
        client.credit_create(
            idempotency_key=uuid.uuid4(),
            payment_id=uuid.uuid4(),
            amount="3.10",
            currency="USD",
            destination_token="tok_reject_refund",
        )
    assert sandbox.stats()["credits_sent"] == {str(key): 1}


def test_the_statement_lists_an_accounts_credits_and_debits_in_order_and_no_other(sandbox):
    credit(
        sandbox.base_url,
        amount="0.07",
        token="tok_stmt_01",
        body={"company_entry_description": "ACCTVERIFY"},
    )
    credit(sandbox.base_url, amount="0.32", token="tok_stmt_01")
    debit(sandbox.base_url, amount="0.39", token="tok_stmt_01")
    credit(sandbox.base_url, amount="5.00", token="tok_stmt_other")

    answer = requests.get(f"{sandbox.base_url}/_sandbox/statement?token=tok_stmt_01", timeout=5)

    assert answer.status_code == 200
    entries = answer.json()["entries"]
    assert [(e["direction"], e["amount"]) for e in entries] == [
        ("credit", "0.07"),
        ("credit", "0.32"),
        ("debit", "0.39"),
    ]
    assert entries[0]["company_entry_description"] == "ACCTVERIFY"
    assert entries[1]["company_entry_description"] == ""


@pytest.mark.parametrize("query", ["", "?token=", "?token=a%20b", "?token=x&token=y"])
def test_the_statement_without_one_well_formed_token_is_400_naming_it(sandbox, query):
    answer = requests.get(f"{sandbox.base_url}/_sandbox/statement{query}", timeout=5)

    assert answer.status_code == 400
    assert answer.json()["error"].startswith("token:")


def test_a_debit_made_after_an_injected_timeout_keeps_when_its_call_arrived():
    sandbox = SandboxProcessor(
        api_key="test-processor-key",
        signing_secret="s",
        faults=FaultConfig(p_timeout=1.0, timeout_seconds=0.3),
        seed=3,
    ).start()
    try:
        with pytest.raises(requests.Timeout):
            requests.post(
                f"{sandbox.base_url}/v1/ach/debits",
                json={"payment_id": str(uuid.uuid4()), "amount": "1.00", "currency": "USD",
                      "source_token": "tok_arrival_01"},
                headers={**AUTH, "Idempotency-Key": str(uuid.uuid4())},
                timeout=0.1,
            )  # fmt: skip
        wait_for(lambda: sandbox.transfers_made(), timeout=5)
    finally:
        sandbox.stop()

    [made] = sandbox.transfers_made()
    gap = datetime.fromisoformat(made["created_at"]) - datetime.fromisoformat(made["received_at"])
    assert gap >= timedelta(seconds=0.3)
    assert made["source_token"] == "tok_arrival_01"
