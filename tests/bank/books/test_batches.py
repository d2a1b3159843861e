"""The books match per batch, as the bank settles: one file may hold several batches of one SEC
code (two merchants' PPD batches, a micro-entry round's ACCTVERIFY batch beside them), each
settled by a line of its own naming its number (``B0000002``), each matched to its batch; an
entry written before batch numbers were recorded is matched per file and SEC code as before."""

from datetime import datetime, timedelta
from pathlib import Path

import pytest

from bank.books.bai2_writer import Line, bai2_statement_write
from bank.books.models import BooksVariance, MatchStatus, StatementLine, StatementMatch
from bank.books.monitoring import books_snapshot
from bank.books.services import (
    bank_statement_store,
    bank_statements_collect,
    statement_lines_match,
)
from bank.nacha.models import NachaEntry
from bank.nacha.parser import parse_nacha
from bank.nacha.windows import EASTERN
from bank.vault.services import vault_account_store
from payments.banking_days import end_of_banking_day
from payments.services.originators import originator_profile_save
from payments.services.validation import account_validation_start
from sandbox.statements import bank_statement_write
from tests.bank.books.conftest import bank_payment, send_and_answer
from tests.bank.books.test_close import close
from tests.bank.vault.conftest import ACCOUNT

pytestmark = pytest.mark.django_db(transaction=True)


def _profiles():
    # Each merchant originates under its own company: its PPD entries are a batch of their own.
    for merchant, company_id in (("m-1", "1000000001"), ("m-2", "2000000002")):
        originator_profile_save(
            merchant_id=merchant,
            values={
                "company_name": f"SHOP {merchant.upper()}",
                "company_identification": company_id,
                "allowed_sec_codes": ["PPD"],
                "default_entry_description": "",
            },
        )


def _two_ppd_batches(books, *, first: str, second: str):
    _profiles()
    one = bank_payment(holder="Paying One", amount=first, merchant="m-1", sec_code="PPD")
    two = bank_payment(holder="Paying Two", amount=second, merchant="m-2", sec_code="PPD")
    sent = send_and_answer(books)
    numbers = {
        payment.pk: NachaEntry.objects.get(payment=payment).batch_number for payment in (one, two)
    }
    assert numbers == {one.pk: 1, two.pk: 2}  # m-1's company sorts first
    return sent, one, two


def _statement(books, day, *inject, now=None):
    written = bank_statement_write(
        outbound=books.outbound,
        inbound=books.inbound,
        statements=books.statements,
        day=day,
        inject=inject,
        now=now,
    )
    bank_statements_collect(transport=books.statement_transport, min_age_seconds=0)
    return written


def _matched_numbers() -> dict[str, int | None]:
    """Each settlement line's bank reference and the batch number it was matched to."""
    return {
        m.line.bank_reference: m.batch_number
        for m in StatementMatch.objects.filter(kind="batch").select_related("line")
    }


def test_the_cut_records_each_entrys_batch_as_the_file_writes_it(books):
    _profiles()
    bank_payment(holder="Paying One", amount="100.00", merchant="m-1", sec_code="PPD")
    bank_payment(holder="Paying Two", amount="100.00", merchant="m-2", sec_code="PPD")
    bank_payment(holder="Paying Three", amount="7.00", merchant="m-1", sec_code="PPD")
    sent = send_and_answer(books)

    [path] = [p for p in Path(books.outbound).rglob("*.ach") if p.name == sent.name]
    in_file = {e.trace_number: e.batch.number for e in parse_nacha(path.read_bytes()).entries()}
    recorded = dict(NachaEntry.objects.values_list("trace_number", "batch_number"))
    assert recorded == in_file
    assert sorted(set(recorded.values())) == [1, 2]


