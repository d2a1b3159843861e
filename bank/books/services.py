"""Writes of the books: a statement stored and its lines read, each line matched against what we
sent and booked, a banking day checked, and a variance explained by a person.

A variance is never plugged. Matching only ever records what agrees (a ``StatementMatch``);
what does not agree is a ``BooksVariance`` with its evidence (the bank line, the batch's file,
the payments), open until a person explains it with a note (``variance_explain``: an audit
row, who and when) or a later bank line clears it (the bank posting a settlement a day late).

Expectations come from the records of the bank path: a batch is the entries of one batch of a
file we delivered (its batch number, recorded when the cut wrote it; for a file written before
that, the entries of one SEC code), due at the bank on the file's effective entry date, as the
bank settles each batch with a line of its own; a return is
a ``PaymentReturn`` of a debit we sent through the bank, due on its banking day. A batch or a
return can be missing only once the bank has reported that day (a ``StatementDay``): a day
not reported yet is checked as far as it goes.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date, timedelta
from decimal import Decimal

from django.db import IntegrityError, InterfaceError, OperationalError, transaction
from django.utils import timezone

from bank import conf
from bank.books.bai2 import CREDIT, DEBIT, Statement, StatementFormatError, parse_bai2
from bank.books.models import (
    BankStatement,
    BooksVariance,
    MatchKind,
    MatchStatus,
    StatementDay,
    StatementLine,
    StatementMatch,
    StatementStatus,
    VarianceExplanation,
    VarianceKind,
    VarianceStatus,
)
from bank.books.selectors import day_reported
from bank.nacha.models import NachaEntry, NachaFile
from bank.nacha.received import received_file_store
from bank.nacha.sealing import statement_aad
from payments.alerts import AlertSeverity, alert_key_bounded, alert_raise
from payments.banking_days import ach_date, end_of_banking_day, is_banking_day
from payments.kernel.bank_numbers import mask_bank_numbers
from payments.models import Payment, PaymentReturn

logger = logging.getLogger(__name__)

# How far back a bank line looks for what it settles: a bank that posts a batch or a return
# days late is still matched; an older expectation is already a variance for a person.
MATCH_LOOKBACK = timedelta(days=10)
IMPORT_BATCH = 2000
# How much of a reader's failure a refused statement keeps as its reason (record 0: none named).
READER_FAILURE_CHARS = 2000
TRACE = re.compile(r"\b\d{15}\b")
# How a bank names the batch it settles in its reference: B and the batch number.
BATCH_REFERENCE = re.compile(r"^B(\d{7})$")


class VarianceNotOpen(Exception):
    """Only an open variance can be explained."""


@dataclass(frozen=True)
class StatementResult:
    statement: BankStatement
    created: bool


def _fingerprint(*parts: object) -> str:
    return hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()


def refused_statement_key(stored: BankStatement) -> str:
    """The file's name (the bank's: bounded, the whole name is in the alert's details) and the
    start of its hash."""
    return alert_key_bounded(f"books.statement_refused:{stored.name}:{stored.sha256[:12]}")


def bank_statement_store(*, name: str, content: bytes) -> StatementResult:
    """Keep the statement whole (sealed first, outside any transaction: ``VaultUnavailable``
    stores nothing) and its lines, or keep it refused naming the record, with a high alert
    once per file's bytes. The same bytes again are the same row."""
    stored, created = received_file_store(
        model=BankStatement,
        name=name,
        content=content,
        aad=lambda sha: statement_aad(sha256=sha),
        read=_import,
        format_error=StatementFormatError,
        refused_status=StatementStatus.REFUSED,
        refused=_refused,
    )
    return StatementResult(stored, created=created)


