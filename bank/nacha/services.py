"""Entries and files of the bank path: a trace number per payment, and files cut per window.

A payment is a debit, or money out (a refund or payout, ``direction="credit"``): a credit entry
to the account its ``source_token`` names, in a batch described ``REFUND`` or ``PAYOUT``.

``nacha_entry_add`` gives a payment its entry and trace number once (a retried submission
finds the same row). ``nacha_file_cut`` takes every entry not yet in a file, reveals the
accounts and writes and seals the file outside any transaction, then stores the file and each
entry's place in it in one short transaction under row locks, re-checking each entry: an entry
is in exactly one file, and a cut that fails leaves every entry where it was. Delivering the
stored bytes (opened from their sealed form) is the transport's job, after the commit.

A prenote (``NachaPrenote``, an account's validation) is written by the same cut, in the
merchant's batch, under a trace number of the same sequence; the delivery of its file starts
its wait (``payments.services.validation.prenote_sent``), and one the cut cannot write fails
its validation with the reason.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from dataclasses import dataclass, field
from datetime import datetime, time, timedelta

from django.db import IntegrityError, transaction
from django.utils import timezone

from bank.nacha import settings as nacha_settings
from bank.nacha.accounts import AccountResolver, AccountUnavailable, BankAccount
from bank.nacha.models import NachaEntry, NachaFile, NachaPrenote, NachaTraceCounter
from bank.nacha.sealing import content_seal, outbound_aad
from bank.nacha.transports import DeliveryConflict, Transport
from bank.nacha.windows import EASTERN, WindowInstance, window_next
from bank.nacha.writer import (
    EntryRefused,
    FileEntry,
    Originator,
    batch_numbers,
    entry_check,
    nacha_file_write,
)
from payments import originator as originator_rules
from payments.alerts import AlertSeverity, alert_clear, alert_raise
from payments.catalogue import SETTLED
from payments.messages import MessageKind, processor_event_body, submit_payment_body
from payments.models import (
    AccountValidation,
    OriginatorProfile,
    Payment,
    PaymentDirection,
    PaymentPurpose,
    PaymentState,
    ValidationMethod,
    ValidationState,
)
from payments.processor.backend import DebitSent
from payments.services.create import outbox_enqueue
from payments.services.validation import prenote_refused, prenote_sent

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


def nacha_prenote_add(*, validation_id: int, account_token: str, merchant_id: str) -> str:
    """Queue a prenote of the account for the next cut; its trace number. Call in the
    transaction that starts the validation (``payments.validation_methods.Prenote``), so the
    prenote is queued exactly when the validation is pending on it."""
    odfi = nacha_settings.originator().odfi_identification
    prenote = NachaPrenote.objects.create(
        validation_id=validation_id,
        account_token=account_token,
        merchant_id=merchant_id,
        trace_number=_trace_allocate(odfi),
    )
    logger.info(
        "nacha prenote queued",
        extra={"merchant_id": merchant_id, "trace": prenote.trace_number},
    )
    return prenote.trace_number


CANCELED_REASON = "the payment was canceled before origination"


def nacha_entry_withdraw(*, payment_id: uuid.UUID | str) -> None:
    """Keep a payment being canceled out of every file to come; ``DebitSent`` when a file
    already holds its entry. Call inside the cancel's transaction, under the payment's lock.

    The entry's row lock is the one a cut stores under (``_cut_store``), so a cancel and a cut
    have one winner: the cut that stored first is seen here (the row read under the lock is the
    latest), and a cut that waits for this lock finds the entry refused. The refusal is written,
    not only the lock taken: PostgreSQL re-checks a locked row's conditions after the wait only
    when the row changed, and the cut reads the payment's state without a lock of its own. A
    payment with no entry yet gets none that a cut takes: a later submission finds it canceled
    before it asks for one, and a cut refuses a payment that is not pending."""
    entry = NachaEntry.objects.select_for_update().filter(payment_id=payment_id).first()
    if entry is None:
        return
    if entry.file_id is not None:
        raise DebitSent(f"entry {entry.trace_number} is in file {entry.file_id}")
    if not entry.refused_reason:
        entry.refused_reason = CANCELED_REASON
        entry.save(update_fields=["refused_reason"])


@dataclass
class CutResult:
    file: NachaFile | None
    window: WindowInstance
    refused: list[NachaEntry] = field(default_factory=list)


def _amount_cents(payment: Payment) -> int:
    return int(payment.amount * 100)


# How often a cut plans again when the entries changed between its plan and its lock (a
# concurrent cut took some, a payment failed meanwhile); after that the next round cuts.
CUT_PLANS = 3


@dataclass
class _CutPlan:
    """What a cut means to store, worked out outside any transaction: the entries it takes
    with their debits, the entries it refuses with the reason, and the file's bytes sealed."""

    usable: list[tuple[NachaEntry, FileEntry]]
    refusals: list[tuple[NachaEntry, str]]
    prenotes: list[tuple[NachaPrenote, FileEntry]] = field(default_factory=list)
    prenote_refusals: list[tuple[NachaPrenote, str]] = field(default_factory=list)
    files_that_day: int = 0
    created: datetime | None = None
    content: bytes = b""
    file_id: uuid.UUID | None = None
    sealed: dict = field(default_factory=dict)
    # Each written entry's batch number in the file, by trace number.
    batch_numbers: dict[str, int] = field(default_factory=dict)


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

    The resolver (the vault: a KMS call per account with the KMS holder) and the sealing of the
    file are asked outside any transaction: the cut first plans (reads the waiting entries,
    reveals their accounts, writes and seals the file), then stores in one short transaction
    holding the ODFI's counter row and the entries' rows, but only if the plan still holds:
    each entry still waiting and its payment still pending, and the day's file count (the
    modifier) unchanged. Otherwise it plans again with the accounts already revealed; an entry
    it cannot use is left waiting for the next cut, never lost, never in two files. A key holder
    that cannot be asked (``VaultUnavailable``) stops the cut before anything is stored.
    """
    originator = nacha_settings.originator()
    window = window_next(now, windows=nacha_settings.windows(), buffer=nacha_settings.bank_buffer())
    if lead is not None and window.bank_cutoff - now > lead:
        return CutResult(None, window)
    accounts: dict[str, BankAccount | AccountUnavailable] = {}
    refused: list[NachaEntry] = []
    for _ in range(CUT_PLANS):
        plan = _cut_plan(
            now=now,
            window=window,
            originator=originator,
            resolve_account=resolve_account,
            accounts=accounts,
        )
        for prenote, reason in plan.prenote_refusals:
            _prenote_refuse(prenote, reason)
        cut, stale = _cut_store(plan, window=window, originator=originator, refused=refused)
        if cut is not None:
            logger.info(
                "nacha file cut",
                extra={"file": cut.name, "entries": cut.entry_count, "window": window.name},
            )
            return CutResult(cut, window, refused)
        if not stale:
            return CutResult(None, window, refused)
    logger.warning("nacha cut: the waiting entries kept changing; the next round cuts them")
    return CutResult(None, window, refused)


def _resolved(
    token: str,
    resolve_account: AccountResolver,
    accounts: dict[str, BankAccount | AccountUnavailable],
) -> BankAccount:
    if token not in accounts:
        try:
            accounts[token] = resolve_account(token)
        except AccountUnavailable as exc:
            accounts[token] = exc
    found = accounts[token]
    if isinstance(found, AccountUnavailable):
        raise found
    return found


# A credit's batch description, by what it is for, when its payment names none (a row written
# before payments carried their description): the receiver's statement shows it.
CREDIT_DESCRIPTIONS = {
    PaymentPurpose.REFUND: originator_rules.REFUND,
    PaymentPurpose.PAYOUT: originator_rules.PAYOUT,
}


def _file_entry(
    entry: NachaEntry,
    account: BankAccount,
    cents: int,
    profile: OriginatorProfile | None = None,
) -> FileEntry:
    """The entry's line of the file: a debit from the account, or a credit to it, in its
    payment's class (the account's for a payment that names none), described as its payment
    says, under its merchant's company (``profile``; None: the originator's)."""
    payment = entry.payment
    sec_code = payment.sec_code or account.sec_code
    common = {
        "trace_number": entry.trace_number,
        "account_type": account.account_type,
        "routing_number": account.routing_number,
        "account_number": account.account_number,
        "amount_cents": cents,
        "identification": entry.payment_id.hex[:15],
        "receiver_name": account.holder_name,
    }
    if profile is not None:
        common["company_name"] = profile.company_name
        common["company_identification"] = profile.company_identification
    if payment.direction != PaymentDirection.CREDIT:
        return FileEntry(sec_code=sec_code, description=payment.entry_description, **common)
    # WEB credits are for person-to-person payments only: a consumer's refund or payout is PPD.
    return FileEntry(
        sec_code=originator_rules.credit_sec_code(sec_code),
        direction="credit",
        description=payment.entry_description
        or CREDIT_DESCRIPTIONS.get(payment.purpose, originator_rules.REFUND),
        **common,
    )


def _cut_plan(
    *,
    now: datetime,
    window: WindowInstance,
    originator: Originator,
    resolve_account: AccountResolver,
    accounts: dict[str, BankAccount | AccountUnavailable],
) -> _CutPlan:
    """The cut worked out outside any transaction (see ``nacha_file_cut``)."""
    waiting = (
        NachaEntry.objects.select_related("payment")
        .filter(file__isnull=True, refused_reason="")
        .order_by("trace_number")
    )
    plan = _CutPlan(usable=[], refusals=[])
    waiting = list(waiting)
    prenotes = list(
        NachaPrenote.objects.select_related("validation")
        .filter(file__isnull=True, refused_reason="")
        .order_by("trace_number")
    )
    # The merchants' originator profiles, in one read: each batch names its merchant's company.
    profiles = {
        profile.merchant_id: profile
        for profile in OriginatorProfile.objects.filter(
            merchant_id__in={entry.payment.merchant_id for entry in waiting}
            | {prenote.merchant_id for prenote in prenotes}
        )
    }
    for prenote in prenotes:
        try:
            if problem := _prenote_unsendable(prenote, prenote.validation):
                raise EntryRefused(problem)
            account = _resolved(prenote.account_token, resolve_account, accounts)
            if account.merchant_id is not None and account.merchant_id != prenote.merchant_id:
                raise EntryRefused("the account token belongs to another merchant")
            line = _prenote_entry(prenote, account, profiles.get(prenote.merchant_id))
            entry_check(line, originator.odfi_identification)
        except (AccountUnavailable, EntryRefused) as exc:
            plan.prenote_refusals.append((prenote, str(exc)[:255]))
            continue
        plan.prenotes.append((prenote, line))
    for entry in waiting:
        cents = _amount_cents(entry.payment)
        if not window.accepts(cents):
            continue
        try:
            if entry.payment.state != PaymentState.PENDING:
                # Failed or settled some other way meanwhile: it must not be sent.
                raise EntryRefused(f"the payment is {entry.payment.state}, not pending")
            account = _resolved(entry.payment.source_token, resolve_account, accounts)
            if account.merchant_id is not None and account.merchant_id != (
                entry.payment.merchant_id
            ):
                raise EntryRefused("the account token belongs to another merchant")
            debit = _file_entry(entry, account, cents, profiles.get(entry.payment.merchant_id))
            # Each entry checked on its own, so one bad account refuses only itself.
            entry_check(debit, originator.odfi_identification)
        except (AccountUnavailable, EntryRefused) as exc:
            plan.refusals.append((entry, str(exc)[:255]))
            continue
        plan.usable.append((entry, debit))
    if not plan.usable and not plan.prenotes:
        return plan
    plan.created = now.astimezone(EASTERN)
    plan.files_that_day = NachaFile.objects.filter(creation_date=plan.created.date()).count()
    if plan.files_that_day >= len(FILE_ID_MODIFIERS):
        raise FilesExhausted(f"{plan.files_that_day} files were cut on {plan.created.date()}")
    written = [debit for _, debit in plan.usable] + [line for _, line in plan.prenotes]
    plan.batch_numbers = batch_numbers(originator=originator, entries=written)
    plan.content = nacha_file_write(
        originator=originator,
        entries=written,
        effective_entry_date=window.effective_entry_date,
        created_at=plan.created,
        file_id_modifier=FILE_ID_MODIFIERS[plan.files_that_day],
    )
    plan.file_id = uuid.uuid4()
    plan.sealed = content_seal(
        plan.content,
        aad=outbound_aad(file_id=plan.file_id, sha256=hashlib.sha256(plan.content).hexdigest()),
    )
    return plan


def _cut_store(
    plan: _CutPlan, *, window: WindowInstance, originator: Originator, refused: list[NachaEntry]
) -> tuple[NachaFile | None, bool]:
    """Store the plan under the locks if it still holds: (the file, False); (None, True) when
    it no longer does and must be planned again; (None, False) when there is nothing to cut.
    The plan's refusals of entries still waiting are recorded either way."""
    planned = [entry.pk for entry, _ in plan.usable] + [entry.pk for entry, _ in plan.refusals]
    planned_prenotes = [prenote.pk for prenote, _ in plan.prenotes]
    if not planned and not planned_prenotes:
        return None, False
    with transaction.atomic():
        # One cut at a time per ODFI: the counter row is the lock, so two cutters never give
        # the same modifier or take the same entries.
        NachaTraceCounter.objects.select_for_update().get_or_create(
            odfi_identification=originator.odfi_identification
        )
        locked = {
            entry.pk: entry
            for entry in NachaEntry.objects.select_for_update(of=("self",))
            .select_related("payment")
            .filter(pk__in=planned, file__isnull=True, refused_reason="")
        }
        for entry, reason in plan.refusals:
            if entry.pk in locked:
                _entry_refuse(locked[entry.pk], reason, refused)
        # The prenotes' rows, locked (their validations only read: a validation's lock is taken
        # before the counter's by a start, so never after it here). A validation that ended or
        # was reset meanwhile (a NOC) has its prenote left out, never sent; one that ends after
        # this read finds its prenote at the bank and ignores it (``prenote_sent``).
        locked_prenotes = {
            prenote.pk: prenote
            for prenote in NachaPrenote.objects.select_for_update(of=("self",))
            .select_related("validation")
            .filter(pk__in=planned_prenotes, file__isnull=True, refused_reason="")
        }
        stale = False
        for prenote, _ in plan.prenotes:
            now_prenote = locked_prenotes.get(prenote.pk)
            if now_prenote is None:
                stale = True
            elif problem := _prenote_unsendable(now_prenote, now_prenote.validation):
                now_prenote.refused_reason = problem[:255]
                now_prenote.save(update_fields=["refused_reason"])
                stale = True
        for entry, _ in plan.usable:
            now_entry = locked.get(entry.pk)
            if now_entry is None:
                stale = True  # another cut took it, or it was refused meanwhile
            elif now_entry.payment.state != PaymentState.PENDING:
                reason = f"the payment is {now_entry.payment.state}, not pending"
                _entry_refuse(now_entry, reason, refused)
                stale = True
        if not plan.usable and not plan.prenotes:
            return None, False
        if stale or plan.files_that_day != (
            NachaFile.objects.filter(creation_date=plan.created.date()).count()
        ):
            return None, True
        created = plan.created
        modifier = FILE_ID_MODIFIERS[plan.files_that_day]
        cut = NachaFile.objects.create(
            id=plan.file_id,
            window_name=window.name,
            bank_cutoff_at=window.bank_cutoff,
            effective_entry_date=window.effective_entry_date,
            creation_date=created.date(),
            file_id_modifier=modifier,
            name=f"{created:%Y%m%d}-{modifier}-{window.name}.ach",
            sha256=hashlib.sha256(plan.content).hexdigest(),
            entry_count=len(plan.usable) + len(plan.prenotes),
            # Debits only, as the column says; the file's credits are in its controls.
            total_debit_cents=sum(d.amount_cents for _, d in plan.usable if d.direction == "debit"),
            **plan.sealed,
        )
        for entry, debit in plan.usable:
            taken = locked[entry.pk]
            taken.file = cut
            taken.sec_code = debit.sec_code
            taken.batch_number = plan.batch_numbers[debit.trace_number]
            taken.save(update_fields=["file", "sec_code", "batch_number"])
        for prenote, line in plan.prenotes:
            taken = locked_prenotes[prenote.pk]
            taken.file = cut
            taken.sec_code = line.sec_code
            taken.save(update_fields=["file", "sec_code"])
    return cut, False


