"""The one place that talks to SQS: a reused boto3 client, cached queue URLs, typed errors.

No other module of the product imports boto3 for SQS (a lint rule refuses it; the vault's KMS
gateway, ``bank.vault.kms``, is the one other importer). Every function here acts
immediately on the network, and each refuses to run inside a database transaction that can
still roll back (``SqsCallInTransaction``): a message sent there outlives a rollback, and a
network wait there holds the transaction's locks. Publish through the outbox or
``transaction.on_commit`` instead; the rare caller for which a call inside a transaction is
safe says so with ``transaction_allowed()`` and a comment saying why.

Transport errors and refusals raise ``QueueUnavailable`` (a refusal, ``QueueRefused``, carries
SQS's error code). Batch calls are split into SQS's chunks of ten by one helper, which reports
each entry as done, refused (SQS's ``Failed``) or unreachable (its chunk's call failed).

``send_message_coalesced_now`` lets the threads of one process that send at the same time share
one ``SendMessageBatch`` (boto3's CPU is per call, not per message); each caller still gets the
answer for its own message (``CoalescingSender``, in ``callbacks.sqs_coalescing``, which calls
no SQS itself). The values and errors are in ``callbacks.sqs_messages``; both are named here,
and callers import them from here. The worker's ``VisibilityHeartbeat`` stays in the gateway:
it calls SQS on its own thread, and the IAM table counts it as part of the gateway.

Each function that calls SQS, here or through here, is declared in ``callbacks.sqs_access`` with
its operations, queues and process roles: the IAM policies are built from that table, and tests
fail on a call site it does not declare.
"""

import json
import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar

# The gateway itself: with bank.vault.kms, the only modules of the apps the lint lets import
# boto3.
import boto3  # noqa: TID251
from botocore.config import Config  # noqa: TID251
from botocore.exceptions import BotoCoreError, ClientError  # noqa: TID251
from django.db import connections

from callbacks import conf as callbacks_conf

# Named here for every caller: the gateway's values and errors, and the coalescing sender.
from callbacks.sqs_coalescing import BATCH_MAX_BYTES as BATCH_MAX_BYTES
from callbacks.sqs_coalescing import CoalescingSender, RequestGauge
from callbacks.sqs_messages import (
    BATCH_LIMIT,
    BatchOutcome,
    OutgoingMessage,
    QueueRefused,
    QueueUnavailable,
    R,
    ReceivedMessage,
    SqsCallInTransaction,
    T,
)
from callbacks.sqs_messages import HasReceiptHandle as HasReceiptHandle

logger = logging.getLogger(__name__)

# Long polls last up to 20 s, so the read timeout must exceed that; connecting must fail fast so
# the callback endpoint can answer 503 quickly when the queue endpoint is down.
# Every parameter the client is called with is built by this module from our own values, so
# botocore's check of them against the service model is skipped: it was 0.03-0.06 ms of the
# 0.8 ms of CPU a call costs (docs/benchmarks.md). The test suite runs that check instead, on
# every call a test makes through this gateway (tests/conftest.py, ``SqsParameterCheck``).
_CONFIG = Config(
    connect_timeout=2,
    read_timeout=25,
    retries={"max_attempts": 2, "mode": "standard"},
    max_pool_connections=20,
    parameter_validation=False,
)
_MISSING_QUEUE_CODES = {"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"}

_lock = threading.Lock()
_client = None
_client_key: tuple | None = None
_queue_urls: dict[str, str] = {}
_allowed_in_transaction: ContextVar[bool] = ContextVar("sqs_allowed_in_transaction", default=False)


# --- the transaction rule ---------------------------------------------------------------------


def _open_transaction_alias() -> str | None:
    """The alias of a connection inside an atomic block that can still roll back, if any.

    The atomic blocks a Django test case wraps each test in are ignored, exactly as Django's own
    ``atomic(durable=True)`` check ignores them: they stand for "no transaction" in a test.
    """
    for connection in connections.all(initialized_only=True):
        if connection.in_atomic_block and any(
            not getattr(block, "_from_testcase", False) for block in connection.atomic_blocks
        ):
            return connection.alias
    return None


def _ensure_outside_transaction(what: str) -> None:
    if _allowed_in_transaction.get():
        return
    alias = _open_transaction_alias()
    if alias is not None:
        raise SqsCallInTransaction(
            f"{what}: SQS is called inside a transaction on database {alias!r}; call it after "
            "the commit (transaction.on_commit, the outbox) or, where that is safe, inside "
            "callbacks.sqs.transaction_allowed()"
        )


