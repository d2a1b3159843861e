"""The queue layer's settings, each with its default kept here.

Read them as ``conf.NAME`` (at call time, so a changed setting is seen): the host project's
value when it sets one, else the default below. A host sets only ``REQUIRED``.
"""

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from payments.signing import secrets_parse

REQUIRED = ("CALLBACK_SIGNING_SECRETS",)

DEFAULTS: dict[str, Any] = {
    "AWS_REGION": "us-east-1",
    # Unset: AWS itself. A URL: an SQS-compatible server (the local one in tests and the demo).
    "SQS_ENDPOINT_URL": None,
    "SQS_QUEUE_NAME": "payments.fifo",
    "SQS_DLQ_NAME": "payments-dlq.fifo",
    # Retries with exponential backoff and full jitter: the first try plus 5 retries.
    "WORKER_BACKOFF_BASE_SECONDS": 1.0,
    "WORKER_BACKOFF_CAP_SECONDS": 30.0,
    "WORKER_MAX_ATTEMPTS": 6,
    # Receives of a message whose body the database refuses before it goes to a person; below
    # the RedrivePolicy's maxReceiveCount, so it reaches a person with an error row.
    "WORKER_MAX_FAILED_STARTS": 3,
    # Keeps in-flight messages hidden while they run; off only to show what it prevents.
    "WORKER_VISIBILITY_HEARTBEAT": True,
    # After a batch that was not full (the queue is keeping up), wait this long before the next
    # receive so the next batch gathers several messages: a receive, a delete and a commit then
    # serve several events instead of one. Adds at most this much latency; 0 receives at once.
    "WORKER_RECEIVE_LINGER_SECONDS": 0.02,
    # Tests only: a named point where the worker stops and waits to be killed ("batch_commit":
    # after a batch's savepoints, before its commit). Empty (the default): no pause anywhere.
    "WORKER_PAUSE_AT": "",
    "CALLBACK_TOLERANCE_SECONDS": 300,
    "CALLBACK_MAX_BODY_BYTES": 64 * 1024,
    # Callbacks a web process receives within this many seconds of each other go to SQS in one
    # batch call (each still answered for its own entry); 0 sends each one alone.
    "CALLBACK_SEND_COALESCE_SECONDS": 0.002,
    # Reconciliation of stuck payments (ACH settles in days).
    "RECONCILE_SUBMITTED_AFTER": timedelta(days=3),
    "RECONCILE_PENDING_AFTER": timedelta(minutes=5),
    "RECONCILE_RECHECK_AFTER": timedelta(minutes=60),
    "RECONCILE_BATCH_SIZE": 100,
    # Records of cleanly finished queue messages are kept this long (the dashboards' and the
    # admin's recent history), then purged by beat; error history is never purged.
    "QUEUE_MESSAGE_RETENTION": timedelta(days=30),
    # Records that carry a failure (error rows, dead-lettered or parked messages) are kept
    # longer, for the incident review; a dead letter still open in triage keeps its own forever.
    "QUEUE_ERROR_RETENTION": timedelta(days=90),
    # Released holds and the parked messages they republished.
    "HOLD_RETENTION": timedelta(days=90),
    # Celery's broker queue: a standard (not FIFO) SQS queue.
    "CELERY_SQS_QUEUE_NAME": "payments-celery",
}


def __getattr__(name: str) -> Any:
    if name in DEFAULTS:
        return getattr(settings, name, DEFAULTS[name])
    if name == "CALLBACK_SIGNING_SECRETS":
        # Stripped and never empty, however the host wrote it (a string or a list).
        return secrets_parse(getattr(settings, name, ""))
    raise AttributeError(f"callbacks.conf has no setting {name}")


def required_check() -> None:
    """Raise ``ImproperlyConfigured`` naming the first required setting that is missing."""
    for name in REQUIRED:
        if not getattr(settings, name, None):
            raise ImproperlyConfigured(f"{name} is required by the callbacks app and is not set")
    __getattr__("CALLBACK_SIGNING_SECRETS")