def _prenote_unsendable(prenote: NachaPrenote, validation: AccountValidation) -> str | None:
    """Why the prenote must not go out: its validation no longer waits on it."""
    current = validation.evidence.get("prenote", {}).get("trace_number")
    if (
        validation.state != ValidationState.PENDING
        or validation.method != ValidationMethod.PRENOTE
        or current != prenote.trace_number
    ):
        return f"its account validation is {validation.state} and no longer waits on it"
    return None


def _prenote_entry(
    prenote: NachaPrenote, account: BankAccount, profile: OriginatorProfile | None
) -> FileEntry:
    """The prenote's line: a zero-dollar debit prenote of the account's type and class, in the
    merchant's batch (its company, its own description; the originator's without a profile)."""
    company = {}
    if profile is not None:
        company = {
            "company_name": profile.company_name,
            "company_identification": profile.company_identification,
            "description": profile.default_entry_description,
        }
    return FileEntry(
        trace_number=prenote.trace_number,
        sec_code=account.sec_code,
        account_type=account.account_type,
        routing_number=account.routing_number,
        account_number=account.account_number,
        amount_cents=0,
        identification=f"PRENOTE{prenote.validation_id}",
        receiver_name=account.holder_name,
        prenote=True,
        **company,
    )


def _prenote_refuse(prenote: NachaPrenote, reason: str) -> None:
    """Leave the prenote out of every file, and fail its validation (if it still waits on it)
    with the reason, in a transaction of its own, before the cut stores: the validation's row
    is locked first, then the prenote's, the order a start takes (validation, then the trace
    counter) and the cut's store (the counter, then the prenotes) agree with. A prenote a
    concurrent cut took meanwhile is left to it."""
    with transaction.atomic():
        AccountValidation.objects.select_for_update().filter(
            account_token=prenote.account_token
        ).first()
        waiting = (
            NachaPrenote.objects.select_for_update()
            .filter(pk=prenote.pk, file__isnull=True, refused_reason="")
            .first()
        )
        if waiting is None:
            return
        waiting.refused_reason = reason[:255]
        waiting.save(update_fields=["refused_reason"])
        prenote_refused(
            account_token=prenote.account_token, trace_number=prenote.trace_number, reason=reason
        )
    logger.warning(
        "nacha prenote refused",
        extra={"merchant_id": prenote.merchant_id, "trace": prenote.trace_number},
    )