@contextmanager
def transaction_allowed() -> Iterator[None]:
    """Let the SQS calls made in this block run inside a database transaction.

    For the few callers for which that is safe (say why where you use it): typically a call
    whose effect is harmless if the transaction rolls back and that holds no lock worth
    speaking of while it waits.
    """
    token = _allowed_in_transaction.set(True)
    try:
        yield
    finally:
        _allowed_in_transaction.reset(token)


@contextmanager
def _transport(what: str) -> Iterator[None]:
    """Run one SQS call: outside any transaction, its errors as ``QueueUnavailable``."""
    _ensure_outside_transaction(what)
    try:
        yield
    except ClientError as exc:
        error = exc.response.get("Error", {})
        code, detail = str(error.get("Code") or ""), str(error.get("Message") or "")
        raise QueueRefused(f"{what}: {exc}", code=code, detail=detail) from exc
    except BotoCoreError as exc:
        raise QueueUnavailable(f"{what}: {exc}") from exc


def _in_batches(
    items: Sequence[T],
    *,
    what: str,
    entry: Callable[[T], dict],
    call: Callable[[list[dict]], dict],
) -> BatchOutcome[T]:
    """Call ``call`` with ``items`` in chunks of ten (``entry`` builds each one's fields) and
    read SQS's ``Successful``/``Failed`` answers back onto the items. A chunk whose call fails
    marks its items unreachable; the other chunks are still sent."""
    outcome: BatchOutcome[T] = BatchOutcome()
    for start in range(0, len(items), BATCH_LIMIT):
        chunk = items[start : start + BATCH_LIMIT]
        entries = [{"Id": str(i), **entry(item)} for i, item in enumerate(chunk)]
        try:
            with _transport(what):
                response = call(entries)
        except QueueUnavailable as exc:
            outcome.unreachable += [(item, str(exc)) for item in chunk]
            continue
        failed = {
            int(f["Id"]): f"{f.get('Code', '')} {f.get('Message', '')}".strip()
            for f in response.get("Failed") or []
        }
        own_fault = {int(f["Id"]) for f in response.get("Failed") or [] if f.get("SenderFault")}
        successful = {int(s["Id"]): s for s in response.get("Successful") or []}
        for i, item in enumerate(chunk):
            if i in failed:
                outcome.refused.append((item, failed[i]))
                if i in own_fault:
                    outcome.sender_fault.append(item)
            else:
                outcome.done.append(item)
                outcome.results.append(successful.get(i, {}))
    return outcome


# --- client and queues ------------------------------------------------------------------------


def sqs_client():
    """A process-wide boto3 SQS client for the current settings (rebuilt if they change), its
    endpoint resolved once: every call reuses it and its connection pool. Keyed by the process
    too: a forked child (a prefork pool, a server that preloads) builds its own rather than
    share its parent's sockets."""
    global _client, _client_key
    key = (os.getpid(), callbacks_conf.SQS_ENDPOINT_URL, callbacks_conf.AWS_REGION)
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
        with _transport(f"cannot resolve queue {name!r}"):
            url = client.get_queue_url(QueueName=name)["QueueUrl"]
        _queue_urls[cache_key] = url
    return url


def main_queue_url() -> str:
    return queue_url(callbacks_conf.SQS_QUEUE_NAME)


def dead_letter_queue_url() -> str:
    return queue_url(callbacks_conf.SQS_DLQ_NAME)


def queue_find(name: str) -> str | None:
    """The URL of queue ``name``, or None when it does not exist (uncached: for set-up)."""
    try:
        with _transport(f"cannot look up queue {name!r}"):
            return sqs_client().get_queue_url(QueueName=name)["QueueUrl"]
    except QueueRefused as exc:
        if exc.code in _MISSING_QUEUE_CODES:
            return None
        raise


def queue_create(*, name: str, attributes: dict[str, str]) -> str:
    """Create queue ``name`` (SQS returns the existing one if its attributes match); its URL."""
    with _transport(f"create_queue {name!r} failed"):
        return sqs_client().create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]


def queue_attributes(url: str, names: Iterable[str] = ("All",)) -> dict[str, str]:
    with _transport(f"cannot read attributes of {url}"):
        return sqs_client().get_queue_attributes(QueueUrl=url, AttributeNames=list(names))[
            "Attributes"
        ]