def _refused(stored: BankStatement) -> None:
    logger.error(
        "bank statement refused: %s",
        f"record {stored.refused_record}: {stored.refused_reason}",
        extra={"file": stored.name, "record": stored.refused_record},
    )
    alert_raise(
        severity=AlertSeverity.HIGH,
        key=refused_statement_key(stored),
        summary=(
            f"bank statement {stored.name} refused whole at record {stored.refused_record}: "
            f"{stored.refused_reason}. Nothing of it was imported; it is kept (statement "
            f"{stored.pk}) for a human, and its days stay unreconciled until the bank "
            "resends it."
        ),
        details={
            "file": stored.name,
            "statement_id": stored.pk,
            "sha256": stored.sha256,
            "record": stored.refused_record,
            "reason": stored.refused_reason,
        },
    )


def _import(name: str, content: bytes, sha: str, sealed: dict) -> BankStatement:
    """Read and store the statement, or refuse it whole: a failure of the reader's own (an
    exception no rule of the format names) refuses this file with its reason, as a broken
    record does, instead of ending the round before the files after it. A database that
    cannot be reached, and the same bytes stored by another reader at once, are not the
    file's: they are raised."""
    try:
        return _import_read(name, content, sha, sealed)
    except (StatementFormatError, IntegrityError, OperationalError, InterfaceError):
        raise
    except Exception as exc:  # noqa: BLE001 - refused with its reason, never the round's end
        logger.exception("bank statement %s: the reader failed", name)
        reason = mask_bank_numbers(f"the statement could not be read ({type(exc).__name__}: {exc})")
        raise StatementFormatError(0, reason[:READER_FAILURE_CHARS]) from exc


def _import_read(name: str, content: bytes, sha: str, sealed: dict) -> BankStatement:
    parsed = parse_bai2(content)
    stored = BankStatement.objects.create(
        name=name[:255], sha256=sha, status=StatementStatus.IMPORTED, **sealed
    )
    rows: list[StatementLine] = []
    seen: dict[str, int] = defaultdict(int)
    shown = _line_masking(parsed)
    for group in parsed.groups:
        for account in group.accounts:
            last4 = account.number[-4:]
            currency = account.currency or group.currency
            StatementDay.objects.get_or_create(
                statement=stored,
                account_last4=last4,
                currency=currency,
                as_of_date=group.as_of_date,
                defaults={"final": group.final},
            )
            for tx in account.transactions:
                identity = _fingerprint(
                    account.number,
                    currency,
                    group.as_of_date,
                    tx.type_code,
                    tx.amount_cents,
                    tx.bank_reference,
                    tx.customer_reference,
                    tx.text,
                )
                seen[identity] += 1
                rows.append(
                    StatementLine(
                        statement=stored,
                        record_number=tx.record_number,
                        account_last4=last4,
                        currency=currency,
                        as_of_date=group.as_of_date,
                        type_code=tx.type_code,
                        direction=tx.direction,
                        amount=Decimal(tx.amount_cents) / 100,
                        bank_reference=shown(tx.bank_reference),
                        customer_reference=shown(tx.customer_reference),
                        text=shown(tx.text),
                        # The nth identical line of a day is the nth in a resent statement.
                        fingerprint=_fingerprint(identity, seen[identity]),
                    )
                )
    known: set[str] = set()
    for at in range(0, len(rows), IMPORT_BATCH):
        chunk = [row.fingerprint for row in rows[at : at + IMPORT_BATCH]]
        known.update(
            StatementLine.objects.filter(fingerprint__in=chunk).values_list(
                "fingerprint", flat=True
            )
        )
    StatementLine.objects.bulk_create(
        [row for row in rows if row.fingerprint not in known], batch_size=IMPORT_BATCH
    )
    count = len(rows)
    stored.line_count = count
    stored.save(update_fields=["line_count"])
    return stored


