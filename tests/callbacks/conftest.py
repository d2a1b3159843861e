"""Fixtures of the queue layer's tests that more than one module uses."""

import socket
import threading

import pytest

from callbacks import sqs


@pytest.fixture
def queue_down(module_settings):
    """Point the SQS endpoint at a closed loopback port; call the fixture to bring it back."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    endpoint = module_settings.SQS_ENDPOINT_URL
    module_settings.SQS_ENDPOINT_URL = f"http://127.0.0.1:{port}"
    sqs.reset()

    def back_up():
        module_settings.SQS_ENDPOINT_URL = endpoint
        sqs.reset()

    yield back_up
    sqs.reset()


@pytest.fixture
def sent_ids(monkeypatch):
    """Outbox ids in every batch the relay actually sent (the real send still happens)."""
    sent: list[int] = []
    lock = threading.Lock()
    real = sqs.send_messages_now

    def recording(messages, **kwargs):
        messages = list(messages)
        ids = real(messages, **kwargs)
        with lock:
            sent.extend(m.body["outbox_id"] for m in messages)
        return ids

    monkeypatch.setattr(sqs, "send_messages_now", recording)
    return sent