def _entry_refuse(entry: NachaEntry, reason: str, refused: list[NachaEntry]) -> None:
    entry.refused_reason = reason
    entry.save(update_fields=["refused_reason"])
    refused.append(entry)
    logger.warning(
        "nacha entry refused",
        extra={"payment_id": str(entry.payment_id), "trace": entry.trace_number},
    )


def nacha_file_deliver(*, file_id: uuid.UUID | str, transport: Transport) -> NachaFile:
    """Send the stored bytes of a cut file, once: a file recorded as delivered is not sent
    again, and a retry after a crash between the transport's write and this record finds the
    same bytes at the bank and only records it. No lock is held during the transfer."""
    cut = NachaFile.objects.get(pk=file_id)
    if cut.delivered_at is not None:
        return cut
    try:
        # Opened here, outside any transaction (the key holder may be a network away); a
        # holder that cannot be asked raises VaultUnavailable and the next round delivers.
        location = transport.deliver(cut.name, cut.content_bytes())
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
                    kind=MessageKind.SUBMIT_PAYMENT,
                    group_id=str(payment_id),
                    body=submit_payment_body(payment_id),
                )
            # Each prenote's wait starts from the file's settlement date.
            for token, trace in cut.prenotes.values_list("account_token", "trace_number"):
                prenote_sent(
                    account_token=token,
                    trace_number=trace,
                    settlement_date=cut.effective_entry_date,
                    file_name=cut.name,
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
                "event_type": SETTLED.name,
                "processor_event_id": f"ach.{entry.trace_number}.settled",
                "amount": f"{entry.payment.amount:.2f}",
                "timestamp": settled.isoformat(),
                "reason_code": "",
                "message": f"ACH entry {entry.trace_number}: effective date passed, no return",
            }
            if entry.payment.direction == PaymentDirection.CREDIT:
                event["direction"] = PaymentDirection.CREDIT.value
            outbox_enqueue(
                kind=MessageKind.PROCESSOR_EVENT,
                group_id=str(entry.payment_id),
                body=processor_event_body(event, received_at=now),
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