def _line_masking(parsed: Statement) -> Callable[[str], str]:
    """How a line's references and text are stored: the bank's free text, so with its bank
    numbers masked (``mask_bank_numbers``), but with what matching reads in it kept whole when
    it is ours: the trace number of an entry we sent (a return names it), the name of a file
    we delivered (a settlement names it; ``20261130-A.ach`` holds 8 digits), and the reference
    of a batch of such a file (``B0000002``, the bank's name for the batch it settles) standing
    alone, never as a part of a longer run of digits."""
    texts = [
        value
        for _, _, tx in parsed.transactions()
        for value in (tx.bank_reference, tx.customer_reference, tx.text)
    ]
    if not texts:
        return mask_bank_numbers
    days = [group.as_of_date for group in parsed.groups]
    traces = {trace for text in texts for trace in TRACE.findall(text)}
    ours = set(
        NachaEntry.objects.filter(trace_number__in=traces).values_list("trace_number", flat=True)
    )
    names = NachaFile.objects.filter(
        delivered_at__isnull=False,
        effective_entry_date__range=(min(days) - MATCH_LOOKBACK, max(days) + MATCH_LOOKBACK),
    ).values_list("name", flat=True)
    files = {name for name in names if any(name in text for text in texts)}
    ours.update(files)
    if not ours:
        return mask_bank_numbers
    patterns = [re.escape(o) for o in sorted(ours, key=len, reverse=True)]
    numbers = (
        NachaEntry.objects.filter(file__name__in=files, batch_number__isnull=False)
        .values_list("batch_number", flat=True)
        .distinct()
    )
    patterns += [rf"(?<![0-9A-Za-z])B{number:07d}(?![0-9])" for number in numbers]
    kept = re.compile("|".join(patterns))

    def shown(text: str) -> str:
        parts, at = [], 0
        for found in kept.finditer(text):
            parts += [mask_bank_numbers(text[at : found.start()]), found.group()]
            at = found.end()
        return "".join([*parts, mask_bank_numbers(text[at:])])

    return shown


# --- matching ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Batch:
    file: NachaFile
    # None: the entries of a file written before batch numbers were recorded, one SEC code.
    number: int | None
    sec_code: str
    amount: Decimal
    payment_ids: tuple

    @property
    def key(self) -> tuple:
        """What it is matched by: file and batch number, or file and SEC code when unnumbered
        (a numbered batch has one SEC code, so the triple names it either way)."""
        return (self.file.pk, self.number, self.sec_code)

    @property
    def label(self) -> str:
        if self.number is None:
            return f"batch {self.sec_code} of file {self.file.name}"
        return f"batch {self.number} ({self.sec_code}) of file {self.file.name}"


def _batches(files) -> list[Batch]:
    entries = NachaEntry.objects.filter(file__in=files, refused_reason="").values_list(
        "file_id", "batch_number", "sec_code", "payment_id", "payment__amount"
    )
    totals: dict[tuple, Decimal] = defaultdict(Decimal)
    ids: dict[tuple, list] = defaultdict(list)
    for file_id, number, sec_code, payment_id, amount in entries:
        totals[(file_id, number, sec_code)] += amount
        ids[(file_id, number, sec_code)].append(payment_id)
    by_id = {f.pk: f for f in files}
    batches = [
        Batch(by_id[key[0]], key[1], key[2], total, tuple(ids[key]))
        for key, total in totals.items()
    ]
    return sorted(
        batches,
        key=lambda b: (b.file.effective_entry_date, b.file.name, b.number or 0, b.sec_code),
    )


def _unmatched_batches(until: date) -> list[Batch]:
    """The batches due by ``until`` within the look-back, not matched to a line yet."""
    files = list(
        NachaFile.objects.filter(
            delivered_at__isnull=False,
            effective_entry_date__range=(until - MATCH_LOOKBACK, until),
        )
    )
    matched = _matched_batch_keys(nacha_file__in=files)
    return [b for b in _batches(files) if b.key not in matched]


def _matched_batch_keys(**files) -> set[tuple]:
    return set(
        StatementMatch.objects.filter(kind=MatchKind.BATCH, **files).values_list(
            "nacha_file_id", "batch_number", "sec_code"
        )
    )


def _merchants(payment_ids) -> list[str]:
    return sorted(
        set(Payment.objects.filter(pk__in=payment_ids).values_list("merchant_id", flat=True))
    )


def _variance(*, key: str, payment_ids=(), **fields) -> BooksVariance:
    variance, created = BooksVariance.objects.get_or_create(key=key, defaults=fields)
    if created and payment_ids:
        variance.payments.set(payment_ids)
    return variance


