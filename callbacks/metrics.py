"""Prometheus metrics of the queue layer (callback endpoint, outbox relay, worker).

Served by the web's ``/metrics`` and, for a worker or relay on a host of its own, on its
``--metrics-port`` (``callbacks.metrics_server``). Names follow Prometheus's conventions: a
counter ends in ``_total``, a duration is in ``_seconds``, a histogram of counts names what it
counts (``_entries``, ``_messages``).
"""

from prometheus_client import Counter, Histogram

CALLBACKS_RECEIVED = Counter(
    "payments_callbacks_received_total",
    "Processor callbacks received, by outcome: accepted, bad_signature, bad_body, "
    "unsupported_media_type, too_large, queue_unavailable.",
    ["outcome"],
)
WORKER_MESSAGES = Counter(
    "payments_worker_messages_total",
    "Messages handled by run_sqs_worker, by kind and outcome: applied, stale, duplicate, "
    "submitted, queued, rejected, skipped, retried, dead_lettered, parked, deferred, "
    "moved_behind.",
    ["kind", "outcome"],
)
DEDUP_HITS = Counter(
    "payments_dedup_hits_total",
    "Repeated processor events dropped, by layer: app (the processed-event record) or "
    "sqs (seen as a repeated deduplication id at send time, where the queue reports it).",
    ["layer"],
)
ENQUEUE_TO_APPLIED_SECONDS = Histogram(
    "payments_enqueue_to_applied_seconds",
    "Seconds from a message's enqueue (SQS SentTimestamp) to its work being committed.",
    ["kind"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 3600, 86400),
)
OUTBOX_PUBLISHED = Counter(
    "payments_outbox_published_total",
    "Outbox rows published to the queue, by path: on_commit or relay.",
    ["path"],
)
MESSAGES_DEFERRED = Counter(
    "payments_worker_messages_deferred_total",
    "submit_payment messages hidden without spending an attempt because the processor's "
    "circuit breaker was open, calls were paused by a 429, or the call failed while the "
    "processor was degraded, by reason: breaker_open, paused, degraded.",
    ["reason"],
)
CELERY_TASKS = Counter(
    "payments_celery_tasks_total",
    "The module's Celery tasks run by this worker, by task and outcome: succeeded, failed, "
    "retried (callbacks.celery_metrics).",
    ["task", "outcome"],
)
# How many messages share one SQS call: what the coalesced sends and the worker's linger buy.
_BATCH_BUCKETS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10)
CALLBACK_SEND_BATCH_ENTRIES = Histogram(
    "payments_callback_send_batch_entries",
    "Callbacks sent to SQS in one SendMessageBatch call by a web process's coalescing sender.",
    buckets=_BATCH_BUCKETS,
)
WORKER_BATCH_MESSAGES = Histogram(
    "payments_worker_batch_messages",
    "Messages in each batch run_sqs_worker received and handled.",
    buckets=_BATCH_BUCKETS,
)
PROCESSOR_EVENTS_PULLED = Counter(
    "payments_processor_events_pulled_total",
    "Processor events read by the events pull and queued, by outcome: new (not applied yet "
    "when pulled: a callback the processor never delivered, or one still on its way), known "
    "(already applied: delivered by callback), malformed (dead-lettered with its errors), "
    "unqueued (valid, but a message the queue cannot take: dead-lettered, with an alert).",
    ["outcome"],
)
PROCESSOR_EVENTS_PULL_PASSES = Counter(
    "payments_processor_events_pull_passes_total",
    "Passes of the processor events pull, by outcome: done, failed (the processor or the queue "
    "did not answer; the cursor stayed), stalled (the processor's cursor did not advance), "
    "skipped (another pass held the lock), unsupported (the backend has no events API).",
    ["outcome"],
)
