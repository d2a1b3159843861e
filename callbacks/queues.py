"""Create or verify the main FIFO queue and its FIFO dead-letter queue.

Idempotent and explicit: every run reports, per queue, whether it was created, verified as is,
or changed (which attribute, from what to what); with ``dry_run`` nothing is created or changed
and the report says what would be. Works against AWS and the local SQS server alike: the
endpoint comes from ``SQS_ENDPOINT_URL`` through ``callbacks.sqs``.
"""

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from django.db import DatabaseError

from callbacks import conf as callbacks_conf
from callbacks import sqs

logger = logging.getLogger(__name__)

# The worker dead-letters a message itself after WORKER_MAX_ATTEMPTS (the first try plus 5
# retries), and one that crashes it outright after three starts that never finished
# (callbacks.worker.crashes). The queue's RedrivePolicy is only the safety net behind both, so
# its receive count must stay above that: otherwise SQS would move messages the worker is still
# retrying (and group-mates released behind a failure, or received with a message that crashes
# the worker, whose receive counts also rise).
MAX_RECEIVE_COUNT_DEFAULT = 10
VISIBILITY_TIMEOUT_FALLBACK = 30
VISIBILITY_TIMEOUT_MAX = 12 * 60 * 60  # SQS's own limit
RETENTION_14_DAYS = 14 * 24 * 60 * 60  # SQS's maximum: dead letters must outlive a long weekend
SSE_ATTRIBUTE = "SqsManagedSseEnabled"


class QueueSetupError(Exception):
    """The requested setup is invalid or SQS refused it; the message says why."""


@dataclass(frozen=True)
class _Queue:
    name: str
    url: str | None  # None when it does not exist (yet)


def _visibility_timeout_default() -> tuple[int, str]:
    """The payments app's recommendation (P99 processor latency x 2) when it can give one."""
    try:
        from payments.selectors import recommended_visibility_timeout
    except ImportError:
        return VISIBILITY_TIMEOUT_FALLBACK, "default"
    try:
        return recommended_visibility_timeout(), "recommended from processor latency"
    except DatabaseError as exc:
        logger.warning("no latency data for the visibility timeout, using the default: %s", exc)
        return VISIBILITY_TIMEOUT_FALLBACK, f"default; latency data unavailable: {exc}"


@contextmanager
def _refusals_named(operation: str) -> Iterator[None]:
    """A call SQS refused becomes a ``QueueSetupError`` naming it; ``QueueUnavailable`` (SQS
    unreachable) goes through as it is."""
    try:
        yield
    except sqs.QueueRefused as exc:
        raise QueueSetupError(f"SQS refused {operation}: {exc.code} {exc.detail}".strip()) from exc


def _find(name: str) -> _Queue:
    with _refusals_named(f"get_queue_url for {name!r}"):
        return _Queue(name=name, url=sqs.queue_find(name))


def dead_letter_queue_attributes() -> dict[str, str]:
    """The FIFO dead-letter queue: kept for SQS's maximum retention, 14 days."""
    return {
        "FifoQueue": "true",
        "MessageRetentionPeriod": str(RETENTION_14_DAYS),
        SSE_ATTRIBUTE: "true",
    }


def main_queue_attributes(
    *, visibility_timeout: int, max_receive_count: int, dead_letter_arn: str
) -> dict[str, str]:
    """The main FIFO queue: high-throughput FIFO, RedrivePolicy to the dead-letter queue."""
    redrive = json.dumps(
        {"deadLetterTargetArn": dead_letter_arn, "maxReceiveCount": max_receive_count},
        separators=(",", ":"),
    )
    return {
        "FifoQueue": "true",
        "VisibilityTimeout": str(visibility_timeout),
        "DeduplicationScope": "messageGroup",
        "FifoThroughputLimit": "perMessageGroupId",
        "MessageRetentionPeriod": str(RETENTION_14_DAYS),
        "RedrivePolicy": redrive,
        SSE_ATTRIBUTE: "true",
    }


def broker_queue_attributes(*, visibility_timeout: int) -> dict[str, str]:
    """Celery's standard broker queue (``config.celery.celery_queue_ensure``)."""
    return {"VisibilityTimeout": str(visibility_timeout), SSE_ATTRIBUTE: "true"}


# --- Create or verify ---------------------------------------------------------------------


def _same(key: str, current: str | None, desired: str, *, queue: dict[str, str]) -> bool:
    if key == SSE_ATTRIBUTE:
        # Encryption at rest is what is required: a KMS key (the template's option) satisfies it
        # as well as SSE-SQS; a server that reports no encryption attribute at all (the local
        # SQS server) has nothing to verify.
        return bool(queue.get("KmsMasterKeyId")) or (current or "true") == desired
    if current is None:
        return False
    if key == "RedrivePolicy":
        try:
            have, want = json.loads(current), json.loads(desired)
            return have.get("deadLetterTargetArn") == want["deadLetterTargetArn"] and int(
                have.get("maxReceiveCount", -1)
            ) == int(want["maxReceiveCount"])
        except (ValueError, TypeError, AttributeError):
            return False
    return current == desired