def queue_attributes_set(*, url: str, attributes: dict[str, str]) -> None:
    with _transport(f"set_queue_attributes on {url} failed"):
        sqs_client().set_queue_attributes(QueueUrl=url, Attributes=attributes)


# --- messages ---------------------------------------------------------------------------------


def send_message_now(
    *,
    body: dict,
    group_id: str,
    deduplication_id: str,
    url: str | None = None,
    attributes: dict | None = None,
) -> str:
    """Send one message to a FIFO queue (the main queue by default), with ``attributes`` as its
    MessageAttributes (``callbacks.tracing.outgoing_attributes``); return its message id."""
    target = url or main_queue_url()
    with _transport("send to SQS failed"):
        response = sqs_client().send_message(
            QueueUrl=target,
            MessageBody=json.dumps(body, separators=(",", ":")),
            MessageGroupId=group_id,
            MessageDeduplicationId=deduplication_id,
            **({"MessageAttributes": attributes} if attributes else {}),
        )
    return response["MessageId"]


def send_messages_each_now(
    messages: Sequence[OutgoingMessage], *, url: str | None = None
) -> BatchOutcome[OutgoingMessage]:
    """Send up to ten messages in one batch call and report what became of each one.

    Entry ids are the positions in ``messages`` (unique per call). An entry SQS refuses is in
    ``refused`` with SQS's code and message; if the call itself fails, every entry is in
    ``unreachable``. Nothing raises for a failed entry: the caller answers for each one.
    """
    if len(messages) > BATCH_LIMIT:
        raise ValueError("SQS batches hold at most 10 messages")
    if not messages:
        return BatchOutcome()
    target = url or main_queue_url()
    client = sqs_client()
    return _in_batches(
        messages,
        what="batch send to SQS failed",
        entry=lambda m: {
            "MessageBody": m.text,
            "MessageGroupId": m.group_id,
            "MessageDeduplicationId": m.deduplication_id,
            **({"MessageAttributes": m.attributes} if m.attributes else {}),
        },
        call=lambda entries: client.send_message_batch(QueueUrl=target, Entries=entries),
    )


def send_messages_now(messages: Iterable[OutgoingMessage], *, url: str | None = None) -> list[str]:
    """Send up to ten messages in one batch call; raise unless every one was accepted.

    Returns the message ids in order. A partial failure raises ``QueueUnavailable`` naming the
    failed entries; resending the accepted ones is harmless (same deduplication ids).
    """
    batch = list(messages)
    outcome = send_messages_each_now(batch, url=url)
    if outcome.unreachable:
        raise QueueUnavailable(outcome.unreachable[0][1])
    if outcome.refused:
        position = {id(m): i for i, m in enumerate(batch)}
        detail = ", ".join(f"{position[id(m)]}: {why}" for m, why in outcome.refused)
        raise QueueUnavailable(
            f"SQS refused {len(outcome.refused)} of {len(batch)} messages ({detail})"
        )
    return [result["MessageId"] for result in outcome.results]


# --- coalesced sends (the sender itself: callbacks.sqs_coalescing) ----------------------------

# Per process (keyed by pid: a forked child builds its own, never shares its parent's locks).
_coalescers: dict[tuple[int, float], CoalescingSender] = {}
_request_gauges: dict[int, RequestGauge] = {}
_announced: ContextVar[bool] = ContextVar("sqs_coalesced_send_announced", default=False)


def _request_gauge() -> RequestGauge:
    pid = os.getpid()
    gauge = _request_gauges.get(pid)
    if gauge is None:
        with _lock:
            gauge = _request_gauges.setdefault(pid, RequestGauge())
    return gauge


def _coalescer(window: float) -> CoalescingSender:
    key = (os.getpid(), window)
    sender = _coalescers.get(key)
    if sender is None:
        sender = CoalescingSender(
            window=window, send_batch=send_messages_each_now, requests=_request_gauge()
        )
        with _lock:
            sender = _coalescers.setdefault(key, sender)
    return sender


@contextmanager
def coalesced_send_expected() -> Iterator[None]:
    """Announce a request that may call ``send_message_coalesced_now`` (wrap the whole request
    in it): how many such requests run at once tells a batch how many callers may join it."""
    gauge = _request_gauge()
    gauge.enter()
    token = _announced.set(True)
    try:
        yield
    finally:
        _announced.reset(token)
        gauge.leave()


