"""Entries and files of the bank path: a trace number per payment, and files cut per window.

``nacha_entry_add`` gives a payment its entry and trace number once (a retried submission
finds the same row). ``nacha_file_cut`` takes every entry not yet in a file, under row locks,
writes them into one file for the next window, and stores the file and each entry's place in
it in one transaction: an entry is in exactly one file, and a cut that fails leaves every entry
where it was. Delivering the stored bytes is the transport's job, after the commit.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from dataclasses import dataclass, field
from datetime import datetime, time, timedelta

from django.db import IntegrityError, transaction
from django.utils import timezone

from payments.alerts import AlertSeverity, alert_clear, alert_raise
from payments.models import Payment, PaymentState
from payments.nacha import settings as nacha_settings
from payments.nacha.accounts import AccountResolver, AccountUnavailable
from payments.nacha.models import NachaEntry, NachaFile, NachaTraceCounter
from payments.nacha.transports import DeliveryConflict, Transport
from payments.nacha.windows import EASTERN, WindowInstance, window_next
from payments.nacha.writer import DebitEntry, EntryRefused, entry_check, nacha_file_write
from payments.services.create import SUBMIT_PAYMENT, outbox_enqueue

logger = logging.getLogger(__name__)

FILE_ID_MODIFIERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
TRACE_SEQUENCE_LIMIT = 10**7


class FilesExhausted(Exception):
    """Every file ID modifier of the day is taken (36 files): the next cut waits a day."""


def _trace_allocate(odfi: str) -> str:
    counter, _ = NachaTraceCounter.objects.select_for_update().get_or_create(
        odfi_identification=odfi
    )
    counter.last_sequence += 1
    counter.save(update_fields=["last_sequence"])
    # Seven digits: after ten million entries the sequence starts again; the unique
    # constraint refuses a repeat that is still stored rather than letting it through.
    return f"{odfi}{counter.last_sequence % TRACE_SEQUENCE_LIMIT:07d}"


def nacha_entry_add(*, payment_id: uuid.UUID | str) -> NachaEntry:
    """The payment's entry, created with its trace number the first time, found after."""
    existing = NachaEntry.objects.filter(payment_id=payment_id).first()
    if existing is not None:
        return existing
    odfi = nacha_settings.originator().odfi_identification
    try:
        with transaction.atomic():
            Payment.objects.only("id").get(pk=payment_id)
            return NachaEntry.objects.create(
                payment_id=payment_id, trace_number=_trace_allocate(odfi)
            )
    except IntegrityError:
        # Another submission of the same payment won the race: its entry is the one.
        return NachaEntry.objects.get(payment_id=payment_id)


@dataclass
class CutResult:
    file: NachaFile | None
    window: WindowInstance
    refused: list[NachaEntry] = field(default_factory=list)


def _amount_cents(payment: Payment) -> int:
    return int(payment.amount * 100)


