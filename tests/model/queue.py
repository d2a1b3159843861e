"""The simulated SQS: FIFO queues in process, behind the real gateway (``callbacks.sqs``).

``SimSqs`` answers the boto3 calls the gateway makes (``sqs.sqs_client`` is patched to return
it), so everything above the client runs as in production: the transaction rule, the batch
helper, the worker's deletes, releases, hides and dead letters, the outbox relay, DLQ ingestion
and the triage redrive.

What it keeps of SQS FIFO: a message group is locked while any of its messages is in flight
(received, or hidden for a backoff), and its messages come out in order; a receive returns
several messages of one group (as AWS may) or at most one (as fauxqs does), as the model says;
visibility timeouts run on the simulated clock; a deduplication id drops a send inside 5
minutes, also after the first copy was deleted; receipt handles go stale when a message is
received again; the main queue's RedrivePolicy moves a message to the DLQ on its 11th receive.
``fail_deletes`` makes the next delete calls fail: the worker's crash between its commit and
its delete, after which the message comes back when its visibility timeout runs out.
"""

from __future__ import annotations

import itertools
import json
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from botocore.exceptions import ClientError

from callbacks.services.republish import REDRIVE_KEY, released_original_id

DEDUP_WINDOW = timedelta(minutes=5)
MAX_RECEIVE_COUNT = 10


@dataclass
class SimMessage:
    message_id: str
    body: str
    group_id: str
    deduplication_id: str
    sequence: int
    sent_at: datetime
    message_attributes: dict
    visible_at: datetime
    receive_count: int = 0
    receipt: str | None = None
    deleted: bool = False
    # Where it ended when it left the queue: "deleted", or "redrive_policy" (moved to the DLQ).
    left_by: str = ""


@dataclass
class SimQueue:
    name: str
    url: str
    messages: list[SimMessage] = field(default_factory=list)
    dedup: dict[str, tuple[datetime, str]] = field(default_factory=dict)
    dead_letter_queue: SimQueue | None = None

    def live(self) -> list[SimMessage]:
        return [m for m in self.messages if not m.deleted]