def send_message_coalesced_now(
    *,
    body: dict,
    group_id: str,
    deduplication_id: str,
    window: float,
    attributes: dict | None = None,
) -> str:
    """Send one message to the main queue, in one batch call with the messages other threads
    of this process send at the same time (waiting at most ``window`` seconds for them);
    return its message id once SQS accepted it, or raise ``QueueUnavailable`` if SQS refused
    it or could not be reached. Callers that do not announce their requests
    (``coalesced_send_expected``) still join an open batch, but no batch waits for them."""
    _ensure_outside_transaction("send to SQS")  # checked in the caller's thread, not the leader's
    message = OutgoingMessage(
        body=body,
        group_id=group_id,
        deduplication_id=deduplication_id,
        attributes=attributes or {},
    )
    return _coalescer(window).send(message, url=main_queue_url(), announced=_announced.get())


def receive_messages(
    *, url: str, max_messages: int, wait_seconds: int, visibility_timeout: int
) -> list[ReceivedMessage]:
    """Receive up to ``max_messages`` (at most ten) with every attribute the product reads."""
    with _transport(f"receive from {url} failed"):
        response = sqs_client().receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=max_messages,
            WaitTimeSeconds=wait_seconds,
            VisibilityTimeout=visibility_timeout,
            AttributeNames=["All"],
            MessageSystemAttributeNames=["All"],
            MessageAttributeNames=["All"],
        )
    return [ReceivedMessage.from_sqs(m) for m in response.get("Messages") or []]


def delete_message(*, url: str, receipt_handle: str) -> None:
    with _transport(f"delete from {url} failed"):
        sqs_client().delete_message(QueueUrl=url, ReceiptHandle=receipt_handle)


def delete_messages(*, url: str, messages: Sequence[R]) -> BatchOutcome[R]:
    client = sqs_client()
    return _in_batches(
        messages,
        what=f"batch delete from {url} failed",
        entry=lambda m: {"ReceiptHandle": m.receipt_handle},
        call=lambda entries: client.delete_message_batch(QueueUrl=url, Entries=entries),
    )


def change_visibility(*, url: str, receipt_handle: str, seconds: int) -> None:
    with _transport(f"change of visibility on {url} failed"):
        sqs_client().change_message_visibility(
            QueueUrl=url, ReceiptHandle=receipt_handle, VisibilityTimeout=seconds
        )


def change_visibility_batch(*, url: str, messages: Sequence[R], seconds: int) -> BatchOutcome[R]:
    client = sqs_client()
    return _in_batches(
        messages,
        what=f"batch change of visibility on {url} failed",
        entry=lambda m: {"ReceiptHandle": m.receipt_handle, "VisibilityTimeout": seconds},
        call=lambda entries: client.change_message_visibility_batch(QueueUrl=url, Entries=entries),
    )


class VisibilityHeartbeat:
    """Keeps the unfinished messages of the worker's current batch invisible while they wait or
    run.

    Every ``visibility_timeout / 3`` seconds it sets their visibility back to the full timeout,
    so a slow processor call never lets the timeout run out and a second worker take the
    message. Untracking takes the same lock as a beat, so once ``untrack`` returns no beat can
    overwrite a backoff or release the worker has just set.
    """

    def __init__(self, *, queue_url: str, visibility_timeout: int) -> None:
        self.queue_url = queue_url
        self.visibility_timeout = visibility_timeout
        self.interval = max(visibility_timeout / 3, 0.2)
        self._tracked: dict[str, ReceivedMessage] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="sqs-visibility-heartbeat")
        self._thread.daemon = True
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def track(self, messages: Iterable[ReceivedMessage]) -> None:
        with self._lock:
            for m in messages:
                self._tracked[m.message_id] = m

    def untrack(self, message_ids: Iterable[str]) -> None:
        with self._lock:
            for message_id in message_ids:
                self._tracked.pop(message_id, None)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.beat()

    def beat(self) -> None:
        with self._lock:
            tracked = list(self._tracked.values())
            outcome = change_visibility_batch(
                url=self.queue_url, messages=tracked, seconds=self.visibility_timeout
            )
        for message, why in outcome.unreachable:
            logger.warning(
                "visibility heartbeat failed for message %s: %s", message.message_id, why
            )
        for message, why in outcome.refused:
            logger.warning(
                "visibility heartbeat refused for message %s: %s", message.message_id, why
            )
