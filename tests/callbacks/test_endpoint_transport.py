"""A chunked callback (no Content-Length) through real HTTP servers: read whole up to the limit
under gunicorn, refused with 411 by a server that cannot say where the body ends; never a 401
because the body was not read."""

import http.client
import json
from pathlib import Path

import pytest

from payments import signing
from tests.callbacks.test_endpoint import SECRET, event_body, queued_messages
from tests.gunicorn_support import free_port, gunicorn_running, gunicorn_test_env

ROOT = Path(__file__).resolve().parents[2]
URL = "/callbacks/processor/"


@pytest.fixture
def gunicorn_url(sqs_queues, module_settings, tmp_path):
    port = free_port()
    env = gunicorn_test_env(module_settings, port, CALLBACK_SIGNING_SECRETS=SECRET)
    with gunicorn_running(env, tmp_path / "gunicorn.log"):
        yield port


def post_chunked(port: int, raw: bytes, *, signature: str | None = None) -> tuple[int, dict]:
    """POST ``raw`` in 1 KiB chunks with Transfer-Encoding: chunked and no Content-Length."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {
        "Content-Type": "application/json",
        signing.HEADER: signature or signing.sign(raw, [SECRET]),
    }
    chunks = (raw[i : i + 1024] for i in range(0, len(raw), 1024))
    try:
        connection.request("POST", URL, body=chunks, headers=headers, encode_chunked=True)
        response = connection.getresponse()
        return response.status, json.loads(response.read() or b"{}")
    finally:
        connection.close()


@pytest.mark.subprocess
def test_a_chunked_callback_is_read_whole_and_accepted_under_gunicorn(sqs_queues, gunicorn_url):
    body = event_body(message="m" * 900, note="x" * 5000)
    status, answer = post_chunked(gunicorn_url, json.dumps(body).encode())
    assert (status, answer["processor_event_id"]) == (202, body["processor_event_id"])
    [message] = queued_messages(sqs_queues)
    assert json.loads(message["Body"])["event"]["note"] == "x" * 5000


@pytest.mark.subprocess
def test_an_oversized_chunked_callback_is_413_not_401_under_gunicorn(sqs_queues, gunicorn_url):
    raw = json.dumps(event_body(note="p" * (70 * 1024))).encode()
    status, answer = post_chunked(gunicorn_url, raw, signature="t=1,v1=00")
    assert status == 413
    assert "larger than 65536 bytes" in answer["error"]["message"]
    assert queued_messages(sqs_queues) == []


@pytest.mark.subprocess
def test_a_chunked_callback_with_a_bad_signature_is_401_after_reading_it(sqs_queues, gunicorn_url):
    raw = json.dumps(event_body()).encode()
    status, answer = post_chunked(gunicorn_url, raw, signature=signing.sign(b"other", [SECRET]))
    assert status == 401
    assert "does not match" in answer["error"]["message"]


def test_a_chunked_callback_is_411_on_a_server_that_cannot_frame_it(sqs_queues, live_server):
    port = int(live_server.url.rsplit(":", 1)[1])
    status, answer = post_chunked(port, json.dumps(event_body()).encode())
    assert status == 411
    assert "Content-Length" in answer["error"]["message"]
    assert queued_messages(sqs_queues) == []
