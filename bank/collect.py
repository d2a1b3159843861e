"""The bank's return and NOC files onto the queue: collect, store, publish.

``nacha_files_collect`` reads each whole file the transport offers, has the payments app store
it (``bank.nacha.inbound``: every entry an event, or the file refused whole and kept), moves
it out of the bank's drop, and publishes what it stored. Publishing runs outside any
transaction, as every send of this app does, and can be repeated: each event goes out with
``MessageGroupId`` = its payment and ``MessageDeduplicationId`` = its original trace number and
the fingerprint of its code, so SQS drops a repeat within its window, and the worker's dedup
record (``processor_event_id`` = ``ach.<trace>.<code>``) after it. ``run_sqs_worker`` then applies
it exactly once, as it applies a callback.

An event whose trace number matches no payment of ours goes to the dead-letter queue instead,
in the envelope the worker writes, so DLQ ingestion puts it in front of a human (triage).

Only the drop's regular files are read. A link (wherever it points), a pipe, a socket or a
device is moved aside into ``refused/`` unread and raises one alert; so is a name that turns
into one between the listing and the read.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from django.utils import timezone

from bank.nacha.inbound import nacha_inbound_store, nacha_inbound_stray_refuse
from bank.nacha.models import InboundStatus, NachaInboundEvent
from bank.nacha.received import received_name_shown
from bank.nacha.transports import FileChanged, NotARegularFile, Transport, TransportError
from callbacks import sqs
from payments.messages import dead_letter_marked, processor_event_body

logger = logging.getLogger(__name__)

UNKNOWN_TRACE = "UnknownTraceNumber"


@dataclass
class CollectResult:
    imported: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    seen_before: list[str] = field(default_factory=list)
    set_aside: list[str] = field(default_factory=list)  # not regular files: never read
    published: int = 0
    dead_lettered: int = 0


def _envelope(row: NachaInboundEvent) -> dict:
    return processor_event_body(row.event, received_at=row.created_at)


def nacha_events_publish_now(*, limit: int = 1000) -> tuple[int, int]:
    """Send the stored events not yet sent; (to the main queue, to the DLQ)."""
    published = dead_lettered = 0
    rows = list(NachaInboundEvent.objects.filter(published_at__isnull=True).order_by("id")[:limit])
    for row in rows:
        body = _envelope(row)
        now = timezone.now()
        if row.payment_id is not None:
            message_id = sqs.send_message_now(
                body=body, group_id=str(row.payment_id), deduplication_id=row.deduplication_id
            )
            published += 1
        else:
            body = dead_letter_marked(
                body,
                original_message_id=f"nacha-inbound-{row.pk}",
                attempts=0,
                error_class=UNKNOWN_TRACE,
                error=(
                    f"{row.code} in bank file {row.file_id} (record {row.record_number}) names "
                    f"trace number {row.original_trace_number}, which matches no entry of ours"
                ),
                first_started_at=now,
                dead_lettered_at=now,
            )
            message_id = sqs.send_message_now(
                body=body,
                group_id=f"nacha.{row.original_trace_number}",
                deduplication_id=row.deduplication_id,
                url=sqs.dead_letter_queue_url(),
            )
            dead_lettered += 1
            logger.error(
                "bank event for an unknown trace number dead-lettered",
                extra={"trace": row.original_trace_number, "message_id": message_id},
            )
        NachaInboundEvent.objects.filter(pk=row.pk).update(published_at=now, message_id=message_id)
    return published, dead_lettered


def _stray_refuse(transport: Transport, name: str, kind: str, result: CollectResult) -> None:
    try:
        location = transport.set_aside(name)
    except TransportError as exc:
        shown = received_name_shown(name)
        logger.error("could not set %s aside: %s", shown, exc, extra={"file": shown})
        location = None
    nacha_inbound_stray_refuse(name=name, kind=kind, set_aside_to=location)
    result.set_aside.append(name)


def nacha_files_collect(*, transport: Transport, min_age_seconds: float = 60.0) -> CollectResult:
    result = CollectResult()
    for stray in transport.strays():
        _stray_refuse(transport, stray.name, stray.kind, result)
    for name in transport.incoming(min_age_seconds=min_age_seconds):
        try:
            content = transport.read(name)
        except NotARegularFile as exc:
            _stray_refuse(transport, name, exc.kind, result)
            continue
        except FileChanged as exc:
            logger.warning(
                "%s", received_name_shown(str(exc)), extra={"file": received_name_shown(name)}
            )
            continue
        stored = nacha_inbound_store(name=name, content=content)
        if not stored.created:
            result.seen_before.append(name)
        elif stored.file.status == InboundStatus.REFUSED:
            result.refused.append(name)
        else:
            result.imported.append(name)
        # Stored here (refused ones too, for a human): out of the bank's drop.
        transport.collected(name)
    result.published, result.dead_lettered = nacha_events_publish_now()
    return result