def test_a_file_of_two_merchants_ppd_batches_and_a_micro_entry_batch_closes_green(books):
    # The same amount in both merchants' batches: only the batch's number tells them apart.
    _profiles()
    token = vault_account_store(
        **(ACCOUNT | {"holder_name": "Paying Micro", "merchant_id": "m-3", "sec_code": "PPD"})
    ).token
    account_validation_start(account_token=token, merchant_id="m-3", method="micro_entries")
    bank_payment(holder="Paying One", amount="100.00", merchant="m-1", sec_code="PPD")
    bank_payment(holder="Paying Two", amount="100.00", merchant="m-2", sec_code="PPD")
    sent = send_and_answer(books)
    entries = NachaEntry.objects.filter(file=sent)
    assert set(entries.values_list("sec_code", flat=True)) == {"PPD"}
    assert entries.values("batch_number").distinct().count() == 3

    written = _statement(books, sent.effective_entry_date)

    assert written.lines == 3
    assert StatementLine.objects.filter(match_status=MatchStatus.MATCHED).count() == 3
    matched = _matched_numbers()
    assert matched == {f"B{n:07d}": n for n in (1, 2, 3)}  # each line its own batch
    for match in StatementMatch.objects.filter(kind="batch"):
        batch = entries.filter(batch_number=match.batch_number)
        assert match.expected_amount == sum(e.payment.amount for e in batch)
        assert match.sec_code == "PPD"
    code, rows = close(sent.effective_entry_date)
    assert code == 0, rows
    assert not BooksVariance.objects.exists()
    assert {row["merchant_id"]: row["settled"] for row in rows}["m-2"] == "100.00"


def test_a_short_line_of_one_of_two_ppd_batches_is_a_variance_naming_that_batch(books):
    # The short line (99.00 for batch 1's 100.00) equals batch 2's amount: its number, not
    # its amount, says which batch it settles.
    sent, one, two = _two_ppd_batches(books, first="100.00", second="99.00")

    _statement(books, sent.effective_entry_date, "short")

    [variance] = BooksVariance.objects.all()
    assert variance.kind == "short_amount"
    assert (variance.batch_number, variance.sec_code) == (1, "PPD")
    assert (variance.expected_amount, variance.bank_amount) == (100, 99)
    assert list(variance.payments.values_list("pk", flat=True)) == [one.pk]
    assert variance.merchant_ids == ["m-1"]
    assert f"batch 1 (PPD) of file {sent.name}" in variance.summary
    assert variance.line.bank_reference == "B0000001"
    assert _matched_numbers() == {"B0000001": 1, "B0000002": 2}
    statuses = dict(StatementLine.objects.values_list("bank_reference", "match_status"))
    assert statuses == {"B0000001": MatchStatus.PARTIAL, "B0000002": MatchStatus.MATCHED}
    code, rows = close(sent.effective_entry_date)
    by_merchant = {row["merchant_id"]: row for row in rows}
    assert code == 1
    assert (by_merchant["m-1"]["variances"], by_merchant["m-1"]["settled"]) == (1, "0.00")
    assert (by_merchant["m-2"]["variances"], by_merchant["m-2"]["settled"]) == (0, "99.00")


def test_a_missing_line_of_one_of_two_ppd_batches_is_that_batchs_variance_only(books):
    sent, one, two = _two_ppd_batches(books, first="100.00", second="100.00")
    day = sent.effective_entry_date

    written = _statement(books, day, "missing")

    assert written.lines == 1
    [variance] = BooksVariance.objects.all()
    assert variance.kind == "missing_settlement"
    assert (variance.batch_number, variance.nacha_file_id) == (1, sent.pk)
    assert variance.key == f"missing_settlement:{sent.pk}:B1"
    assert list(variance.payments.values_list("pk", flat=True)) == [one.pk]
    assert f"batch 1 (PPD) of file {sent.name}" in variance.summary
    assert _matched_numbers() == {"B0000002": 2}
    code, rows = close(day)
    by_merchant = {row["merchant_id"]: row for row in rows}
    assert code == 1
    assert by_merchant["m-1"]["variances"] == 1 and by_merchant["m-2"]["variances"] == 0
    assert by_merchant["m-2"]["settled"] == "100.00"
    assert BooksVariance.objects.count() == 1  # checked again: the same variance
    # The unsettled batch's entry ages; the settled batch beside it does not.
    later = end_of_banking_day(day) + timedelta(hours=2)
    assert books_snapshot(now=later).oldest_unmatched_entry_age == pytest.approx(2 * 3600, abs=1)


def test_the_banks_late_line_for_the_missing_batch_clears_its_variance(books):
    sent, one, two = _two_ppd_batches(books, first="100.00", second="100.00")
    day = sent.effective_entry_date
    _statement(books, day, "missing")
    close(day)

    # The bank's full statement of the day comes after: only batch 1's line is new.
    _statement(books, day, now=datetime.combine(day, datetime.min.time(), tzinfo=EASTERN))

    [variance] = BooksVariance.objects.all()
    assert variance.status == "cleared"
    assert variance.cleared_by_line.bank_reference == "B0000001"
    assert _matched_numbers() == {"B0000001": 1, "B0000002": 2}
    assert close(day)[0] == 0


