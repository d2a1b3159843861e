"""The queue layer's settings, each with its default kept here.

A host sets them in one dict, ``CALLBACKS = {"CALLBACK_SIGNING_SECRETS": [...], ...}``
(``payments.kernel.app_settings``); the code reads them as ``conf.NAME`` (at call time, so a changed
setting is seen): the host's value when it sets one, else the default below. A host sets only
``REQUIRED``.
"""

from datetime import timedelta
from typing import Any

from payments.kernel.app_settings import AppSettings
from payments.kernel.setting_specs import Duration, Flag, Number, Seconds, Spec, Text, Url, defaults
from payments.signing import secrets_parse

REQUIRED = ("CALLBACK_SIGNING_SECRETS",)

# SQS FIFO queue names: at most 80 characters, ending in ".fifo".
_FIFO_NAME = r"[A-Za-z0-9_-]{1,75}\.fifo"
_FIFO_ACCEPTED = "an SQS FIFO queue name: 1-75 of A-Z a-z 0-9 _ -, then '.fifo'"

# Each setting with its default and what it accepts: ``manage.py check`` refuses any other value
# (callbacks.checks), so a nonsense one stops start-up instead of breaking every call later.
SPECS: dict[str, Spec] = {
    "AWS_REGION": Text(
        "us-east-1", pattern=r"[a-z]{2}(-[a-z]+)+-\d+", accepted="an AWS region such as 'us-east-1'"
    ),
    # Unset: AWS itself. A URL: an SQS-compatible server (the local one in tests and the demo).
    "SQS_ENDPOINT_URL": Url(None),
    "SQS_QUEUE_NAME": Text("payments.fifo", pattern=_FIFO_NAME, accepted=_FIFO_ACCEPTED),
    "SQS_DLQ_NAME": Text("payments-dlq.fifo", pattern=_FIFO_NAME, accepted=_FIFO_ACCEPTED),
    # Retries with exponential backoff and full jitter: the first try plus 5 retries. 0 (no
    # wait) is allowed for tests; SQS hides a message for at most 12 hours.
    "WORKER_BACKOFF_BASE_SECONDS": Seconds(1.0, 900, above_minimum=False),
    "WORKER_BACKOFF_CAP_SECONDS": Seconds(30.0, 43_200, above_minimum=False),
    "WORKER_MAX_ATTEMPTS": Number(6, 1, 100, whole=True, unit="of attempts"),
    # Receives of a message whose body the database refuses before it goes to a person; below
    # the RedrivePolicy's maxReceiveCount, so it reaches a person with an error row.
    "WORKER_MAX_FAILED_STARTS": Number(3, 1, 100, whole=True, unit="of receives"),
    # Keeps in-flight messages hidden while they run; off only to show what it prevents.
    "WORKER_VISIBILITY_HEARTBEAT": Flag(True),
    # After a batch that was not full (the queue is keeping up), wait this long before the next
    # receive so the next batch gathers several messages: a receive, a delete and a commit then
    # serve several events instead of one. Adds at most this much latency; 0 receives at once.
    "WORKER_RECEIVE_LINGER_SECONDS": Seconds(0.02, 1, above_minimum=False),
    # Once the processor takes calls again after an outage, the workers release the payments
    # held meanwhile at most this many per second, all workers together: each released
    # submission is a processor call, and a processor just back must not take the whole
    # backlog at once. 5,000 held payments drain in 50 s at the default.
    "OUTAGE_RELEASE_PER_SECOND": Number(100, 1, 10_000, whole=True, unit="of payments per second"),
    # Tests only: a named point where the worker stops and waits to be killed ("batch_commit":
    # after a batch's savepoints, before its commit). Empty (the default): no pause anywhere.
    "WORKER_PAUSE_AT": Text(
        "", pattern=r"|batch_commit", accepted="'' (no pause) or 'batch_commit' (tests only)"
    ),
    # Replay window of callback signatures: 0 or less refuses every callback (401), more than an
    # hour lets a captured callback be replayed for that long.
    "CALLBACK_TOLERANCE_SECONDS": Number(300, 1, 3600, unit="of seconds"),
    # SQS takes messages up to 1 MiB, and the envelope wraps the body.
    "CALLBACK_MAX_BODY_BYTES": Number(64 * 1024, 1024, 1024 * 1024, whole=True, unit="of bytes"),
    # Callbacks a web process receives within this many seconds of each other go to SQS in one
    # batch call (each still answered for its own entry); 0 sends each one alone. The wait adds
    # to every callback's answer, so it stays well under a second.
    "CALLBACK_SEND_COALESCE_SECONDS": Seconds(0.002, 1, above_minimum=False),
    # A committed outbox row (a new payment's submit command) goes to its process's publisher
    # thread, which waits this long for the rows of other commits to join it, then publishes
    # them together (callbacks.outbox_after_commit): one claim and one send for many rows,
    # none of it in the request. Adds at most this much before a payment is submitted; 0
    # publishes in the committing thread, one claim per commit.
    "OUTBOX_PUBLISH_LINGER_SECONDS": Seconds(0.05, 1, above_minimum=False),
    # Reconciliation of stuck payments (ACH settles in days).
    "RECONCILE_SUBMITTED_AFTER": Duration(timedelta(days=3)),
    "RECONCILE_PENDING_AFTER": Duration(timedelta(minutes=5)),
    "RECONCILE_RECHECK_AFTER": Duration(timedelta(minutes=60)),
    "RECONCILE_BATCH_SIZE": Number(100, 1, 10_000, whole=True, unit="of payments"),
    # The pull of the processor's events (callbacks.events_pull): events asked for per page,
    # and pages per pass (a processor whose has_more never ends cannot keep a pass running).
    "PROCESSOR_EVENTS_PULL_PAGE_SIZE": Number(100, 1, 500, whole=True, unit="of events"),
    "PROCESSOR_EVENTS_PULL_MAX_PAGES": Number(50, 1, 10_000, whole=True, unit="of pages"),
    # Tests only: a named point where the pull stops and waits to be killed ("page_queued":
    # a page's events on the queue, the cursor not yet moved). Empty (the default): no pause.
    "PROCESSOR_EVENTS_PULL_PAUSE_AT": Text(
        "", pattern=r"|page_queued", accepted="'' (no pause) or 'page_queued' (tests only)"
    ),
    # Records of cleanly finished queue messages are kept this long (the dashboards' and the
    # admin's recent history), then purged by beat; error history is never purged.
    "QUEUE_MESSAGE_RETENTION": Duration(timedelta(days=30)),
    # Records that carry a failure (error rows, dead-lettered or parked messages) are kept
    # longer, for the incident review; a dead letter still open in triage keeps its own forever.
    "QUEUE_ERROR_RETENTION": Duration(timedelta(days=90)),
    # Released holds and the parked messages they republished.
    "HOLD_RETENTION": Duration(timedelta(days=90)),
    # Celery's broker queue: a standard (not FIFO) SQS queue.
    "CELERY_SQS_QUEUE_NAME": Text(
        "payments-celery",
        pattern=r"[A-Za-z0-9_-]{1,80}",
        accepted="an SQS standard queue name: 1-80 of A-Z a-z 0-9 _ -",
    ),
}
# Pairs (low, high) whose low value may not exceed the high one.
RELATIONS = (("WORKER_BACKOFF_BASE_SECONDS", "WORKER_BACKOFF_CAP_SECONDS"),)

DEFAULTS: dict[str, Any] = defaults(SPECS)

callbacks_settings = AppSettings(
    app="callbacks",
    setting="CALLBACKS",
    specs=SPECS,
    # The secrets are checked by reading them (callbacks.E001): stripped and never empty,
    # however the host wrote them (a list, or a comma-separated string).
    required={"CALLBACK_SIGNING_SECRETS": None},
    relations=RELATIONS,
    readers={"CALLBACK_SIGNING_SECRETS": secrets_parse},
)


def __getattr__(name: str) -> Any:
    return getattr(callbacks_settings, name)


def required_check() -> None:
    """Raise ``ImproperlyConfigured`` naming the first required setting that is missing, or
    the signing secrets when they hold none."""
    for name in REQUIRED:
        getattr(callbacks_settings, name)
