"""The sandbox processor over real HTTP: idempotency, validation, signed callbacks, faults."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests

from payments import signing
from payments.catalogue import event_type_names
from payments.selectors import percentile
from sandbox import DebitLatch, FaultConfig, SandboxProcessor
from sandbox.faults import DebitFault, FaultKind, FaultPlan
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
AUTH = {"Authorization": "Bearer test-processor-key"}


class CallbackReceiver:
    """A stand-in for our callback endpoint: records what arrives, answers as told."""

    def __init__(self, answers=()):
        self.received = []
        self.answers = list(answers)  # statuses for the first requests; then 202
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                raw = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.received.append(
                    {"raw": raw, "signature": self.headers.get(signing.HEADER)}
                )
                status = receiver.answers.pop(0) if receiver.answers else 202
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/callbacks/processor/"
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    def bodies(self):
        return [json.loads(r["raw"]) for r in self.received]

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    server = CallbackReceiver()
    yield server
    server.stop()


def start_sandbox(callback_url=None, **faults):
    return SandboxProcessor(
        callback_url=callback_url,
        faults=FaultConfig(**{"settle_after_seconds": 0.02, **faults}),
        callback_backoff_seconds=0.02,
    ).start()


def debit(base_url, *, key=None, payment_id=None, amount="12.50", token="tok_sandbox_01", **kw):
    body = {
        "payment_id": str(payment_id or uuid.uuid4()),
        "amount": amount,
        "currency": "USD",
        "source_token": token,
    }
    body.update(kw.pop("body", {}))
    headers = {**AUTH, "Idempotency-Key": str(key or uuid.uuid4())}
    headers.update(kw.pop("headers", {}))
    return requests.post(f"{base_url}/v1/ach/debits", json=body, headers=headers, timeout=5)


def test_known_key_gets_the_original_result_and_is_charged_once(sandbox):
    key, payment_id = uuid.uuid4(), uuid.uuid4()

    first = debit(sandbox.base_url, key=key, payment_id=payment_id)
    second = debit(sandbox.base_url, key=key, payment_id=payment_id)

    assert first.status_code == 201
    assert second.status_code == 200
    assert second.json() == first.json()
    stats = requests.get(f"{sandbox.base_url}/_sandbox/stats", timeout=5).json()
    assert stats["total_charges"] == 1
    assert stats["charges"] == {str(key): 1}
    assert stats["charges_by_payment"] == {str(payment_id): 1}
    assert stats["replays"] == 1


def test_known_key_with_a_different_request_is_refused(sandbox):
    key = uuid.uuid4()
    debit(sandbox.base_url, key=key, amount="12.50")

    answer = debit(sandbox.base_url, key=key, amount="99.00")

    assert answer.status_code == 422
    assert "different request" in answer.json()["error"]
    assert sandbox.stats()["total_charges"] == 1


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        ({"amount": "12.5"}, "amount", "2 places"),
        ({"amount": "0.00"}, "amount", "greater than zero"),
        ({"currency": "EUR"}, "currency", "unsupported currency"),
        ({"payment_id": "nope"}, "payment_id", "UUID"),
        ({"source_token": "has spaces"}, "source_token", "characters"),
    ],
)
def test_malformed_debit_is_a_400_naming_the_field(sandbox, body, field, message):
    answer = debit(sandbox.base_url, body=body)

    assert answer.status_code == 400
    assert message in answer.json()["errors"][field][0]
    assert field in answer.json()["error"]
    assert sandbox.stats()["total_charges"] == 0


def test_missing_fields_and_bad_json_are_400(sandbox):
    headers = {**AUTH, "Idempotency-Key": str(uuid.uuid4()), "Content-Type": "application/json"}
    url = f"{sandbox.base_url}/v1/ach/debits"

    missing = requests.post(url, data=b"{}", headers=headers, timeout=5)
    not_json = requests.post(url, data=b"{nope", headers=headers, timeout=5)

    assert missing.status_code == 400
    assert missing.json()["errors"]["source_token"] == ["this field is required"]
    assert not_json.status_code == 400
    assert "not valid JSON" in not_json.json()["error"]


def test_idempotency_key_is_required_and_must_be_a_uuid(sandbox):
    missing = requests.post(
        f"{sandbox.base_url}/v1/ach/debits",
        json={
            "payment_id": str(uuid.uuid4()),
            "amount": "1.00",
            "currency": "USD",
            "source_token": "tok_x_abcdef",
        },
        headers=AUTH,
        timeout=5,
    )
    bad = debit(sandbox.base_url, headers={"Idempotency-Key": "abc"})

    assert missing.status_code == 400
    assert "Idempotency-Key" in missing.json()["error"]
    assert bad.status_code == 400
    assert "must be a UUID" in bad.json()["error"]


def test_wrong_or_missing_bearer_key_is_401(sandbox):
    wrong = debit(sandbox.base_url, headers={"Authorization": "Bearer nope"})
    missing = requests.get(f"{sandbox.base_url}/v1/ach/debits/{uuid.uuid4()}", timeout=5)

    assert wrong.status_code == 401
    assert missing.status_code == 401
    assert sandbox.stats()["total_charges"] == 0


def test_get_debit_reports_status_and_404_for_unknown_key(sandbox):
    key = uuid.uuid4()
    created = debit(sandbox.base_url, key=key).json()

    known = requests.get(f"{sandbox.base_url}/v1/ach/debits/{key}", headers=AUTH, timeout=5)
    unknown = requests.get(
        f"{sandbox.base_url}/v1/ach/debits/{uuid.uuid4()}", headers=AUTH, timeout=5
    )

    assert known.status_code == 200
    assert known.json()["processor_id"] == created["processor_id"]
    assert unknown.status_code == 404
    wait_for(lambda: sandbox.debit(str(key)).status == "settled")


def test_reset_forgets_debits_and_counts(sandbox):
    debit(sandbox.base_url)

    requests.post(f"{sandbox.base_url}/_sandbox/reset", timeout=5)

    assert sandbox.stats()["total_charges"] == 0
    assert sandbox.stats()["debits"] == 0


def test_callbacks_are_signed_and_verify_with_the_endpoint_verifier(receiver, module_settings):
    sandbox = start_sandbox(receiver.url)
    try:
        payment_id = uuid.uuid4()
        debit(sandbox.base_url, payment_id=payment_id, amount="30.00")
        wait_for(lambda: len(receiver.received) == 2)
    finally:
        sandbox.stop()

    bodies = receiver.bodies()
    assert [b["event_type"] for b in bodies] == ["submitted", "settled"]
    assert {b["payment_id"] for b in bodies} == {str(payment_id)}
    assert {b["amount"] for b in bodies} == {"30.00"}
    assert len({b["processor_event_id"] for b in bodies}) == 2
    assert all(b["event_type"] in event_type_names() for b in bodies)
    assert [d["processor_event_id"] for d in sandbox.callbacks_delivered()] == [
        b["processor_event_id"] for b in bodies
    ]
    for delivery in receiver.received:
        signing.verify(
            delivery["signature"], delivery["raw"], module_settings.CALLBACK_SIGNING_SECRETS
        )
        with pytest.raises(signing.SignatureError, match="does not match"):
            signing.verify(delivery["signature"], delivery["raw"], ["another-secret"])
        with pytest.raises(signing.SignatureError):
            signing.verify(delivery["signature"], delivery["raw"] + b" ", ["test-signing-secret"])


def test_callbacks_carry_fields_the_callback_contract_requires(receiver):
    from datetime import datetime

    sandbox = start_sandbox(receiver.url)
    try:
        debit(sandbox.base_url, token="tok_return_abc")
        wait_for(lambda: len(receiver.received) == 2)
    finally:
        sandbox.stop()

    submitted, returned = receiver.bodies()
    assert returned["event_type"] == "returned"
    assert returned["reason_code"] == "R01"
    for body in (submitted, returned):
        assert datetime.fromisoformat(body["timestamp"]).utcoffset() is not None
        assert 1 <= len(body["processor_event_id"]) <= 128


def test_callback_delivery_is_retried_after_a_failure():
    receiver = CallbackReceiver(answers=[500, 503])
    sandbox = start_sandbox(receiver.url)
    try:
        debit(sandbox.base_url)
        wait_for(lambda: sandbox.stats()["callbacks_sent"] == 2)
    finally:
        sandbox.stop()
        receiver.stop()

    bodies = receiver.bodies()
    # The submitted event failed twice and was delivered on its third try, before settled.
    assert [b["event_type"] for b in bodies] == ["submitted"] * 3 + ["settled"]
    assert len({b["processor_event_id"] for b in bodies[:3]}) == 1
    assert sandbox.stats()["callback_failed_attempts"] == 2


def test_callback_delivery_gives_up_after_max_attempts_and_counts_it():
    receiver = CallbackReceiver(answers=[500] * 10)
    sandbox = SandboxProcessor(
        callback_url=receiver.url,
        faults=FaultConfig(settle_after_seconds=0.01),
        callback_max_attempts=3,
        callback_backoff_seconds=0.01,
    ).start()
    try:
        debit(sandbox.base_url)
        wait_for(lambda: sandbox.stats()["callbacks_given_up"] == 2)
    finally:
        sandbox.stop()
        receiver.stop()

    assert len(receiver.received) == 6
    assert sandbox.stats()["callbacks_sent"] == 0


def test_duplicate_callback_rule_sends_each_event_twice_with_the_same_id(receiver):
    sandbox = start_sandbox(receiver.url)
    try:
        debit(sandbox.base_url, token="tok_dupcb_abc")
        wait_for(lambda: len(receiver.received) == 4)
    finally:
        sandbox.stop()

    bodies = receiver.bodies()
    ids = [b["processor_event_id"] for b in bodies]
    assert len(set(ids)) == 2
    assert all(ids.count(i) == 2 for i in ids)
    assert [b["event_type"] for b in bodies].index("settled") >= 2


def test_delayed_callbacks_wait_the_configured_delay(receiver):
    sandbox = start_sandbox(receiver.url, p_delayed_callback=1.0, callback_delay_seconds=0.4)
    try:
        started = time.monotonic()
        debit(sandbox.base_url)
        wait_for(lambda: len(receiver.received) == 1)
        first_after = time.monotonic() - started
    finally:
        sandbox.stop()

    assert first_after >= 0.4


def test_timeout_fault_answers_late_but_still_charges(sandbox):
    key = uuid.uuid4()
    with pytest.raises(requests.exceptions.ReadTimeout):
        requests.post(
            f"{sandbox.base_url}/v1/ach/debits",
            json={
                "payment_id": str(uuid.uuid4()),
                "amount": "5.00",
                "currency": "USD",
                "source_token": "tok_timeout_1_x",
            },
            headers={**AUTH, "Idempotency-Key": str(key)},
            timeout=0.2,
        )

    assert sandbox.stats()["total_charges"] == 0  # still sleeping: not charged yet
    in_flight = debit(sandbox.base_url, key=key, token="tok_timeout_1_x", amount="5.00")
    assert in_flight.status_code == 409
    wait_for(lambda: sandbox.stats()["total_charges"] == 1)


def test_rules_429_and_5xx_count_calls_per_token(sandbox):
    statuses = [debit(sandbox.base_url, token="tok_429_2_abc").status_code for _ in range(3)]
    limited = debit(sandbox.base_url, token="tok_429_1_zzz")

    assert statuses == [429, 429, 201]
    assert limited.headers["Retry-After"] == "2"
    assert [debit(sandbox.base_url, token="tok_fail5xx_1_a").status_code for _ in range(2)] == [
        503,
        201,
    ]


def test_seeded_faults_are_reproducible():
    config = FaultConfig(p_5xx=0.2, p_4xx=0.1, p_timeout=0.1, latency_median_ms=20)

    def run(seed):
        plan = FaultPlan(config, seed)
        return [plan.debit_fault(f"tok_seed_{i}") for i in range(200)]

    first, again, other = run(7), run(7), run(8)

    assert first == again
    assert first != other
    kinds = [f.kind for f in first]
    assert 20 <= kinds.count("5xx") <= 60
    assert kinds.count("none") > 100


def test_a_questionable_token_escapes_the_random_faults_that_would_take_it_another_way():
    # Every random fault certain: a 4xx on each call, a return before settlement each time.
    plan = FaultPlan(FaultConfig(p_4xx=1.0, p_return=1.0, p_settled_return=1.0), seed=3)

    assert plan.debit_fault("tok_seed_1").kind == "4xx"
    assert plan.returns("tok_seed_1")
    assert [plan.debit_fault(f"tok_questionable_{i}").kind for i in range(50)] == ["none"] * 50
    assert not any(plan.returns(f"tok_questionable_{i}") for i in range(50))
    assert plan.settled_return_code("tok_questionable_1") == "R17"


@pytest.mark.parametrize("config", [{"p_5xx": 1.0}, {"p_4xx": 1.0}, {"p_timeout": 1.0}])
def test_a_steady_token_escapes_every_random_fault_and_return(config):
    plan = FaultPlan(FaultConfig(**config, p_return=1.0, p_settled_return=1.0), seed=3)

    assert plan.debit_fault("tok_seed_1").kind != "none"
    assert [plan.debit_fault(f"tok_steady_{i}").kind for i in range(50)] == ["none"] * 50
    assert not any(plan.returns(f"tok_steady_{i}") for i in range(50))
    assert {plan.settled_return_code(f"tok_steady_{i}") for i in range(50)} == {None}


def test_latency_has_a_heavy_tail():
    plan = FaultPlan(FaultConfig(latency_median_ms=50, latency_sigma=1.0), seed=1)
    samples = sorted(plan.debit_fault("tok_latency").latency_seconds for _ in range(4000))

    p50, p99 = percentile(samples, 0.5), percentile(samples, 0.99)

    assert 0.04 < p50 < 0.06
    assert p99 > 5 * p50


def test_fault_config_reads_the_environment_and_names_bad_values():
    config = FaultConfig.from_env({"SANDBOX_P_5XX": "0.25", "SANDBOX_RETRY_AFTER_SECONDS": "9"})

    assert (config.p_5xx, config.retry_after_seconds) == (0.25, 9)
    with pytest.raises(ValueError, match="SANDBOX_P_4XX"):
        FaultConfig.from_env({"SANDBOX_P_4XX": "lots"})
    with pytest.raises(ValueError, match="p_timeout must be a probability"):
        FaultConfig(p_timeout=2)
    with pytest.raises(ValueError, match="must not exceed 1"):
        FaultConfig(p_5xx=0.6, p_4xx=0.6)


@pytest.mark.subprocess
def test_run_sandbox_processor_command_serves_and_stops_on_sigterm(receiver):
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings.test",
        "SANDBOX_SETTLE_AFTER_SECONDS": "0.01",
    }
    process = subprocess.Popen(
        [
            sys.executable,
            "manage.py",
            "run_sandbox_processor",
            "--port",
            "0",
            "--seed",
            "5",
            "--callback-url",
            receiver.url,
            "--p-5xx",
            "0",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        line = process.stdout.readline()
        assert line.startswith("LISTENING "), line
        base_url = f"http://127.0.0.1:{int(line.split()[1])}"
        assert debit(base_url).status_code == 201
        wait_for(lambda: len(receiver.received) == 2)
        stats = requests.get(f"{base_url}/_sandbox/stats", timeout=5).json()
        delivered = requests.get(f"{base_url}/_sandbox/callbacks", timeout=5).json()["delivered"]
        assert [d["event_type"] for d in delivered] == ["submitted", "settled"]
        assert stats["seed"] == 5
        assert stats["faults"]["settle_after_seconds"] == 0.01
    finally:
        process.send_signal(signal.SIGTERM)
        out, _ = process.communicate(timeout=10)
    assert process.returncode == 0
    assert "1 charges, 2 callbacks sent" in out


@pytest.mark.parametrize(
    ("token", "code"),
    [("tok_nsf_abc", "R01"), ("tok_unauth_abc", "R10"), ("tok_questionable_abc", "R17")],
)
def test_settle_then_return_rules_send_a_return_after_the_settlement(receiver, token, code):
    sandbox = start_sandbox(receiver.url, return_after_seconds=0.3)
    try:
        answer = debit(sandbox.base_url, token=token)
        wait_for(lambda: len(receiver.received) == 2)
        settled_seen = time.monotonic()
        wait_for(lambda: len(receiver.received) == 3)
        waited = time.monotonic() - settled_seen
        status = requests.get(
            f"{sandbox.base_url}/v1/ach/debits/{answer.json()['idempotency_key']}",
            headers=AUTH,
            timeout=5,
        ).json()["status"]
        events = sandbox.stats()["events"]
    finally:
        sandbox.stop()

    submitted, settled, returned = receiver.bodies()
    assert [b["event_type"] for b in (submitted, settled, returned)] == [
        "submitted",
        "settled",
        "returned",
    ]
    assert returned["reason_code"] == code
    # An R17 of the sandbox's is the 2024 rule's: its message says QUESTIONABLE.
    assert ("QUESTIONABLE" in returned["message"]) == (code == "R17")
    assert returned["amount"] == settled["amount"]
    assert returned["processor_event_id"] != settled["processor_event_id"]
    assert waited >= 0.2  # some time after the settlement, not with it
    assert status == "returned"
    assert events == 3


def test_random_settled_returns_follow_the_configured_probability(receiver):
    sandbox = start_sandbox(receiver.url, p_settled_return=1.0, return_after_seconds=0.01)
    try:
        for _ in range(4):
            debit(sandbox.base_url)
        wait_for(lambda: len(receiver.received) == 12)
    finally:
        sandbox.stop()

    types = [b["event_type"] for b in receiver.bodies()]
    assert types.count("returned") == 4 and types.count("settled") == 4
    assert {b["reason_code"] for b in receiver.bodies() if b["event_type"] == "returned"} <= {
        "R01",
        "R10",
    }


def test_debit_latch_holds_the_first_call_charged_but_unanswered_until_released(sandbox):
    sandbox.latch = DebitLatch(holds=1)
    key, payment_id = uuid.uuid4(), uuid.uuid4()
    answers: dict = {}
    held = threading.Thread(
        target=lambda: answers.update(first=debit(sandbox.base_url, key=key, payment_id=payment_id))
    )
    held.start()

    assert sandbox.latch.wait_held() == [str(key)]
    assert sandbox.stats()["charges"] == {str(key): 1}  # charged before the answer is held
    assert "first" not in answers
    # Other calls pass: only as many are held as the latch was given.
    assert debit(sandbox.base_url).status_code == 201
    replay = debit(sandbox.base_url, key=key, payment_id=payment_id)
    assert replay.status_code == 200
    assert "first" not in answers

    sandbox.latch.release()
    held.join(5)
    assert answers["first"].status_code == 201
    assert answers["first"].json() == replay.json()
    assert sandbox.stats()["replays"] == 1
    assert sandbox.latch.arrivals == 2  # new charges reach the latch; replays do not


def test_debit_latch_refuses_to_hold_nothing():
    with pytest.raises(ValueError, match="holds must be at least 1"):
        DebitLatch(holds=0)


def _returned_debit(sandbox, receiver, token):
    """A debit the sandbox charged, settled and returned; its three callbacks received."""
    answer = debit(sandbox.base_url, token=token)
    wait_for(lambda: len(receiver.received) == 3)
    return answer.json()["idempotency_key"]


def _dishonor(base_url, debit_key, *, key=None, code="R61"):
    return requests.post(
        f"{base_url}/v1/ach/debits/{debit_key}/dishonors",
        json={"reason_code": code, "return_event_id": "evt_x"},
        headers={**AUTH, "Idempotency-Key": str(key or uuid.uuid4())},
        timeout=5,
    )


@pytest.mark.parametrize(
    ("token", "code", "answers"),
    [
        ("tok_nsf_dh1", "R61", [("return_dishonored", "R61")]),
        ("tok_nsf_contest1", "R68", [("return_dishonored", "R68"), ("dishonor_contested", "R73")]),
        (
            "tok_unauth_contestfirst1",
            "R69",
            [("dishonor_contested", "R76"), ("return_dishonored", "R69")],
        ),
    ],
    ids=["dishonored", "contested", "contest-first"],
)
def test_a_dishonor_request_is_answered_by_the_token_rule(receiver, token, code, answers):
    sandbox = start_sandbox(receiver.url, return_after_seconds=0.05)
    try:
        debit_key = _returned_debit(sandbox, receiver, token)
        key = uuid.uuid4()
        first = _dishonor(sandbox.base_url, debit_key, key=key, code=code)
        again = _dishonor(sandbox.base_url, debit_key, key=key, code=code)
        other = _dishonor(sandbox.base_url, debit_key, key=key, code="R62")
        wait_for(lambda: len(receiver.received) == 3 + len(answers))
        time.sleep(0.2)  # nothing more comes
        stats = sandbox.stats()
    finally:
        sandbox.stop()

    assert first.status_code == 202 and first.json()["status"] == "pending"
    assert again.status_code == 200 and again.json() == first.json()
    assert other.status_code == 422
    bodies = receiver.bodies()[3:]
    assert [(b["event_type"], b["reason_code"]) for b in bodies] == answers
    assert all(b["event_type"] in event_type_names() for b in bodies)
    assert len({b["processor_event_id"] for b in bodies}) == len(bodies)
    assert stats["dishonors"] == 1


def test_a_dishonor_answer_is_delivered_twice_when_callbacks_are_duplicated(receiver):
    sandbox = start_sandbox(receiver.url, return_after_seconds=0.05, p_duplicate_callback=1.0)
    try:
        answer = debit(sandbox.base_url, token="tok_nsf_contest2")
        wait_for(lambda: len(receiver.received) == 6)  # each of the debit's three, twice
        _dishonor(sandbox.base_url, answer.json()["idempotency_key"])
        wait_for(lambda: len(receiver.received) == 10)
        time.sleep(0.2)
    finally:
        sandbox.stop()

    answers = receiver.bodies()[6:]
    assert [b["event_type"] for b in answers] == [
        "return_dishonored",
        "return_dishonored",
        "dishonor_contested",
        "dishonor_contested",
    ]
    assert answers[0] == answers[1] and answers[2] == answers[3]


@pytest.mark.parametrize(
    ("headers", "status"),
    [({"Authorization": "Bearer wrong"}, 401), ({"Idempotency-Key": "not-a-uuid"}, 400)],
    ids=["bad-key", "bad-idempotency-key"],
)
def test_a_dishonor_request_without_the_right_headers_is_refused(sandbox, headers, status):
    answer = requests.post(
        f"{sandbox.base_url}/v1/ach/debits/{uuid.uuid4()}/dishonors",
        json={"reason_code": "R61"},
        headers={**AUTH, "Idempotency-Key": str(uuid.uuid4()), **headers},
        timeout=5,
    )

    assert answer.status_code == status


class _ScriptedPlan(FaultPlan):
    """The faults of the calls in the order they arrive, then none."""

    def __init__(self, faults):
        super().__init__(FaultConfig())
        self._script = list(faults)

    def debit_fault(self, source_token):
        with self._lock:
            return self._script.pop(0) if self._script else DebitFault(FaultKind.NONE)


def test_a_call_arriving_after_its_key_was_refused_gets_the_refusal_and_charges_nothing(sandbox):
    """The first call is slow on its way in; a retry under the same key arrives first and is
    refused (400, account closed): the refusal is the key's result, so the slow call, when it
    arrives, gets it again instead of charging the key."""
    sandbox.plan = _ScriptedPlan(
        [
            DebitFault(FaultKind.NONE, latency_seconds=0.5),
            DebitFault(FaultKind.REJECTED),
        ]
    )
    key, payment_id = uuid.uuid4(), uuid.uuid4()
    with ThreadPoolExecutor(1) as pool:
        slow = pool.submit(debit, sandbox.base_url, key=key, payment_id=payment_id)
        time.sleep(0.1)
        retried = debit(sandbox.base_url, key=key, payment_id=payment_id)
        late = slow.result()

    assert retried.status_code == 400
    assert (late.status_code, late.json()) == (400, retried.json())
    assert sandbox.stats()["total_charges"] == 0
    # Another request under the refused key is still refused as one.
    assert debit(sandbox.base_url, key=key, amount="99.00").status_code == 422