def nacha_file_cut(
    *,
    now: datetime,
    resolve_account: AccountResolver,
    lead: timedelta | None = None,
) -> CutResult:
    """Cut one file of the entries waiting, for the next window.

    With ``lead``, only when the window's bank cutoff is at most that far off (a scheduler
    calls this every few minutes and files go out once per window); without, now. A same-day
    window leaves an entry over the same-day limit for the next next-day window. An entry the
    resolver refuses is marked refused (its payment fails) and left out.
    """
    originator = nacha_settings.originator()
    window = window_next(now, windows=nacha_settings.windows(), buffer=nacha_settings.bank_buffer())
    if lead is not None and window.bank_cutoff - now > lead:
        return CutResult(None, window)
    with transaction.atomic():
        # One cut at a time per ODFI: the counter row is the lock, so two cutters never give
        # the same modifier or take the same entries.
        NachaTraceCounter.objects.select_for_update().get_or_create(
            odfi_identification=originator.odfi_identification
        )
        pending = list(
            NachaEntry.objects.select_for_update(of=("self",))
            .select_related("payment")
            .filter(file__isnull=True, refused_reason="")
            .order_by("trace_number")
        )
        entries: list[tuple[NachaEntry, DebitEntry]] = []
        refused: list[NachaEntry] = []
        for entry in pending:
            cents = _amount_cents(entry.payment)
            if not window.accepts(cents):
                continue
            try:
                if entry.payment.state != PaymentState.PENDING:
                    # Failed or settled some other way meanwhile: it must not be debited.
                    raise EntryRefused(f"the payment is {entry.payment.state}, not pending")
                account = resolve_account(entry.payment.source_token)
                if account.merchant_id is not None and account.merchant_id != (
                    entry.payment.merchant_id
                ):
                    raise EntryRefused("the account token belongs to another merchant")
                debit = DebitEntry(
                    trace_number=entry.trace_number,
                    sec_code=account.sec_code,
                    account_type=account.account_type,
                    routing_number=account.routing_number,
                    account_number=account.account_number,
                    amount_cents=cents,
                    identification=entry.payment_id.hex[:15],
                    receiver_name=account.holder_name,
                )
                # Each entry checked on its own, so one bad account refuses only itself.
                entry_check(debit, originator.odfi_identification)
            except (AccountUnavailable, EntryRefused) as exc:
                entry.refused_reason = str(exc)[:255]
                entry.save(update_fields=["refused_reason"])
                refused.append(entry)
                logger.warning(
                    "nacha entry refused",
                    extra={"payment_id": str(entry.payment_id), "trace": entry.trace_number},
                )
                continue
            entry.sec_code = debit.sec_code
            entries.append((entry, debit))
        if not entries:
            return CutResult(None, window, refused)
        created = now.astimezone(EASTERN)
        used = NachaFile.objects.filter(creation_date=created.date()).count()
        if used >= len(FILE_ID_MODIFIERS):
            raise FilesExhausted(f"{used} files were cut on {created.date()}")
        modifier = FILE_ID_MODIFIERS[used]
        content = nacha_file_write(
            originator=originator,
            entries=[debit for _, debit in entries],
            effective_entry_date=window.effective_entry_date,
            created_at=created,
            file_id_modifier=modifier,
        )
        cut = NachaFile.objects.create(
            window_name=window.name,
            bank_cutoff_at=window.bank_cutoff,
            effective_entry_date=window.effective_entry_date,
            creation_date=created.date(),
            file_id_modifier=modifier,
            name=f"{created:%Y%m%d}-{modifier}-{window.name}.ach",
            content=content.decode("ascii"),
            sha256=hashlib.sha256(content).hexdigest(),
            entry_count=len(entries),
            total_debit_cents=sum(d.amount_cents for _, d in entries),
        )
        for entry, _ in entries:
            entry.file = cut
            entry.save(update_fields=["file", "sec_code"])
    logger.info(
        "nacha file cut",
        extra={"file": cut.name, "entries": cut.entry_count, "window": window.name},
    )
    return CutResult(cut, window, refused)


def nacha_file_deliver(*, file_id: uuid.UUID | str, transport: Transport) -> NachaFile:
    """Send the stored bytes of a cut file, once: a file recorded as delivered is not sent
    again, and a retry after a crash between the transport's write and this record finds the
    same bytes at the bank and only records it. No lock is held during the transfer."""
    cut = NachaFile.objects.get(pk=file_id)
    if cut.delivered_at is not None:
        return cut
    try:
        location = transport.deliver(cut.name, cut.content.encode("ascii"))
    except DeliveryConflict:
        _delivery_conflict_alert(cut)
        raise
    with transaction.atomic():
        marked = NachaFile.objects.filter(pk=cut.pk, delivered_at__isnull=True).update(
            delivered_at=timezone.now(), delivered_to=location[:255]
        )
        if marked:
            # The file is at the bank: each of its payments is submitted now, by the usual
            # submission (the bank backend answers "accepted" for a delivered entry).
            for payment_id in cut.entries.values_list("payment_id", flat=True):
                outbox_enqueue(
                    kind=SUBMIT_PAYMENT,
                    group_id=str(payment_id),
                    body={"kind": SUBMIT_PAYMENT, "payment_id": str(payment_id)},
                )
    cut.refresh_from_db()
    logger.info("nacha file delivered", extra={"file": cut.name, "to": cut.delivered_to})
    if marked and cut.delivery_conflict_at is not None:
        # Someone cleared the bank's drop and the file went: the conflict is over.
        alert_clear(key=delivery_conflict_key(cut.name), reason="delivered")
    return cut