def _mentions(line: StatementLine, needle: str) -> bool:
    return bool(needle) and any(
        needle in value for value in (line.customer_reference, line.bank_reference, line.text)
    )


def _record_match(line: StatementLine, matches: list[StatementMatch], status: str) -> None:
    for match in matches:
        match.line = line
        match.save()
    line.match_status = status
    line.matched_amount = sum((m.expected_amount for m in matches), Decimal(0))
    line.save(update_fields=["match_status", "matched_amount"])
    # A variance the bank's late line answers is cleared, with the line as its evidence.
    for match in matches:
        keys = (
            [_missing_batch_key(match.nacha_file_id, match.batch_number, match.sec_code)]
            if match.kind == MatchKind.BATCH
            else [_missing_return_key(match.payment_id)]
        )
        BooksVariance.objects.filter(key__in=keys, status=VarianceStatus.OPEN).update(
            status=VarianceStatus.CLEARED, cleared_at=timezone.now(), cleared_by_line=line
        )


def _missing_batch_key(file_id, number: int | None, sec_code: str) -> str:
    # An unnumbered batch keeps the key it always had, so a re-check finds its variance.
    if number is None:
        return f"missing_settlement:{file_id}:{sec_code}"
    return f"missing_settlement:{file_id}:B{number}"


def _named_batch(line: StatementLine) -> int | None:
    """The batch number the line's bank reference names (``B0000002``), if it names one."""
    found = BATCH_REFERENCE.match(line.bank_reference.strip())
    return int(found.group(1)) if found else None


def _missing_return_key(payment_id) -> str:
    return f"missing_return:{payment_id}"


def _extra_line_key(line: StatementLine) -> str:
    return f"extra_line:{line.pk}"


def _match_settlement(line: StatementLine, *, exact_only: bool) -> None:
    candidates = _unmatched_batches(line.as_of_date)
    named = [b for b in candidates if _mentions(line, b.file.name)]
    # Of the file's batches, the one the bank's reference names: two batches of one class (two
    # merchants', a micro-entry round beside a merchant's) are told apart by their numbers.
    number = _named_batch(line)
    by_number = [b for b in named if b.number is not None and b.number == number]
    named = by_number or named
    pool = named or candidates
    # The same day first, then earlier days (a bank that settled late).
    pool = sorted(pool, key=lambda b: (b.file.effective_entry_date != line.as_of_date,))
    exact = [b for b in pool if b.amount == line.amount]
    if exact:
        batch = exact[0]
        _record_match(line, [_batch_match(batch)], MatchStatus.MATCHED)
        return
    if exact_only:
        return
    if named:
        # The line names our file but settles another amount: partly matched, and a variance.
        # Of the file's batches, the one whose number the line names; else the one whose SEC
        # code its text names (an unnumbered file's), else the nearest.
        by_sec = [b for b in named if re.search(rf"\b{b.sec_code}\b", line.text)]
        batch = min(by_sec or named, key=lambda b: abs(b.amount - line.amount))
        _record_match(line, [_batch_match(batch)], MatchStatus.PARTIAL)
        _variance(
            key=f"short_amount:{line.pk}",
            day=line.as_of_date,
            kind=VarianceKind.SHORT_AMOUNT,
            currency=line.currency,
            merchant_ids=_merchants(batch.payment_ids),
            expected_amount=batch.amount,
            bank_amount=line.amount,
            line=line,
            nacha_file=batch.file,
            batch_number=batch.number,
            sec_code=batch.sec_code,
            payment_ids=batch.payment_ids,
            summary=(
                f"the bank settled {line.amount} for {batch.label}, which is {batch.amount}: "
                f"{batch.amount - line.amount} unexplained"
            ),
        )
        return
    _extra(line)


def _batch_match(batch: Batch) -> StatementMatch:
    return StatementMatch(
        kind=MatchKind.BATCH,
        nacha_file=batch.file,
        batch_number=batch.number,
        sec_code=batch.sec_code,
        expected_amount=batch.amount,
    )