def test_reading_the_statement_twice_matches_each_batch_once(books):
    sent, one, two = _two_ppd_batches(books, first="100.00", second="100.00")
    day = sent.effective_entry_date
    _statement(books, day)

    # The same statement sent again with other bytes (another creation time), then matched
    # again: its lines are the same rows, nothing is matched a second time.
    _statement(books, day, now=datetime.combine(day, datetime.min.time(), tzinfo=EASTERN))
    assert statement_lines_match() == 0

    assert StatementLine.objects.count() == 2
    assert StatementMatch.objects.filter(kind="batch").count() == 2
    assert _matched_numbers() == {"B0000001": 1, "B0000002": 2}
    assert close(day)[0] == 0 and not BooksVariance.objects.exists()


def test_entries_written_before_batch_numbers_match_per_file_and_sec_code(books):
    bank_payment(holder="Paying One", amount="100.00", merchant="m-1", sec_code="PPD")
    bank_payment(holder="Paying Two", amount="25.00", merchant="m-2", sec_code="CCD")
    sent = send_and_answer(books)
    # Rows of a file cut before the cut recorded batch numbers.
    NachaEntry.objects.filter(file=sent).update(batch_number=None)

    _statement(books, sent.effective_entry_date)

    matches = StatementMatch.objects.filter(kind="batch")
    assert sorted(matches.values_list("batch_number", "sec_code")) == [
        (None, "CCD"),
        (None, "PPD"),
    ]
    assert close(sent.effective_entry_date)[0] == 0
    assert not BooksVariance.objects.exists()


def test_an_unnumbered_batch_missing_keeps_its_per_sec_code_variance(books):
    bank_payment(holder="Paying One", amount="100.00", merchant="m-1", sec_code="PPD")
    bank_payment(holder="Paying Two", amount="25.00", merchant="m-2", sec_code="CCD")
    sent = send_and_answer(books)
    NachaEntry.objects.filter(file=sent).update(batch_number=None)

    _statement(books, sent.effective_entry_date, "missing")

    [variance] = BooksVariance.objects.all()
    assert variance.key == f"missing_settlement:{sent.pk}:PPD"
    assert variance.batch_number is None and variance.sec_code == "PPD"
    assert f"batch PPD of file {sent.name}" in variance.summary


def _bank_lines(day, lines: list[Line], *, name: str = "hand") -> None:
    content = bai2_statement_write(
        sender="011000015",
        receiver="SANDBOXUS",
        account_number="000123456789",
        as_of_date=day,
        created_at=datetime.combine(day, datetime.min.time()),
        file_id=f"{day:%y%m%d}",
        lines=lines,
    )
    bank_statement_store(name=f"{name}-{day}.bai", content=content)
    statement_lines_match()


def test_a_batch_reference_is_kept_whole_only_in_a_statement_naming_its_file(books):
    sent, one, two = _two_ppd_batches(books, first="100.00", second="25.00")
    day = sent.effective_entry_date

    _bank_lines(
        day,
        [
            Line("166", 10000, "B0000001", sent.name, "ACH SETTLEMENT PPD"),
            # Part of a longer run of digits: masked as any bank number is.
            Line("166", 2500, "B00000022222", sent.name, "ACH SETTLEMENT PPD"),
        ],
    )
    # A statement naming no file of ours: the same reference is masked.
    _bank_lines(day, [Line("166", 4200, "B0000001", "WIRE", "INCOMING")], name="other")

    references = set(StatementLine.objects.values_list("bank_reference", flat=True))
    assert references == {"B0000001", "B****2222", "B****0001"}
    assert _matched_numbers() == {"B0000001": 1, "B****2222": 2}


def test_a_line_naming_a_batch_its_file_does_not_hold_is_matched_by_amount(books):
    sent, one, two = _two_ppd_batches(books, first="100.00", second="25.00")

    _bank_lines(
        sent.effective_entry_date,
        [Line("166", 2500, "B0000009", sent.name, "ACH SETTLEMENT PPD")],
    )

    assert _matched_numbers() == {"B****0009": 2}
