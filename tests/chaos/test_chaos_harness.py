"""The parts of the chaos run the invariants depend on: the cuttable queue proxy, the source
tokens it pays with, and its settings."""

import json
import random
import socket
import threading
from decimal import Decimal

import pytest

from chaos.config import FIRST_LARGE_DEBIT, Config, SetupError, environment
from chaos.load import TOKEN_MIX, refusal, source_token
from chaos.processes import TcpProxy
from chaos.review import SINGLE_CAP, daily_cap, decision, risk_limits
from devstack.processes import free_port
from payments.exposure_limits import Limits
from payments.services import validate_source_token
from sandbox.faults import _COUNTED_RULE


@pytest.fixture
def echo_port():
    """A TCP echo server on loopback."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                while data := conn.recv(1024):
                    conn.sendall(data)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield port
    stop.set()
    thread.join(2)
    server.close()


def _echo(port: int, payload: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=2) as conn:
        conn.sendall(payload)
        return conn.recv(1024)


def test_the_proxy_passes_traffic_refuses_it_when_cut_and_serves_the_same_port_again(echo_port):
    proxy = TcpProxy(free_port(), echo_port).start()
    try:
        assert _echo(proxy.listen_port, b"before") == b"before"
        open_conn = socket.create_connection(("127.0.0.1", proxy.listen_port), timeout=2)
        open_conn.sendall(b"open")
        assert open_conn.recv(1024) == b"open"

        proxy.cut()

        with pytest.raises(ConnectionRefusedError):
            _echo(proxy.listen_port, b"during")
        # A connection opened before the cut is broken too, as when the endpoint goes away.
        try:
            open_conn.sendall(b"x")
            assert open_conn.recv(1024) == b""
        except ConnectionResetError:
            pass
        open_conn.close()

        proxy.restore()

        assert _echo(proxy.listen_port, b"after") == b"after"
    finally:
        proxy.close()


def test_every_source_token_is_accepted_by_the_api_and_rules_hit_their_prefix():
    rng = random.Random(3)
    tokens = [source_token(rng, i) for i in range(2000)]

    for token in tokens:
        validate_source_token(token)  # raises on a token the API would refuse
    prefixes = {prefix for _, prefix in TOKEN_MIX}
    assert {t.rsplit("_p", 1)[0] for t in tokens} == prefixes | {"tok_chaos"}
    counted = [t for t in tokens if t.startswith("tok_fail5xx_2")]
    assert counted and all(_COUNTED_RULE.match(t).group(2) == "2" for t in counted)


def test_config_names_a_bad_setting(monkeypatch):
    monkeypatch.setenv("CHAOS_PAYMENTS", "many")
    with pytest.raises(SetupError, match="CHAOS_PAYMENTS='many' is not a whole number"):
        Config.from_env()
    monkeypatch.setenv("CHAOS_PAYMENTS", "0")
    with pytest.raises(SetupError, match="CHAOS_PAYMENTS must be at least 1"):
        Config.from_env()
    monkeypatch.setenv("CHAOS_PAYMENTS", "150")
    monkeypatch.setenv("CHAOS_DATABASE", "payments; drop")
    with pytest.raises(SetupError, match="CHAOS_DATABASE"):
        Config.from_env()


def test_config_defaults_scale_the_fault_window_with_the_payments(monkeypatch):
    for name in ("CHAOS_SECONDS", "CHAOS_DATABASE", "CHAOS_SEED", "CHAOS_QUIESCE_SECONDS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CHAOS_PAYMENTS", "150")

    config = Config.from_env()

    assert (config.payments, config.seconds, config.database) == (150, 97, "payments_chaosrun")


def test_each_run_draws_its_own_seed_unless_one_is_given(monkeypatch):
    monkeypatch.delenv("CHAOS_SEED", raising=False)

    seeds = {Config.from_env().seed for _ in range(5)}

    assert len(seeds) > 1 and all(1 <= seed < 2**31 for seed in seeds)
    monkeypatch.setenv("CHAOS_SEED", "7")
    assert Config.from_env().seed == 7
    monkeypatch.setenv("CHAOS_SEED", "-3")
    with pytest.raises(SetupError, match="CHAOS_SEED must be at least 1"):
        Config.from_env()


def test_the_load_retries_a_409_key_in_use_and_takes_a_limit_s_409_as_its_answer():
    in_use = {"error": {"type": "idempotency_error", "code": "idempotency_key_in_use"}}
    over = {
        "error": {
            "type": "invalid_request_error",
            "code": "exposure_limit_exceeded",
            "param": "debit_daily_limit",
        }
    }

    assert refusal(409, in_use) is None
    assert refusal(409, over) == "exposure_limit_exceeded:debit_daily_limit"
    # Not a refusal: a success, a 5xx, a 409 whose body is not the module's envelope.
    assert refusal(201, over) is None
    assert refusal(503, over) is None
    assert refusal(409, None) is None
    assert refusal(409, {"error": "busy"}) is None
    assert refusal(409, {"error": {"code": ""}}) is None


def test_the_run_s_daily_caps_are_60_percent_of_each_capped_merchant_s_load():
    assert daily_cap(1000) == Decimal("15000")  # 100 debits of 250.50 on average
    assert daily_cap(60) == Decimal("900")
    assert daily_cap(5) == Decimal("500.00")  # the floor

    limits = risk_limits(1000)

    assert sorted(limits) == ["merchant-0", "merchant-1", "merchant-2"]
    assert limits["merchant-0"]["debit"] == {"single": Decimal("450.00"), "daily": Decimal("15000")}
    assert limits["merchant-2"]["debit"]["window_banking_days"] == 5
    for caps in limits.values():
        Limits(**caps["debit"])  # each a valid set of caps
    assert [caps["credit"]["daily"] for caps in limits.values()] == [
        Decimal("60.00"),
        Decimal("150.00"),
        Decimal("150.00"),
    ]


def test_the_single_cap_refuses_some_load_debits_and_the_held_ones_fall_elsewhere():
    # Load amounts run 1.00-500.00: some pass the single cap, and a first large debit (held)
    # is larger still, so it is refused first on a merchant with a single cap.
    assert Decimal("1.00") < SINGLE_CAP < Decimal(FIRST_LARGE_DEBIT) < Decimal("500.00")
    assert json.loads(
        environment({"proxy": 1, "sandbox": 2, "web": 3, "validation": 4}, "postgres://x/y")[
            "FRAUD_RULES"
        ]
    )["first_large_debit"] == {"amount": FIRST_LARGE_DEBIT}


def test_the_reviewer_approves_and_rejects_in_turn_and_races_every_other_approval():
    decisions = [decision(n) for n in range(8)]

    assert [kind for kind, _ in decisions] == ["approve", "reject"] * 4
    assert [n for n, (_, race) in enumerate(decisions) if race] == [2, 6]
    assert all(kind == "approve" for kind, race in decisions if race)


@pytest.mark.django_db(transaction=True)
def test_the_load_records_a_create_past_a_limit_as_refused_after_one_request(live_server):
    """The load's client against the API: a create past the merchant's single-entry cap is
    answered once, recorded as refused by its limit, not retried and not counted as lost; one
    within it is created."""
    import requests
    from rest_framework.authtoken.models import Token

    from chaos.load import LoadStats, _Client
    from payments.services.limits import exposure_limit_set
    from tests.factories import UserFactory, grant

    user = UserFactory()
    grant(user, "merchant-0")
    exposure_limit_set(
        merchant_id="merchant-0",
        direction="debit",
        currency="USD",
        limits=Limits(single=SINGLE_CAP),
        user=UserFactory(is_superuser=True),
        note="the run's cap",
    )
    stats = LoadStats()
    client = _Client(live_server.url, Token.objects.create(user=user).key, stats)
    body = {"merchant_id": "merchant-0", "currency": "USD", "source_token": "tok_chaos_p00001"}

    client.create(requests.Session(), 1, "key-over", {**body, "amount": "450.01"})
    client.create(requests.Session(), 2, "key-within", {**body, "amount": "450.00"})

    assert stats.refused == {"key-over": "exposure_limit_exceeded:debit_single_limit"}
    assert list(stats.created) == ["key-within"]
    assert (stats.statuses["409"], stats.statuses["201"], stats.retries) == (1, 1, 0)
    assert stats.failures == []