def _format(attributes: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in attributes.items())


def _ensure(queue: _Queue, desired: dict[str, str], *, dry_run: bool) -> tuple[str, list[str]]:
    """Create ``queue`` or bring its attributes to ``desired``; return (url, report lines)."""
    if queue.url is None:
        if dry_run:
            return "", [f"would create queue {queue.name} ({_format(desired)})"]
        with _refusals_named("create_queue"):
            url = sqs.queue_create(name=queue.name, attributes=desired)
        logger.info("created queue %s", queue.name, extra={"queue": queue.name})
        return url, [f"created queue {queue.name} ({_format(desired)})"]

    with _refusals_named("get_queue_attributes"):
        current = sqs.queue_attributes(queue.url, ["All"])
    if current.get("FifoQueue") != "true":
        raise QueueSetupError(
            f"queue {queue.name} exists but is not a FIFO queue; it cannot be converted, "
            "delete it or choose another name"
        )
    drift = {
        key: value
        for key, value in desired.items()
        if key != "FifoQueue" and not _same(key, current.get(key), value, queue=current)
    }
    if not drift:
        return queue.url, [f"verified queue {queue.name} ({_format(desired)})"]
    changes = "; ".join(f"{k} {current.get(k, '(unset)')} -> {v}" for k, v in drift.items())
    if dry_run:
        return queue.url, [f"would change queue {queue.name}: {changes}"]
    with _refusals_named("set_queue_attributes"):
        sqs.queue_attributes_set(url=queue.url, attributes=drift)
    logger.warning("changed queue %s: %s", queue.name, changes, extra={"queue": queue.name})
    return queue.url, [f"changed queue {queue.name}: {changes}"]


def queues_ensure(
    *,
    visibility_timeout: int | None = None,
    max_receive_count: int = MAX_RECEIVE_COUNT_DEFAULT,
    dry_run: bool = False,
) -> list[str]:
    """Create or verify ``SQS_DLQ_NAME`` then ``SQS_QUEUE_NAME``; return the report lines.

    The dead-letter queue goes first because the main queue's RedrivePolicy names its ARN.
    Raises ``QueueSetupError`` for invalid options or a refused call, ``sqs.QueueUnavailable``
    when SQS cannot be reached.
    """
    main_name, dlq_name = callbacks_conf.SQS_QUEUE_NAME, callbacks_conf.SQS_DLQ_NAME
    for setting, name in (("SQS_QUEUE_NAME", main_name), ("SQS_DLQ_NAME", dlq_name)):
        if not name.endswith(".fifo"):
            raise QueueSetupError(f"{setting}={name!r}: a FIFO queue name must end with .fifo")
    if main_name == dlq_name:
        raise QueueSetupError("SQS_QUEUE_NAME and SQS_DLQ_NAME must differ")
    attempt_limit = callbacks_conf.WORKER_MAX_ATTEMPTS
    if not attempt_limit < max_receive_count <= 1000:
        raise QueueSetupError(
            f"max receive count {max_receive_count} must be above the worker's own attempt "
            f"limit (WORKER_MAX_ATTEMPTS={attempt_limit}) and at most 1000"
        )
    lines: list[str] = []
    if visibility_timeout is None:
        visibility_timeout, source = _visibility_timeout_default()
        lines.append(f"visibility timeout {visibility_timeout} s ({source})")
    if not 0 <= visibility_timeout <= VISIBILITY_TIMEOUT_MAX:
        raise QueueSetupError(
            f"visibility timeout {visibility_timeout} s is outside 0..{VISIBILITY_TIMEOUT_MAX}"
        )

    dlq_url, dlq_lines = _ensure(_find(dlq_name), dead_letter_queue_attributes(), dry_run=dry_run)
    lines += dlq_lines
    if dlq_url:
        with _refusals_named("get_queue_attributes"):
            dlq_arn = sqs.queue_attributes(dlq_url, ["QueueArn"])["QueueArn"]
    else:  # dry run, dead-letter queue not created
        dlq_arn = f"<arn of {dlq_name} once created>"
    _, main_lines = _ensure(
        _find(main_name),
        main_queue_attributes(
            visibility_timeout=visibility_timeout,
            max_receive_count=max_receive_count,
            dead_letter_arn=dlq_arn,
        ),
        dry_run=dry_run,
    )
    lines += main_lines
    return lines
