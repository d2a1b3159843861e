"""Waiting until the chaos run has nothing left moving: nothing queued, running, unpublished,
waiting out the processor's outage or undelivered, then the dead letters taken in from the
DLQ."""

from __future__ import annotations

import re
import time

import requests

from chaos.config import STALL_SECONDS


class Settling:
    """The settling steps, as methods of the run (``ChaosRun``), which holds the ports, the
    environment, the config and ``manage``."""

    def sandbox_stats(self) -> dict:
        response = requests.get(
            f"http://127.0.0.1:{self.ports['sandbox']}/_sandbox/stats", timeout=10
        )
        response.raise_for_status()
        return response.json()

    def backlog(self) -> dict[str, int]:
        from django.db import connection

        from callbacks import sqs
        from callbacks.models import UNFINISHED_STATUSES, HoldKind, PaymentHold, QueueMessage
        from payments.models import OutboxMessage
        from payments.webhooks.models import DeliveryStatus, Event, WebhookDelivery

        connection.close()  # the run may have terminated this process's connection
        attributes = (
            sqs.sqs_client()
            .get_queue_attributes(
                QueueUrl=sqs.queue_url(self.env["SQS_QUEUE_NAME"]),
                AttributeNames=[
                    "ApproximateNumberOfMessages",
                    "ApproximateNumberOfMessagesNotVisible",
                    "ApproximateNumberOfMessagesDelayed",
                ],
            )
            .get("Attributes", {})
        )
        return {
            "queued": sum(int(v) for v in attributes.values()),
            "unfinished messages": QueueMessage.objects.filter(
                status__in=UNFINISHED_STATUSES
            ).count(),
            "unpublished outbox": OutboxMessage.objects.filter(published_at__isnull=True).count(),
            # Parked in the database behind the processor's outage, off the queue: not settled
            # until the workers have released them and the processor has had them.
            "waiting for the processor": PaymentHold.objects.filter(
                kind=HoldKind.OUTAGE, released_at__isnull=True
            ).count(),
            "callbacks pending": int(self.sandbox_stats().get("callbacks_pending", 0)),
            "webhook events undispatched": Event.objects.filter(position__isnull=True).count(),
            "webhook deliveries pending": WebhookDelivery.objects.filter(
                status=DeliveryStatus.PENDING
            ).count(),
        }

    def wait_quiet(self) -> tuple[bool, dict]:
        """Poll until nothing is queued, running, unpublished, waiting for the processor or
        undelivered three times in a row. Gives up after CHAOS_QUIESCE_SECONDS, or after
        STALL_SECONDS without a single message finishing (stuck, not slow)."""
        from callbacks.models import FINISHED_STATUSES, QueueMessage

        deadline = time.monotonic() + self.config.quiesce_seconds
        quiet_polls, finished, last_progress = 0, -1, time.monotonic()
        backlog: dict = {}
        while time.monotonic() < deadline and time.monotonic() - last_progress < STALL_SECONDS:
            try:
                backlog = self.backlog()
                done = QueueMessage.objects.filter(status__in=FINISHED_STATUSES).count()
            except Exception as exc:  # noqa: BLE001 - keep polling until the deadline
                backlog = {"error": f"{type(exc).__name__}: {exc}"}
                quiet_polls = 0
            else:
                quiet_polls = quiet_polls + 1 if not any(backlog.values()) else 0
                if done != finished:
                    finished, last_progress = done, time.monotonic()
            if quiet_polls >= 3:
                return True, backlog
            time.sleep(1)
        return False, backlog

    def ingest_dead_letters(self) -> int:
        total = 0
        for _ in range(20):
            out = self.manage("ingest_dlq", "--max-messages", "1000")
            match = re.search(r"(\d+) new dead letter", out)
            stored = int(match.group(1)) if match else 0
            total += stored
            if stored == 0:
                break
        return total
