"""The pull of the processor's events: a callback the processor never delivered is applied within
minutes anyway.

A processor gives up on a callback after its retries (or loses it); its events API still lists
the event. ``processor_events_pull`` reads that list page by page after a cursor stored in
PostgreSQL (``ProcessorEventsCursor``) and puts every event on the main FIFO queue exactly as the
callback endpoint does: each checked by the backend's ``callback_parse`` (the endpoint's check of
a body), built by ``callbacks.schema.processor_event_outgoing`` (the endpoint's envelope, message
group and deduplication id), so the worker cannot tell a pulled event from a delivered one. An
event delivered by callback is then a duplicate (SQS drops it inside its 5 minutes, the
processed-event record after them); one never delivered is applied, in its payment's order.

Crash safety: the cursor moves only after a page's events are all on the queue, and only from
the value the pass read (a compare-and-set), so a pass killed mid-page sends that page again on
the next run: at least once onto the queue, exactly once in the ledger. One pass runs at a time
(``payments.kernel.locks.single_flight``, a PostgreSQL advisory lock): two pullers never pull a page
twice, the second skips its run.

A page that breaks the API's contract, a 5xx, a timeout or a queue that refuses fails the pass
with the cursor where it was (the next pass tries again; ``payments_processor_events_pull_success_
timestamp_seconds`` grows old and alerts). A single event that breaks the event contract is never
dropped silently: it goes to the dead-letter queue with its errors, where triage ingests it for a
human and raises a high alert, as for any dead letter; its bank numbers are masked first
(``listed_event_shown``). A single valid event the queue cannot take (a message larger than
SQS allows, or one SQS refuses for its own fault) would fail every pass: it goes to the
dead-letter queue on its own, the alert ``processor_events_pull.unqueued`` says so, and the
cursor moves past it. Pages are sent in batches within SQS's count and byte limits. A cursor
the processor does not advance while it says it has more raises a medium alert and ends the
pass without counting it a success.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
import uuid
from dataclasses import dataclass
from datetime import datetime

from django.db.models import F
from django.db.models.functions import Now
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from callbacks import conf as callbacks_conf
from callbacks import sqs
from callbacks.metrics import PROCESSOR_EVENTS_PULL_PASSES, PROCESSOR_EVENTS_PULLED
from callbacks.models import ProcessorEventsCursor
from callbacks.schema import (
    event_deduplication_id,
    processor_event_message,
    processor_event_outgoing,
)
from callbacks.sqs_messages import OutgoingMessage
from payments import conf as payments_conf
from payments.alerts import alert_raise
from payments.events import ProcessorEvent
from payments.exceptions import InvalidCallback, ProcessorRejected, ProcessorUnavailable
from payments.kernel.bank_numbers import mask_bank_numbers
from payments.kernel.locks import single_flight
from payments.messages import dead_letter_marked, processor_event_body
from payments.models import ProcessedEvent
from payments.processor.backend import CallbackRequest, ProcessorBackend, get_backend
from payments.processor.contract import CURSOR_RE, listed_event_shown

logger = logging.getLogger(__name__)

LOCK_NAME = "callbacks.processor_events_pull"
# The message group and id prefix of a malformed event whose payment id cannot be read.
MALFORMED_PREFIX = "events-pull"
MALFORMED_ERROR_CLASS = "InvalidPulledEvent"
UNQUEUED_ERROR_CLASS = "UnqueuedPulledEvent"
UNQUEUED_ALERT_KEY = "processor_events_pull.unqueued"
# A member of a listed event kept in its dead letter when the whole would not fit the queue.
_KEPT_MEMBER_CHARS = 1024


class PullOutcome:
    DONE = "done"
    FAILED = "failed"
    STALLED = "stalled"
    SKIPPED = "skipped"
    UNSUPPORTED = "unsupported"


@dataclass
class PullResult:
    outcome: str
    pages: int = 0
    pulled: int = 0
    new: int = 0
    known: int = 0
    malformed: int = 0
    unqueued: int = 0
    cursor: str = ""
    error: str = ""

    def summary(self) -> str:
        text = (
            f"{self.outcome}: {self.pages} page(s), {self.pulled} event(s) pulled: {self.new} "
            f"new, {self.known} already applied, {self.malformed} malformed (dead-lettered)"
        )
        if self.unqueued:
            text += f", {self.unqueued} the queue cannot take (dead-lettered)"
        return f"{text}; {self.error}" if self.error else text


@dataclass(frozen=True)
class _CheckedPage:
    events: list[ProcessorEvent]
    malformed: list[tuple[object, dict[str, list[str]]]]


def processor_events_pull(
    *, page_size: int | None = None, max_pages: int | None = None
) -> PullResult:
    """One pass: the processor's events after the stored cursor onto the queue, page by page,
    until it has no more (or ``max_pages``). Calls the processor and SQS: run it outside any
    transaction."""
    backend = get_backend()
    if not backend.supports_events:
        logger.info(
            "processor events pull: %s has no events API; nothing to pull",
            type(backend).__name__,
        )
        PROCESSOR_EVENTS_PULL_PASSES.labels(outcome=PullOutcome.UNSUPPORTED).inc()
        return PullResult(PullOutcome.UNSUPPORTED, error="the processor backend has no events API")
    with single_flight(LOCK_NAME) as acquired:
        if not acquired:
            PROCESSOR_EVENTS_PULL_PASSES.labels(outcome=PullOutcome.SKIPPED).inc()
            return PullResult(PullOutcome.SKIPPED, error="another pass is running")
        result = _pull(
            backend,
            page_size=page_size or callbacks_conf.PROCESSOR_EVENTS_PULL_PAGE_SIZE,
            max_pages=max_pages or callbacks_conf.PROCESSOR_EVENTS_PULL_MAX_PAGES,
        )
    PROCESSOR_EVENTS_PULL_PASSES.labels(outcome=result.outcome).inc()
    log = logger.info if result.outcome == PullOutcome.DONE else logger.warning
    log("processor events pull %s", result.summary(), extra={"outcome": result.outcome})
    return result


def processor_events_cursor_set(*, cursor: str) -> str:
    """Store ``cursor`` as where the next pass starts ("" = the processor's first event), and
    return the one it replaces: where a host adopting the pull starts (not years back), or an
    operator's way past a page the processor cannot serve. Taken under the pass's own lock, so
    no pass running meanwhile moves it back; raises ``RuntimeError`` when one holds it."""
    if cursor and not CURSOR_RE.fullmatch(cursor):
        raise ValueError("a cursor is 1-512 characters of A-Za-z0-9._:=~+/-")
    with single_flight(LOCK_NAME) as acquired:
        if not acquired:
            raise RuntimeError("a pass of the processor events pull is running; try again")
        row, _ = ProcessorEventsCursor.objects.get_or_create(source=payments_conf.PROCESSOR_BACKEND)
        ProcessorEventsCursor.objects.filter(pk=row.pk).update(cursor=cursor)
    logger.warning(
        "processor events pull: cursor set to %r by hand (was %r)",
        cursor,
        row.cursor,
        extra={"outcome": "cursor_set"},
    )
    return row.cursor


def _pull(backend: ProcessorBackend, *, page_size: int, max_pages: int) -> PullResult:
    row, _ = ProcessorEventsCursor.objects.get_or_create(source=payments_conf.PROCESSOR_BACKEND)
    cursor = row.cursor
    result = PullResult(PullOutcome.DONE, cursor=cursor)
    for _ in range(max_pages):
        try:
            page = backend.events_list(after=cursor or None, limit=page_size)
        except (ProcessorUnavailable, ProcessorRejected) as exc:
            result.outcome, result.error = PullOutcome.FAILED, str(exc)
            if isinstance(exc, ProcessorRejected):
                alert_raise(
                    severity="medium",
                    key="processor_events_pull.refused",
                    summary=f"the processor refused the events pull after {cursor!r}: {exc}",
                )
            return result
        checked = _check(backend, page.data, unreadable=page.unreadable)
        try:
            new, known, unqueued = _queue_now(checked)
        except sqs.QueueUnavailable as exc:
            result.outcome, result.error = PullOutcome.FAILED, f"queue unavailable: {exc}"
            return result
        result.pages += 1
        result.pulled += len(page.data)
        result.new, result.known = result.new + new, result.known + known
        result.malformed += len(checked.malformed)
        result.unqueued += unqueued
        _pause_at("page_queued")
        next_cursor = page.next_cursor
        if next_cursor is None or next_cursor == cursor:
            # The processor gave no position past this page: the cursor stays, and the page's
            # events (queued again next time) are duplicates there.
            _counts_add(row, cursor=cursor, checked=checked, new=new, known=known)
            if page.has_more:
                result.outcome = PullOutcome.STALLED
                result.error = f"the processor's cursor does not advance past {cursor!r}"
                alert_raise(
                    severity="medium",
                    key="processor_events_pull.stalled",
                    summary=f"processor events pull: {result.error} although it has more",
                )
                return result
            break
        if not _cursor_advance(row, old=cursor, new=next_cursor, checked=checked, new_count=new):
            result.outcome = PullOutcome.FAILED
            result.error = "the stored cursor moved under this pass (another puller)"
            return result
        cursor = result.cursor = next_cursor
        if not page.has_more:
            break
    ProcessorEventsCursor.objects.filter(pk=row.pk).update(pulled_at=Now())
    return result


def _check(
    backend: ProcessorBackend, data: tuple, *, unreadable: dict[int, dict[str, list[str]]]
) -> _CheckedPage:
    """Each event checked as the callback endpoint checks a body (``callback_parse``); one
    whose JSON the page's reader could not take (``unreadable``) is malformed with its errors."""
    events, malformed = [], []
    for index, item in enumerate(data):
        if index in unreadable:
            malformed.append((item, unreadable[index]))
            continue
        request = CallbackRequest(
            body=json.dumps(item, separators=(",", ":")).encode(),
            headers={},
            secrets=(),
            tolerance_seconds=callbacks_conf.CALLBACK_TOLERANCE_SECONDS,
        )
        try:
            events.append(backend.callback_parse(item, request))
        except InvalidCallback as exc:
            malformed.append((item, exc.errors))
    return _CheckedPage(events=events, malformed=malformed)


def _queue_now(checked: _CheckedPage) -> tuple[int, int, int]:
    """The page's events onto the main queue in order, its malformed ones and those the queue
    cannot take onto the DLQ, each on its own; how many were (new, already applied, not
    queued)."""
    ids = [event.processor_event_id for event in checked.events]
    applied = set(
        ProcessedEvent.objects.filter(processor_event_id__in=ids).values_list(
            "processor_event_id", flat=True
        )
    )
    unqueued = _page_publish(checked.events)
    for event, why in unqueued:
        _unqueued_dead_letter(event, why)
    for item, errors in checked.malformed:
        _malformed_dead_letter(item, errors)
    left_out = {event.processor_event_id for event, _ in unqueued}
    queued = [i for i in ids if i not in left_out]
    new = sum(1 for i in queued if i not in applied)
    PROCESSOR_EVENTS_PULLED.labels(outcome="new").inc(new)
    PROCESSOR_EVENTS_PULLED.labels(outcome="known").inc(len(queued) - new)
    PROCESSOR_EVENTS_PULLED.labels(outcome="malformed").inc(len(checked.malformed))
    PROCESSOR_EVENTS_PULLED.labels(outcome="unqueued").inc(len(unqueued))
    return new, len(queued) - new, len(unqueued)


def _page_publish(events: list[ProcessorEvent]) -> list[tuple[ProcessorEvent, str]]:
    """Send now, in the page's order, in batches within SQS's limits (ten messages, and
    ``sqs.BATCH_MAX_BYTES`` together); raise ``QueueUnavailable`` unless SQS took every one it
    can take (what it took is harmless to send again: same deduplication ids). Return the
    events SQS cannot take as they are, with why: a message larger than ``BATCH_MAX_BYTES``
    (not sent), or one SQS refused for its own fault. Sent again they would be refused on every
    pass, and the cursor would never move past them."""
    now = timezone.now()
    unqueued: list[tuple[ProcessorEvent, str]] = []
    batches: list[list[tuple[ProcessorEvent, OutgoingMessage]]] = [[]]
    size = 0
    for event in events:
        message = processor_event_outgoing(event, received_at=now)
        if message.size > sqs.BATCH_MAX_BYTES:
            unqueued.append(
                (
                    event,
                    f"its queue message is {message.size} bytes, over the "
                    f"{sqs.BATCH_MAX_BYTES} a message may have",
                )
            )
            continue
        if len(batches[-1]) == sqs.BATCH_LIMIT or size + message.size > sqs.BATCH_MAX_BYTES:
            batches.append([])
            size = 0
        batches[-1].append((event, message))
        size += message.size
    for batch in batches:
        outcome = sqs.send_messages_each_now([message for _, message in batch])
        if outcome.unreachable:
            raise sqs.QueueUnavailable(outcome.unreachable[0][1])
        own_fault = {id(message) for message in outcome.sender_fault}
        passing = [why for message, why in outcome.refused if id(message) not in own_fault]
        if passing:
            raise sqs.QueueUnavailable(f"SQS refused {len(passing)} message(s): {passing[0]}")
        event_of = {id(message): event for event, message in batch}
        unqueued += [
            (event_of[id(message)], f"SQS refused its queue message: {why}")
            for message, why in outcome.refused
        ]
    return unqueued


def _unqueued_dead_letter(event: ProcessorEvent, why: str) -> None:
    """A valid event the main queue cannot take, to the DLQ on its own (a person redrives or
    resolves it there) and an alert: the cursor moves past it, the events after it are
    applied. Its members beyond the contract are left out of the dead letter when it would not
    fit either; its contract fields are whole, so a redrive applies it."""
    now = timezone.now()
    body = processor_event_message(event, received_at=now)
    note = ""
    if len(json.dumps(body, separators=(",", ":")).encode()) > sqs.BATCH_MAX_BYTES // 2:
        body = processor_event_message(dataclasses.replace(event, raw={}), received_at=now)
        note = "; its members beyond the contract are left out of this dead letter"
    # Its own id, from its deduplication id: pulled again, SQS and ingestion drop it.
    digest = hashlib.sha256(event_deduplication_id(event).encode()).hexdigest()[:48]
    message_id = f"{MALFORMED_PREFIX}.unqueued.{digest}"
    summary = (
        f"the processor's events API listed event {event.processor_event_id} of payment "
        f"{event.payment_id}, which the queue cannot take: {why}"
    )
    sqs.send_message_now(
        body=dead_letter_marked(
            body,
            original_message_id=message_id,
            attempts=0,
            error_class=UNQUEUED_ERROR_CLASS,
            error=f"{summary}{note}"[:4000],
            first_started_at=now,
            dead_lettered_at=now,
        ),
        group_id=str(event.payment_id),
        deduplication_id=message_id,
        url=sqs.dead_letter_queue_url(),
    )
    alert_raise(
        severity="medium",
        key=UNQUEUED_ALERT_KEY,
        summary=f"processor events pull: {summary}. It is dead-lettered; the pull goes on.",
        details={
            "processor_event_id": event.processor_event_id,
            "payment_id": str(event.payment_id),
            "reason": why,
        },
        payment_id=event.payment_id,
    )
    logger.error(
        "pulled processor event the queue cannot take: dead-lettered: %s",
        why,
        extra={"payment_id": str(event.payment_id), "message_id": message_id},
    )


def _malformed_dead_letter(item: object, errors: dict[str, list[str]]) -> None:
    """A pulled event that breaks the contract, to the DLQ in the worker's dead-letter
    envelope, its bank numbers masked (``listed_event_shown``): triage stores it for a human
    with its errors (and alerts). Its id is its content's hash, so pulling it again is dropped
    by SQS and by ingestion."""
    canonical = json.dumps(item, sort_keys=True, separators=(",", ":"), default=str)
    digest = hashlib.sha256(canonical.encode()).hexdigest()[:48]
    payment_id = item.get("payment_id") if isinstance(item, dict) else None
    try:
        group_id = str(uuid.UUID(payment_id)) if isinstance(payment_id, str) else ""
    except ValueError:
        group_id = ""
    message_id = f"{MALFORMED_PREFIX}.{digest}"
    error = mask_bank_numbers(
        "; ".join(f"{field}: {' '.join(problems)}" for field, problems in errors.items())
    )
    shown = listed_event_shown(item, errors)
    if len(json.dumps(shown, separators=(",", ":"), default=str).encode()) > (
        sqs.BATCH_MAX_BYTES // 2
    ):
        shown = _cut_down(shown)
        error += "; members too large for the queue are left out of this dead letter"
    now = timezone.now()
    body = dead_letter_marked(
        processor_event_body(shown, received_at=now),
        original_message_id=message_id,
        attempts=0,
        error_class=MALFORMED_ERROR_CLASS,
        error=f"the processor's events API listed an event that breaks the contract: {error}"[
            :4000
        ],
        first_started_at=now,
        dead_lettered_at=now,
    )
    sqs.send_message_now(
        body=body,
        group_id=group_id or MALFORMED_PREFIX,
        deduplication_id=message_id,
        url=sqs.dead_letter_queue_url(),
    )
    logger.error(
        "pulled processor event breaks the contract: dead-lettered: %s",
        error,
        extra={"payment_id": group_id or None, "message_id": message_id},
    )


def _cut_down(shown: object) -> object:
    """A listed event too large for a queue message, cut to what a person needs to find it:
    its members whose text is short, each longer one replaced by its length."""
    if not isinstance(shown, dict):
        return f"({len(json.dumps(shown, default=str))} characters left out)"
    kept = {}
    for name, value in list(shown.items())[:64]:
        text = json.dumps(value, default=str)
        kept[str(name)[:_KEPT_MEMBER_CHARS]] = (
            value if len(text) <= _KEPT_MEMBER_CHARS else f"({len(text)} characters left out)"
        )
    return kept


def _newest(checked: _CheckedPage) -> datetime | None:
    return max((event.timestamp for event in checked.events), default=None)


def _counts_add(
    row: ProcessorEventsCursor, *, cursor: str, checked: _CheckedPage, new: int, known: int
) -> None:
    ProcessorEventsCursor.objects.filter(pk=row.pk, cursor=cursor).update(
        **_counted(checked, new=new, known=known)
    )


def _counted(checked: _CheckedPage, *, new: int, known: int) -> dict:
    fields = {
        "events_pulled": F("events_pulled") + len(checked.events) + len(checked.malformed),
        "events_new": F("events_new") + new,
        "events_known": F("events_known") + known,
        "events_malformed": F("events_malformed") + len(checked.malformed),
    }
    newest = _newest(checked)
    if newest is not None:
        fields["newest_event_at"] = newest
    return fields


def _cursor_advance(
    row: ProcessorEventsCursor, *, old: str, new: str, checked: _CheckedPage, new_count: int
) -> bool:
    """Move the stored cursor from ``old`` to ``new`` (one statement, autocommit); False when
    it no longer holds ``old``."""
    known = len(checked.events) - new_count
    return bool(
        ProcessorEventsCursor.objects.filter(pk=row.pk, cursor=old).update(
            cursor=new, **_counted(checked, new=new_count, known=known)
        )
    )


def _pause_at(point: str) -> None:
    """Tests only: stop here for good when ``PROCESSOR_EVENTS_PULL_PAUSE_AT`` names this point,
    so a test can SIGKILL the puller at a known place. A no-op unless a test sets it."""
    if callbacks_conf.PROCESSOR_EVENTS_PULL_PAUSE_AT == point:
        logger.warning("processor events pull paused at %s", point)
        while True:
            time.sleep(3600)


class ProcessorEventsPullCollector(Collector):
    """The pull's lag, read from its cursor row: ``..._success_timestamp_seconds`` (the end of
    the last successful pass, database time; 0 when none ever succeeded) and
    ``..._newest_event_timestamp_seconds`` (the newest event pulled). Left out when the
    backend has no events API (nothing to fall behind) or the database cannot be read."""

    def describe(self):
        yield GaugeMetricFamily("payments_processor_events_pull_success_timestamp_seconds", "")
        yield GaugeMetricFamily("payments_processor_events_pull_newest_event_timestamp_seconds", "")

    def collect(self):
        from django.db import DatabaseError

        try:
            if not get_backend().supports_events:
                return
            row = (
                ProcessorEventsCursor.objects.filter(source=payments_conf.PROCESSOR_BACKEND)
                .values("pulled_at", "newest_event_at")
                .first()
            ) or {}
        except DatabaseError as exc:
            logger.warning("cannot read the processor events pull's cursor: %s", exc)
            return
        yield GaugeMetricFamily(
            "payments_processor_events_pull_success_timestamp_seconds",
            "Unix time (database clock) the processor events pull last finished a pass; "
            "0 when none ever did.",
            value=_timestamp(row.get("pulled_at")),
        )
        yield GaugeMetricFamily(
            "payments_processor_events_pull_newest_event_timestamp_seconds",
            "Unix time of the newest processor event the pull has read (its timestamp); 0 "
            "when none.",
            value=_timestamp(row.get("newest_event_at")),
        )


def _timestamp(value: datetime | None) -> float:
    return value.timestamp() if value is not None else 0.0