def _unmatched_returns(until: date):
    """The returns of debits we sent through the bank, from the look-back on, not matched."""
    matched = StatementMatch.objects.filter(kind=MatchKind.RETURN).values("payment_id")
    since = end_of_banking_day(until - MATCH_LOOKBACK - timedelta(days=1))
    return (
        PaymentReturn.objects.filter(
            payment__nacha_entry__file__isnull=False, returned_at__gt=since
        )
        .exclude(payment_id__in=matched)
        .select_related("payment", "payment__nacha_entry")
        .order_by("returned_at")
    )


def _match_return(line: StatementLine, *, exact_only: bool) -> None:
    returns = [
        r for r in _unmatched_returns(line.as_of_date) if ach_date(r.returned_at) <= line.as_of_date
    ]
    traces = set(TRACE.findall(" ".join((line.customer_reference, line.bank_reference, line.text))))
    named = [r for r in returns if r.payment.nacha_entry.trace_number in traces]
    pool = named or returns
    exact = [r for r in pool if r.payment.amount == line.amount]
    if exact_only and not exact:
        return
    chosen = exact[0] if exact else (named[0] if named else None)
    if chosen is None:
        _extra(line)
        return
    match = StatementMatch(
        kind=MatchKind.RETURN, payment=chosen.payment, expected_amount=chosen.payment.amount
    )
    if exact:
        _record_match(line, [match], MatchStatus.MATCHED)
        return
    _record_match(line, [match], MatchStatus.PARTIAL)
    _variance(
        key=f"short_amount:{line.pk}",
        day=line.as_of_date,
        kind=VarianceKind.SHORT_AMOUNT,
        currency=line.currency,
        merchant_ids=[chosen.payment.merchant_id],
        expected_amount=chosen.payment.amount,
        bank_amount=line.amount,
        line=line,
        payment_ids=[chosen.payment_id],
        summary=(
            f"the bank debited {line.amount} for the return of payment {chosen.payment_id}, "
            f"which is {chosen.payment.amount}"
        ),
    )


def _extra(line: StatementLine) -> None:
    _variance(
        key=_extra_line_key(line),
        day=line.as_of_date,
        kind=VarianceKind.EXTRA_LINE,
        currency=line.currency,
        bank_amount=line.amount,
        line=line,
        summary=(
            f"bank line {line.type_code} ({line.direction}) of {line.amount} on "
            f"{line.as_of_date} matches nothing of ours"
        ),
    )


def statement_lines_match() -> int:
    """Match every line not matched yet, each in its own short transaction under its row
    lock; the number matched (fully or partly). Two passes: every line that agrees exactly
    first, so a short line never takes the batch another line settles in full; then what is
    left, partly or as a variance. A line another pass holds is skipped."""
    matched = 0
    for exact_only in (True, False):
        # A line already found to match nothing waits for a person, not for every pass.
        pending = StatementLine.objects.filter(
            match_status=MatchStatus.UNEXPLAINED, matches__isnull=True, variances__isnull=True
        ).order_by("as_of_date", "created_at", "record_number")
        for line_id in list(pending.values_list("pk", flat=True)):
            matched += _line_match(line_id, exact_only=exact_only)
    return matched


def _line_match(line_id, *, exact_only: bool) -> bool:
    settlement_codes = set(conf.BOOKS_SETTLEMENT_TYPE_CODES)
    return_codes = set(conf.BOOKS_RETURN_TYPE_CODES)
    try:
        with transaction.atomic():
            line = (
                StatementLine.objects.select_for_update(skip_locked=True)
                .filter(pk=line_id, match_status=MatchStatus.UNEXPLAINED)
                .first()
            )
            if line is None:
                return False
            if line.direction == CREDIT and line.type_code in settlement_codes:
                _match_settlement(line, exact_only=exact_only)
            elif line.direction == DEBIT and line.type_code in return_codes:
                _match_return(line, exact_only=exact_only)
            elif not exact_only:
                _extra(line)
            return line.match_status != MatchStatus.UNEXPLAINED
    except IntegrityError:
        # Another pass matched that batch or return first: this line is tried next time.
        logger.info("books match lost a race", extra={"line": str(line_id)})
        return False