def _refused(code: str, operation: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": code}}, operation)


class SimSqs:
    """A boto3 SQS client's calls, answered from in-process FIFO queues."""

    def __init__(self, clock, *, main: str, dlq: str) -> None:
        self.clock = clock
        self._lock = threading.RLock()
        self._ids = itertools.count(1)
        self.queues: dict[str, SimQueue] = {}
        self.dlq = self._queue(dlq)
        self.main = self._queue(main)
        self.main.dead_letter_queue = self.dlq
        # The model's knobs.
        self.several_per_group = False
        self.fail_deletes = 0
        # What the model reads back: every message accepted into a queue, by id.
        self.accepted: dict[str, tuple[SimQueue, SimMessage]] = {}

    def reset(self) -> None:
        """Empty queues, for the next example."""
        for queue in self.queues.values():
            queue.messages.clear()
            queue.dedup.clear()
        self.accepted.clear()
        self.several_per_group = False
        self.fail_deletes = 0

    def _queue(self, name: str) -> SimQueue:
        queue = SimQueue(name=name, url=f"https://sim.sqs/{name}")
        self.queues[queue.url] = queue
        return queue

    def _by_url(self, url: str, operation: str) -> SimQueue:
        try:
            return self.queues[url]
        except KeyError:
            raise _refused("AWS.SimpleQueueService.NonExistentQueue", operation) from None

    # --- what the model reads ------------------------------------------------------------------

    def root_message_id(self, message_id: str) -> str:
        """The message a republished copy stands for: a redrive names its original in its body,
        a hold's release in its deduplication id; followed back to the first one."""
        seen = set()
        while message_id not in seen:
            seen.add(message_id)
            found = self.accepted.get(message_id)
            if found is None:
                return message_id
            message = found[1]
            try:
                body = json.loads(message.body)
            except ValueError:
                return message_id
            redrive = body.get(REDRIVE_KEY) if isinstance(body, dict) else None
            released = released_original_id(message.deduplication_id)
            if isinstance(redrive, dict) and redrive.get("original_message_id"):
                message_id = redrive["original_message_id"]
            elif released:
                message_id = released
            else:
                return message_id
        return message_id

    def sequence_of(self, message_id: str) -> int | None:
        found = self.accepted.get(message_id)
        return found[1].sequence if found else None

    def idle(self) -> bool:
        """Nothing left in the main queue."""
        return not self.main.live()

    def next_visible_in(self) -> timedelta | None:
        now = self.clock.now()
        waits = [m.visible_at - now for m in self.main.live() if m.visible_at > now]
        return min(waits) if waits else None

    # --- the client's calls ----------------------------------------------------------------

    def get_queue_url(self, *, QueueName: str) -> dict:  # noqa: N803 - boto3's names
        for queue in self.queues.values():
            if queue.name == QueueName:
                return {"QueueUrl": queue.url}
        raise _refused("AWS.SimpleQueueService.NonExistentQueue", "GetQueueUrl")

    def get_queue_attributes(self, *, QueueUrl: str, AttributeNames=()) -> dict:  # noqa: N803
        queue = self._by_url(QueueUrl, "GetQueueAttributes")
        attributes = {
            "FifoQueue": "true",
            "VisibilityTimeout": "30",
            "ApproximateNumberOfMessages": str(len(queue.live())),
        }
        if queue.dead_letter_queue is not None:
            attributes["RedrivePolicy"] = json.dumps(
                {
                    "deadLetterTargetArn": f"arn:aws:sqs:::{queue.dead_letter_queue.name}",
                    "maxReceiveCount": MAX_RECEIVE_COUNT,
                }
            )
        return {"Attributes": attributes}

    def send_message(
        self,
        *,
        QueueUrl: str,  # noqa: N803
        MessageBody: str,  # noqa: N803
        MessageGroupId: str,  # noqa: N803
        MessageDeduplicationId: str,  # noqa: N803
        MessageAttributes: dict | None = None,  # noqa: N803
    ) -> dict:
        with self._lock:
            queue = self._by_url(QueueUrl, "SendMessage")
            return {
                "MessageId": self._send(
                    queue, MessageBody, MessageGroupId, MessageDeduplicationId, MessageAttributes
                )
            }

    def send_message_batch(self, *, QueueUrl: str, Entries: list[dict]) -> dict:  # noqa: N803
        with self._lock:
            queue = self._by_url(QueueUrl, "SendMessageBatch")
            successful = []
            for entry in Entries:
                message_id = self._send(
                    queue,
                    entry["MessageBody"],
                    entry["MessageGroupId"],
                    entry["MessageDeduplicationId"],
                    entry.get("MessageAttributes"),
                )
                successful.append({"Id": entry["Id"], "MessageId": message_id})
            return {"Successful": successful, "Failed": []}

    def _send(
        self,
        queue: SimQueue,
        body: str,
        group_id: str,
        deduplication_id: str,
        attributes: dict | None,
    ) -> str:
        now = self.clock.now()
        known = queue.dedup.get(deduplication_id)
        if known is not None and now - known[0] < DEDUP_WINDOW:
            return known[1]  # a repeat inside the window: accepted, and dropped
        message_id = f"sim-{next(self._ids):06d}"
        message = SimMessage(
            message_id=message_id,
            body=body,
            group_id=group_id,
            deduplication_id=deduplication_id,
            sequence=next(self._ids),
            sent_at=now,
            message_attributes=dict(attributes or {}),
            visible_at=now,
        )
        queue.messages.append(message)
        queue.dedup[deduplication_id] = (now, message_id)
        self.accepted[message_id] = (queue, message)
        return message_id

    def receive_message(
        self,
        *,
        QueueUrl: str,  # noqa: N803
        MaxNumberOfMessages: int = 1,  # noqa: N803
        VisibilityTimeout: int = 30,  # noqa: N803
        **_: object,
    ) -> dict:
        with self._lock:
            queue = self._by_url(QueueUrl, "ReceiveMessage")
            now = self.clock.now()
            live = queue.live()
            locked = {m.group_id for m in live if m.receipt is not None and m.visible_at > now}
            taken: list[SimMessage] = []
            taken_groups: set[str] = set()
            for message in live:
                if len(taken) >= MaxNumberOfMessages:
                    break
                group = message.group_id
                if group in locked or message.visible_at > now:
                    locked.add(group)  # nothing of a group overtakes its head
                    continue
                if group in taken_groups and not self.several_per_group:
                    locked.add(group)
                    continue
                if (
                    queue.dead_letter_queue is not None
                    and message.receive_count >= MAX_RECEIVE_COUNT
                ):
                    self._move_to_dead_letter_queue(queue, message)
                    continue
                message.receive_count += 1
                message.receipt = f"rh-{message.message_id}-{message.receive_count}"
                message.visible_at = now + timedelta(seconds=VisibilityTimeout)
                taken.append(message)
                taken_groups.add(group)
            return {"Messages": [self._as_received(m) for m in taken]}

    def _move_to_dead_letter_queue(self, queue: SimQueue, message: SimMessage) -> None:
        message.deleted = True
        message.left_by = "redrive_policy"
        dlq = queue.dead_letter_queue
        moved = SimMessage(
            message_id=message.message_id,
            body=message.body,
            group_id=message.group_id,
            deduplication_id=message.deduplication_id,
            sequence=message.sequence,
            sent_at=message.sent_at,
            message_attributes=message.message_attributes,
            visible_at=self.clock.now(),
            receive_count=message.receive_count,
        )
        dlq.messages.append(moved)

    @staticmethod
    def _as_received(message: SimMessage) -> dict:
        received = {
            "MessageId": message.message_id,
            "ReceiptHandle": message.receipt,
            "Body": message.body,
            "Attributes": {
                "MessageGroupId": message.group_id,
                "MessageDeduplicationId": message.deduplication_id,
                "SequenceNumber": str(message.sequence),
                "SentTimestamp": str(int(message.sent_at.timestamp() * 1000)),
                "ApproximateReceiveCount": str(message.receive_count),
            },
        }
        if message.message_attributes:
            received["MessageAttributes"] = message.message_attributes
        return received

    def _holding(self, queue: SimQueue, receipt: str) -> SimMessage | None:
        for message in queue.live():
            if message.receipt == receipt:
                return message
        return None

    def delete_message(self, *, QueueUrl: str, ReceiptHandle: str) -> dict:  # noqa: N803
        with self._lock:
            queue = self._by_url(QueueUrl, "DeleteMessage")
            message = self._holding(queue, ReceiptHandle)
            if message is None:
                raise _refused("ReceiptHandleIsInvalid", "DeleteMessage")
            message.deleted = True
            message.left_by = "deleted"
            return {}

    def delete_message_batch(self, *, QueueUrl: str, Entries: list[dict]) -> dict:  # noqa: N803
        with self._lock:
            queue = self._by_url(QueueUrl, "DeleteMessageBatch")
            successful, failed = [], []
            for entry in Entries:
                message = self._holding(queue, entry["ReceiptHandle"])
                if queue is self.main and self.fail_deletes > 0:
                    failed.append({"Id": entry["Id"], "Code": "InternalError", "Message": "crash"})
                elif message is None:
                    failed.append({"Id": entry["Id"], "Code": "ReceiptHandleIsInvalid"})
                else:
                    message.deleted = True
                    message.left_by = "deleted"
                    successful.append({"Id": entry["Id"]})
            if queue is self.main and self.fail_deletes > 0 and Entries:
                self.fail_deletes -= 1
            return {"Successful": successful, "Failed": failed}

    def _change(self, queue: SimQueue, receipt: str, seconds: int) -> bool:
        message = self._holding(queue, receipt)
        now = self.clock.now()
        if message is None or message.visible_at <= now:
            return False  # stale handle, or no longer in flight
        message.visible_at = now + timedelta(seconds=seconds)
        return True

    def change_message_visibility(
        self,
        *,
        QueueUrl: str,  # noqa: N803
        ReceiptHandle: str,  # noqa: N803
        VisibilityTimeout: int,  # noqa: N803
    ) -> dict:
        with self._lock:
            queue = self._by_url(QueueUrl, "ChangeMessageVisibility")
            if not self._change(queue, ReceiptHandle, VisibilityTimeout):
                raise _refused("MessageNotInflight", "ChangeMessageVisibility")
            return {}

    def change_message_visibility_batch(self, *, QueueUrl: str, Entries: list[dict]) -> dict:  # noqa: N803
        with self._lock:
            queue = self._by_url(QueueUrl, "ChangeMessageVisibilityBatch")
            successful, failed = [], []
            for entry in Entries:
                if self._change(queue, entry["ReceiptHandle"], entry["VisibilityTimeout"]):
                    successful.append({"Id": entry["Id"]})
                else:
                    failed.append({"Id": entry["Id"], "Code": "MessageNotInflight"})
            return {"Successful": successful, "Failed": failed}