def delivery_conflict_key(name: str) -> str:
    return f"nacha.delivery_conflict:{name}"


def _delivery_conflict_alert(cut: NachaFile) -> None:
    """Raise the conflict's alert the first time it is met (marked under the row, so two
    rounds at once raise it once); a later round meets it again silently."""
    first = NachaFile.objects.filter(pk=cut.pk, delivery_conflict_at__isnull=True).update(
        delivery_conflict_at=timezone.now()
    )
    if not first:
        return
    alert_raise(
        severity=AlertSeverity.HIGH,
        key=delivery_conflict_key(cut.name),
        summary=(
            f"NACHA file {cut.name} is not delivered: the bank's drop already holds other bytes "
            f"under that name. Its {cut.entry_count} entries wait; compare the two files and "
            "remove the wrong one at the bank (the file is never overwritten)."
        ),
        details={
            "file": cut.name,
            "file_id": str(cut.pk),
            "sha256": cut.sha256,
            "entries": cut.entry_count,
            "window": cut.window_name,
        },
    )


# When an entry counts as settled: the end of its effective entry date (Eastern), by which the
# Fed has settled every window of that day.
SETTLED_AT = time(17, 0)


def nacha_entries_settle(*, now: datetime, limit: int = 1000) -> int:
    """Promise a ``settled`` event for each delivered entry whose effective entry date has
    passed; returns how many. Each entry's event is promised once (under its row lock, marked
    in the same transaction as its outbox row), and the event's id (``ach.<trace>.settled``)
    is deduplicated by the worker like any processor event's."""
    done = 0
    # The last effective date whose settlement moment has come.
    latest = (now.astimezone(EASTERN) - timedelta(hours=SETTLED_AT.hour)).date()
    with transaction.atomic():
        entries = list(
            NachaEntry.objects.select_for_update(of=("self",), skip_locked=True)
            .select_related("payment", "file")
            .filter(
                settled_event_at__isnull=True,
                file__delivered_at__isnull=False,
                file__effective_entry_date__lte=latest,
            )
            .order_by("pk")[:limit]
        )
        for entry in entries:
            settled = datetime.combine(entry.file.effective_entry_date, SETTLED_AT, tzinfo=EASTERN)
            event = {
                "payment_id": str(entry.payment_id),
                "event_type": "settled",
                "processor_event_id": f"ach.{entry.trace_number}.settled",
                "amount": f"{entry.payment.amount:.2f}",
                "timestamp": settled.isoformat(),
                "reason_code": "",
                "message": f"ACH entry {entry.trace_number}: effective date passed, no return",
            }
            outbox_enqueue(
                kind="processor_event",
                group_id=str(entry.payment_id),
                body={"kind": "processor_event", "event": event, "received_at": now.isoformat()},
            )
            entry.settled_event_at = now
            entry.save(update_fields=["settled_event_at"])
            done += 1
    return done


@dataclass
class SendResult:
    cut: CutResult
    delivered: list[NachaFile] = field(default_factory=list)
    settled: int = 0


def nacha_send_due(
    *, now: datetime, transport: Transport, resolve_account: AccountResolver, lead: timedelta | None
) -> SendResult:
    """One round of the bank path's outbound work: cut the closing window's file (or at once
    without ``lead``), deliver every file not yet delivered, oldest first, and settle the
    entries past their effective date. Each step is idempotent, so rounds may overlap."""
    result = SendResult(nacha_file_cut(now=now, resolve_account=resolve_account, lead=lead))
    for waiting in NachaFile.objects.filter(delivered_at__isnull=True).order_by("created_at"):
        result.delivered.append(nacha_file_deliver(file_id=waiting.pk, transport=transport))
    result.settled = nacha_entries_settle(now=now)
    return result
