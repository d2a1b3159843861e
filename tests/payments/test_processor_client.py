"""The processor client against a scripted HTTP server, for answers the sandbox never gives."""

import json
import threading
import uuid
from datetime import timedelta
from decimal import Decimal
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.utils import timezone

from payments.exceptions import ProcessorRejected, ProcessorUnavailable
from payments.processor.backends.http import (
    RESPONSE_BODY_LIMIT,
    ProcessorAuthFailed,
    ProcessorCallRejected,
    ProcessorCallUnavailable,
    ProcessorClient,
    get_client,
    parse_retry_after,
    reset_client,
)


class ScriptedProcessor:
    """Answers each request with the next scripted (status, body, headers); records requests."""

    def __init__(self, script):
        self.script = list(script)
        self.requests = []
        scripted = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                scripted.requests.append(
                    {
                        "method": self.command,
                        "path": self.path,
                        "headers": dict(self.headers),
                        "body": self.rfile.read(length) if length else b"",
                        "client_port": self.client_address[1],
                    }
                )
                status, body, headers = scripted.script.pop(0)
                raw = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(raw)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(raw)

            do_GET = do_POST = _answer

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def scripted():
    servers = []

    def start(*script):
        server = ScriptedProcessor(script)
        servers.append(server)
        return server, ProcessorClient(base_url=server.base_url, read_timeout=2)

    yield start
    for server in servers:
        server.stop()


def create(client, key=None):
    return client.debit_create(
        idempotency_key=key or uuid.uuid4(),
        payment_id=uuid.UUID("0b7f7a44-1f3e-4a7b-9d55-3c6f00000001"),
        amount=Decimal("7.5"),
        currency="USD",
        source_token="tok_client_01",
    )


ACCEPTED = (201, {"processor_id": "pr_1", "status": "submitted"}, {})


def test_debit_sends_key_auth_and_json_body_over_one_reused_connection(scripted):
    server, client = scripted(ACCEPTED, (200, {"processor_id": "pr_1", "status": "submitted"}, {}))
    key = uuid.uuid4()

    first = create(client, key)
    second = create(client, key)

    assert (first.created, second.created) == (True, False)
    assert first.processor_id == second.processor_id == "pr_1"
    one, two = server.requests
    assert one["path"] == "/v1/ach/debits"
    assert one["headers"]["Idempotency-Key"] == str(key)
    assert two["headers"]["Idempotency-Key"] == str(key)
    assert one["headers"]["Authorization"] == "Bearer test-processor-key"
    assert one["headers"]["Content-Type"] == "application/json"
    assert json.loads(one["body"]) == {
        "payment_id": "0b7f7a44-1f3e-4a7b-9d55-3c6f00000001",
        "amount": "7.50",
        "currency": "USD",
        "source_token": "tok_client_01",
    }
    assert one["client_port"] == two["client_port"]  # keep-alive: the session was reused
    assert first.call.http_status == 201
    assert first.call.latency_ms > 0


@pytest.mark.parametrize("status", [500, 502, 503, 504, 408, 409, 429])
def test_5xx_408_409_429_are_retryable(scripted, status):
    _, client = scripted((status, {"error": "busy"}, {}))

    with pytest.raises(ProcessorCallUnavailable) as excinfo:
        create(client)

    assert isinstance(excinfo.value, ProcessorUnavailable)
    assert excinfo.value.retryable
    assert excinfo.value.call.http_status == status
    assert excinfo.value.call.error_kind == "http"
    assert excinfo.value.call.error == f"HTTP {status}: busy"


@pytest.mark.parametrize("status", [401, 403])
def test_auth_failures_are_retryable_not_a_verdict_on_the_payment(scripted, status):
    _, client = scripted((status, {"error": "bad key"}, {}))

    with pytest.raises(ProcessorAuthFailed) as excinfo:
        create(client)

    assert excinfo.value.retryable
    assert isinstance(excinfo.value, ProcessorCallUnavailable)
    assert "PROCESSOR_API_KEY" in str(excinfo.value)


@pytest.mark.parametrize("status", [400, 404, 410, 422])
def test_other_4xx_are_permanent_rejections(scripted, status):
    _, client = scripted((status, {"error": "no such account"}, {}))

    with pytest.raises(ProcessorCallRejected) as excinfo:
        create(client)

    assert isinstance(excinfo.value, ProcessorRejected)
    assert not excinfo.value.retryable
    assert excinfo.value.status == status
    assert "no such account" in str(excinfo.value)


def test_retry_after_as_an_http_date_is_turned_into_seconds(scripted):
    when = timezone.now() + timedelta(seconds=90)
    _, client = scripted(
        (503, {"error": "maintenance"}, {"Retry-After": format_datetime(when, usegmt=True)})
    )

    with pytest.raises(ProcessorCallUnavailable) as excinfo:
        create(client)

    assert 85 <= excinfo.value.retry_after <= 90


def test_2xx_with_an_unusable_body_is_retryable_not_accepted(scripted):
    _, client = scripted((201, b"<html>ok</html>", {}), (200, {"status": "submitted"}, {}))

    for _ in range(2):
        with pytest.raises(ProcessorCallUnavailable, match="unusable body") as excinfo:
            create(client)
        assert excinfo.value.call.error_kind == "http"


def test_long_response_bodies_are_truncated_in_the_record(scripted):
    _, client = scripted((500, b"x" * (RESPONSE_BODY_LIMIT + 500), {}))

    with pytest.raises(ProcessorCallUnavailable) as excinfo:
        create(client)

    body = excinfo.value.call.response_body
    assert body.startswith("x" * RESPONSE_BODY_LIMIT)
    assert body.endswith("[500 more characters]")


