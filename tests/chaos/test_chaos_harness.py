"""The parts of the chaos run the invariants depend on: the cuttable queue proxy, the source
tokens it pays with, and its settings."""

import random
import socket
import threading

import pytest

from chaos.config import Config, SetupError
from chaos.load import TOKEN_MIX, source_token
from chaos.processes import TcpProxy
from devstack.processes import free_port
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