# --- a banking day ----------------------------------------------------------------------


def books_day_check(*, day: date) -> None:
    """Record what is missing at the bank for ``day``, once the bank has reported it."""
    statement_lines_match()
    if not day_reported(day):
        return
    files = list(NachaFile.objects.filter(delivered_at__isnull=False, effective_entry_date=day))
    matched = _matched_batch_keys(nacha_file__in=files)
    for batch in _batches(files):
        if batch.key in matched:
            continue
        _variance(
            key=_missing_batch_key(batch.file.pk, batch.number, batch.sec_code),
            day=day,
            kind=VarianceKind.MISSING_SETTLEMENT,
            currency="USD",
            merchant_ids=_merchants(batch.payment_ids),
            expected_amount=batch.amount,
            nacha_file=batch.file,
            batch_number=batch.number,
            sec_code=batch.sec_code,
            payment_ids=batch.payment_ids,
            summary=(
                f"{batch.label} ({batch.amount}, effective {day}) is not settled in the bank's "
                "statement of that day"
            ),
        )
    for ret in _unmatched_returns(day):
        if _return_day(ret) != day:
            continue
        _variance(
            key=_missing_return_key(ret.payment_id),
            day=day,
            kind=VarianceKind.MISSING_RETURN,
            currency=ret.payment.currency,
            merchant_ids=[ret.payment.merchant_id],
            expected_amount=ret.payment.amount,
            payment_ids=[ret.payment_id],
            summary=(
                f"the return {ret.reason_code} of payment {ret.payment_id} "
                f"({ret.payment.amount}) is not debited in the bank's statement of {day}"
            ),
        )


def _return_day(ret: PaymentReturn) -> date:
    day = ach_date(ret.returned_at)
    while not is_banking_day(day):
        day += timedelta(days=1)
    return day


def variance_explain(*, variance_id: int, user, note: str) -> BooksVariance:
    """A person explains an open variance: the note and who, in an audit row, in the same
    transaction as the status. The amounts stay as they were: nothing is plugged."""
    note = note.strip()
    if not note:
        raise ValueError("an explanation needs a note")
    with transaction.atomic():
        variance = BooksVariance.objects.select_for_update().get(pk=variance_id)
        if variance.status != VarianceStatus.OPEN:
            raise VarianceNotOpen(f"variance {variance_id} is {variance.status}, not open")
        variance.status = VarianceStatus.EXPLAINED
        variance.save(update_fields=["status"])
        VarianceExplanation.objects.create(variance=variance, explained_by=user, note=note)
    logger.info(
        "books variance explained",
        extra={"variance_id": variance.pk, "user_id": user.pk, "kind": variance.kind},
    )
    return variance


@dataclass
class CollectResult:
    imported: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    seen_before: list[str] = field(default_factory=list)
    matched: int = 0
    days: list[date] = field(default_factory=list)


def bank_statements_collect(*, transport, min_age_seconds: float = 60.0) -> CollectResult:
    """One import-and-match pass: every whole statement in the drop stored (refused ones too,
    kept for a human) and moved out of it, every line not matched yet matched, and each day a
    new statement reports checked for what is missing at the bank."""
    result = CollectResult()
    for name in transport.incoming(min_age_seconds=min_age_seconds):
        stored = bank_statement_store(name=name, content=transport.read(name))
        if not stored.created:
            result.seen_before.append(name)
        elif stored.statement.status == StatementStatus.REFUSED:
            result.refused.append(name)
        else:
            result.imported.append(name)
            result.days += list(
                stored.statement.days.values_list("as_of_date", flat=True).distinct()
            )
        transport.collected(name)
    result.matched = statement_lines_match()
    for day in sorted(set(result.days)):
        books_day_check(day=day)
    return result