def test_debit_get_found_and_not_found(scripted):
    server, client = scripted(
        (200, {"processor_id": "pr_9", "status": "settled"}, {}), (404, {"error": "unknown"}, {})
    )
    key = uuid.uuid4()

    found = client.debit_get(idempotency_key=key)
    missing = client.debit_get(idempotency_key=uuid.uuid4())

    assert (found.found, found.status, found.processor_id) == (True, "settled", "pr_9")
    assert not missing.found
    assert server.requests[0]["path"] == f"/v1/ach/debits/{key}"
    assert "Idempotency-Key" not in server.requests[0]["headers"]


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("120", 120.0),
        ("1.5", 1.5),
        ("-3", 0.0),
        (None, None),
        ("", None),
        ("soon", None),
        ("nan", None),
        ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0),  # in the past: retry now
    ],
)
def test_parse_retry_after(header, expected):
    assert parse_retry_after(header) == expected


def test_module_client_is_shared_until_reset():
    first = get_client()

    assert get_client() is first
    reset_client()
    assert get_client() is not first
    reset_client()


def test_client_reads_timeouts_and_base_url_from_settings(module_settings):
    module_settings.PROCESSOR_TIMEOUT_SECONDS = 4.5
    module_settings.PROCESSOR_CONNECT_TIMEOUT_SECONDS = 1.25
    module_settings.PROCESSOR_BASE_URL = "http://processor.example/"

    client = ProcessorClient()

    assert client.timeout == (1.25, 4.5)
    assert client.base_url == "http://processor.example"


def credit(client, key=None):
    return client.credit_create(
        idempotency_key=key or uuid.uuid4(),
        payment_id=uuid.UUID("0b7f7a44-1f3e-4a7b-9d55-3c6f00000002"),
        amount=Decimal("3"),
        currency="USD",
        destination_token="tok_client_R03",
    )


def test_credit_posts_to_the_credits_endpoint_with_key_auth_and_destination_token(scripted):
    server, client = scripted(ACCEPTED, (200, {"processor_id": "pr_1", "status": "submitted"}, {}))
    key = uuid.uuid4()

    first = credit(client, key)
    second = credit(client, key)

    assert (first.created, second.created) == (True, False)
    assert first.processor_id == second.processor_id == "pr_1"
    one, two = server.requests
    assert (one["method"], one["path"]) == ("POST", "/v1/ach/credits")
    assert one["headers"]["Idempotency-Key"] == two["headers"]["Idempotency-Key"] == str(key)
    assert one["headers"]["Authorization"] == "Bearer test-processor-key"
    assert json.loads(one["body"]) == {
        "payment_id": "0b7f7a44-1f3e-4a7b-9d55-3c6f00000002",
        "amount": "3.00",
        "currency": "USD",
        "destination_token": "tok_client_R03",
    }
    assert first.call.http_status == 201
    assert first.call.url.endswith("/v1/ach/credits")


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (503, ProcessorCallUnavailable),
        (409, ProcessorCallUnavailable),
        (429, ProcessorCallUnavailable),
        (401, ProcessorAuthFailed),
        (400, ProcessorCallRejected),
        (422, ProcessorCallRejected),
    ],
)
def test_a_credits_answers_are_classified_as_a_debits(scripted, status, error):
    _, client = scripted((status, {"error": "nope"}, {"Retry-After": "3"}))

    with pytest.raises(error) as excinfo:
        credit(client)

    assert excinfo.value.call.http_status == status
    assert excinfo.value.call.error == f"HTTP {status}: nope"
    assert excinfo.value.retryable == (error is not ProcessorCallRejected)


def test_a_credits_unusable_2xx_body_is_retryable(scripted):
    _, client = scripted((201, {"processor_id": "pr_1"}, {}))

    with pytest.raises(ProcessorCallUnavailable, match="unusable body"):
        credit(client)


def test_credit_get_found_and_not_found(scripted):
    server, client = scripted(
        (200, {"processor_id": "pr_7", "status": "returned"}, {}), (404, {"error": "unknown"}, {})
    )
    key = uuid.uuid4()

    found = client.credit_get(idempotency_key=key)
    missing = client.credit_get(idempotency_key=uuid.uuid4())

    assert (found.found, found.status, found.processor_id) == (True, "returned", "pr_7")
    assert not missing.found
    assert server.requests[0]["path"] == f"/v1/ach/credits/{key}"
    assert "Idempotency-Key" not in server.requests[0]["headers"]


def test_the_reference_client_supports_credits_and_events():
    client = ProcessorClient(base_url="http://processor.example")

    assert client.supports_credits and client.supports_events


def test_the_environments_proxy_is_honoured_and_read_once_per_base_url(scripted, monkeypatch):
    """requests read the proxy variables on every call (a sixth of a submission's CPU); the
    client reads them once per base URL, and still sends through the proxy they name."""
    proxy, _ = scripted(ACCEPTED, ACCEPTED)
    for name in ("NO_PROXY", "no_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", proxy.base_url)
    monkeypatch.delenv("http_proxy", raising=False)
    client = ProcessorClient(base_url="http://processor.invalid", read_timeout=2)

    first = create(client)
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # nothing listens there
    second = create(client)

    assert (first.processor_id, second.processor_id) == ("pr_1", "pr_1")
    # A proxy is sent the whole URL: both calls went through the one named at the first.
    assert [r["path"] for r in proxy.requests] == ["http://processor.invalid/v1/ach/debits"] * 2
