"""The sandbox's events API (``GET /v1/events``) and its dropped callbacks, over real HTTP."""

import uuid

import pytest
import requests

from sandbox import FaultConfig, SandboxProcessor
from sandbox.faults import FaultPlan
from tests.sandbox.test_sandbox import AUTH, CallbackReceiver
from tests.waiting import wait_for


@pytest.fixture
def receiver():
    receiver = CallbackReceiver()
    yield receiver
    receiver.stop()


def start(receiver=None, **faults) -> SandboxProcessor:
    return SandboxProcessor(
        api_key="test-processor-key",
        signing_secret="s",
        callback_url=receiver.url if receiver else None,
        faults=FaultConfig(settle_after_seconds=0.01, **faults),
        callback_backoff_seconds=0.01,
        seed=5,
    ).start()


def debit(sandbox, token: str = "tok_ok") -> str:
    payment_id = str(uuid.uuid4())
    response = requests.post(
        f"{sandbox.base_url}/v1/ach/debits",
        json={
            "payment_id": payment_id,
            "amount": "10.00",
            "currency": "USD",
            "source_token": token,
        },
        headers={**AUTH, "Idempotency-Key": str(uuid.uuid4())},
        timeout=5,
    )
    assert response.status_code == 201
    return payment_id


def events(sandbox, **params) -> requests.Response:
    return requests.get(f"{sandbox.base_url}/v1/events", params=params, headers=AUTH, timeout=5)


def test_the_events_api_pages_every_event_in_order_with_opaque_cursors():
    with start() as sandbox:
        payments = [debit(sandbox) for _ in range(3)]
        wait_for(lambda: len(sandbox.events_made()) == 6, 10, "six events")

        seen, after = [], None
        while True:
            body = events(sandbox, **({"after": after} if after else {}), limit=4).json()
            seen += body["data"]
            after = body["next_cursor"]
            if not body["has_more"]:
                break

        assert [e["processor_event_id"] for e in seen] == [
            e["processor_event_id"] for e in sandbox.events_made()
        ]
        for payment_id in payments:
            mine = [e["event_type"] for e in seen if e["payment_id"] == payment_id]
            assert mine == ["submitted", "settled"]
        assert events(sandbox, after=after).json() == {
            "data": [],
            "next_cursor": after,
            "has_more": False,
        }
        assert [r["limit"] for r in sandbox.events_requests] == [4, 4, 100]


def test_the_events_api_lists_a_callback_it_never_delivered(receiver):
    with start(receiver) as sandbox:
        sandbox.drops.set(1.0, ["settled"])
        payment_id = debit(sandbox)
        wait_for(lambda: len(sandbox.events_made()) == 2, 10, "two events")
        wait_for(lambda: sandbox.callbacks.pending == 0, 10, "deliveries done")

        listed = [(e["event_type"], e["payment_id"]) for e in events(sandbox).json()["data"]]
        delivered = [b["event_type"] for b in receiver.bodies()]
        [dropped] = sandbox.drops.dropped()

    assert listed == [("submitted", payment_id), ("settled", payment_id)]
    assert delivered == ["submitted"]
    assert (dropped["event_type"], dropped["payment_id"]) == ("settled", payment_id)


def test_a_dropped_callback_is_not_delivered_by_its_duplicate_either(receiver):
    with start(receiver) as sandbox:
        sandbox.drops.set(1.0, None)
        debit(sandbox, token="tok_dupcb_1")
        wait_for(lambda: len(sandbox.events_made()) == 2, 10, "two events")
        wait_for(lambda: sandbox.callbacks.pending == 0, 10, "deliveries done")
        stats = sandbox.stats()

    assert receiver.bodies() == []
    assert stats["callbacks_dropped"] == 2  # once each, though each was due twice


@pytest.mark.parametrize(
    ("params", "status", "error"),
    [
        ({"after": "c1.other.0"}, 400, "unknown cursor"),
        ({"after": "c1.x.99999"}, 400, "unknown cursor"),
        ({"limit": "0"}, 400, "limit must be 1-500"),
        ({"limit": "501"}, 400, "limit must be 1-500"),
        ({"limit": "ten"}, 400, "limit must be 1-500"),
    ],
)
def test_the_events_api_refuses_a_cursor_or_limit_it_does_not_know(params, status, error):
    with start() as sandbox:
        response = events(sandbox, **params)

    assert response.status_code == status
    assert error in response.json()["error"]


def test_the_events_api_wants_the_api_key_and_fails_in_an_outage():
    with start() as sandbox:
        unauthorized = requests.get(f"{sandbox.base_url}/v1/events", timeout=5)
        sandbox.outage_start("503")
        down = events(sandbox)

    assert unauthorized.status_code == 401
    assert down.status_code == 503


def test_a_reset_makes_old_cursors_unknown():
    with start() as sandbox:
        debit(sandbox)
        wait_for(lambda: len(sandbox.events_made()) == 2, 10, "two events")
        cursor = events(sandbox).json()["next_cursor"]
        sandbox.reset()

        assert events(sandbox, after=cursor).status_code == 400


def test_the_drops_control_endpoint_sets_the_share_and_lists_what_it_dropped(receiver):
    with start(receiver) as sandbox:
        url = f"{sandbox.base_url}/_sandbox/drops"
        refused = [
            requests.post(url, json=body, timeout=5).status_code
            for body in ({"share": 2}, {"share": "all"}, {"share": 1, "types": []}, [1])
        ]
        set_ = requests.post(url, json={"share": 1, "event_types": ["settled"]}, timeout=5)
        debit(sandbox)
        wait_for(lambda: sandbox.drops.dropped(), 10, "a drop")
        listed = requests.get(url, timeout=5).json()

    assert refused == [400, 400, 400, 400]
    assert set_.json() == {"share": 1.0, "event_types": ["settled"], "dropped": []}
    assert [d["event_type"] for d in listed["dropped"]] == ["settled"]


def test_the_drop_share_is_read_from_the_environment_and_leaves_the_other_faults_as_seeded():
    config = FaultConfig.from_env({"SANDBOX_P_DROPPED_CALLBACK": "0.25", "SANDBOX_P_5XX": "0.3"})
    assert config.p_dropped_callback == 0.25
    with pytest.raises(ValueError, match="p_dropped_callback"):
        FaultConfig(p_dropped_callback=1.5)
    # The fault plan draws as it did before drops existed.
    plain = FaultPlan(FaultConfig(p_5xx=0.3), seed=11)
    with_drops = FaultPlan(config, seed=11)
    assert [plain.debit_fault("tok_x").kind for _ in range(50)] == [
        with_drops.debit_fault("tok_x").kind for _ in range(50)
    ]
