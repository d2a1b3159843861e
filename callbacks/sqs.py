"""The one place that talks to SQS: a reused boto3 client, cached queue URLs, typed errors.

Every function here acts immediately on the network; none of them may be called inside a
transaction that can still roll back (use the outbox or ``transaction.on_commit``).

Each function that calls SQS, here or through here, is declared in ``callbacks.sqs_access`` with
its operations, queues and process roles: the IAM policies are built from that table, and tests
fail on a call site it does not declare.
"""

import json
import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from callbacks import conf as callbacks_conf

logger = logging.getLogger(__name__)

# Long polls last up to 20 s, so the read timeout must exceed that; connecting must fail fast so
# the callback endpoint can answer 503 quickly when the queue endpoint is down.
_CONFIG = Config(
    connect_timeout=2,
    read_timeout=25,
    retries={"max_attempts": 2, "mode": "standard"},
    max_pool_connections=20,
)

_lock = threading.Lock()
_client = None
_client_key: tuple | None = None
_queue_urls: dict[str, str] = {}


class QueueUnavailable(Exception):
    """SQS (or the local server) could not be reached or refused the call."""


@dataclass(frozen=True)
class OutgoingMessage:
    body: dict
    group_id: str
    deduplication_id: str


def sqs_client():
    """A process-wide boto3 SQS client for the current settings (rebuilt if they change)."""
    global _client, _client_key
    key = (callbacks_conf.SQS_ENDPOINT_URL, callbacks_conf.AWS_REGION)
    with _lock:
        if _client is None or _client_key != key:
            _client = boto3.client(
                "sqs",
                region_name=callbacks_conf.AWS_REGION,
                endpoint_url=callbacks_conf.SQS_ENDPOINT_URL or None,
                config=_CONFIG,
            )
            _client_key = key
            _queue_urls.clear()
        return _client


def reset() -> None:
    """Forget the client and cached URLs (tests, or after the endpoint setting changes)."""
    global _client, _client_key
    with _lock:
        _client = None
        _client_key = None
        _queue_urls.clear()


def queue_url(name: str) -> str:
    client = sqs_client()
    cache_key = f"{callbacks_conf.SQS_ENDPOINT_URL}|{name}"
    url = _queue_urls.get(cache_key)
    if url is None:
        try:
            url = client.get_queue_url(QueueName=name)["QueueUrl"]
        except (BotoCoreError, ClientError) as exc:
            raise QueueUnavailable(f"cannot resolve queue {name!r}: {exc}") from exc
        _queue_urls[cache_key] = url
    return url


def main_queue_url() -> str:
    return queue_url(callbacks_conf.SQS_QUEUE_NAME)


def dead_letter_queue_url() -> str:
    return queue_url(callbacks_conf.SQS_DLQ_NAME)


def send_message_now(
    *, body: dict, group_id: str, deduplication_id: str, url: str | None = None
) -> str:
    """Send one message to a FIFO queue (the main queue by default); return its message id."""
    try:
        response = sqs_client().send_message(
            QueueUrl=url or main_queue_url(),
            MessageBody=json.dumps(body, separators=(",", ":")),
            MessageGroupId=group_id,
            MessageDeduplicationId=deduplication_id,
        )
    except (BotoCoreError, ClientError) as exc:
        raise QueueUnavailable(f"send to SQS failed: {exc}") from exc
    return response["MessageId"]


def send_messages_now(messages: Iterable[OutgoingMessage], *, url: str | None = None) -> list[str]:
    """Send up to ten messages in one batch call; raise unless every one was accepted.

    Returns the message ids in order. A partial failure raises ``QueueUnavailable`` naming the
    failed entries; resending the accepted ones is harmless (same deduplication ids).
    """
    batch = list(messages)
    if not batch:
        return []
    if len(batch) > 10:
        raise ValueError("SQS batches hold at most 10 messages")
    entries = [
        {
            "Id": str(i),
            "MessageBody": json.dumps(m.body, separators=(",", ":")),
            "MessageGroupId": m.group_id,
            "MessageDeduplicationId": m.deduplication_id,
        }
        for i, m in enumerate(batch)
    ]
    try:
        response = sqs_client().send_message_batch(
            QueueUrl=url or main_queue_url(), Entries=entries
        )
    except (BotoCoreError, ClientError) as exc:
        raise QueueUnavailable(f"batch send to SQS failed: {exc}") from exc
    failed = response.get("Failed") or []
    if failed:
        detail = ", ".join(f"{f['Id']}: {f.get('Code')} {f.get('Message', '')}" for f in failed)
        raise QueueUnavailable(f"SQS refused {len(failed)} of {len(batch)} messages ({detail})")
    ids = {int(s["Id"]): s["MessageId"] for s in response.get("Successful", [])}
    return [ids[i] for i in range(len(batch))]


def queue_attributes(url: str, names: Iterable[str] = ("All",)) -> dict[str, str]:
    try:
        return sqs_client().get_queue_attributes(QueueUrl=url, AttributeNames=list(names))[
            "Attributes"
        ]
    except (BotoCoreError, ClientError) as exc:
        raise QueueUnavailable(f"cannot read attributes of {url}: {exc}") from exc
