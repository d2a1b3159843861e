"""The bank's statement matched against the books on the real stack: the sandbox bank settles
the files it received and debits the returns it wrote, in BAI2, with variances injected on
demand; each injected variance is found, and nothing else."""

from decimal import Decimal
from pathlib import Path

import pytest

from bank.books.models import (
    BooksVariance,
    MatchStatus,
    StatementLine,
    VarianceKind,
    VarianceStatus,
)
from bank.books.selectors import books_day_figures
from bank.books.services import bank_statements_collect
from sandbox.statements import bank_statement_write
from tests.bank.books.conftest import bank_payment, send_and_answer

pytestmark = pytest.mark.django_db(transaction=True)


def _day_with_three_batches(books):
    bank_payment(holder="Paying One", amount="100.00", merchant="m-1", sec_code="PPD")
    bank_payment(holder="Paying Two", amount="250.50", merchant="m-2", sec_code="PPD")
    bank_payment(holder="Paying Three", amount="40.00", merchant="m-1", sec_code="CCD")
    bank_payment(holder="Paying Four", amount="7.25", merchant="m-2", sec_code="WEB")
    bank_payment(holder="NSF Five", amount="60.00", merchant="m-2", sec_code="WEB")
    return send_and_answer(books)


def _statement(books, day, *inject):
    written = bank_statement_write(
        outbound=books.outbound,
        inbound=books.inbound,
        statements=books.statements,
        day=day,
        inject=inject,
    )
    result = bank_statements_collect(transport=books.statement_transport, min_age_seconds=0)
    return written, result


def test_a_clean_statement_matches_every_batch_and_the_return_and_closes_green(books):
    sent = _day_with_three_batches(books)

    written, result = _statement(books, sent.effective_entry_date)

    assert result.imported == [written.name] and written.lines == 4  # 3 batches, 1 return
    assert set(StatementLine.objects.values_list("match_status", flat=True)) == {"matched"}
    assert BooksVariance.objects.count() == 0
    figures = {
        (f.merchant_id, f.currency): f for f in books_day_figures(day=sent.effective_entry_date)
    }
    assert figures["m-1", "USD"].expected == figures["m-1", "USD"].settled == Decimal("140.00")
    assert figures["m-2", "USD"].expected == figures["m-2", "USD"].settled == Decimal("317.75")
    assert figures["m-2", "USD"].returned == Decimal("60.00")
    assert all(f.variances == 0 for f in figures.values())


def test_each_injected_variance_is_found_and_nothing_else(books):
    sent = _day_with_three_batches(books)

    written, _ = _statement(books, sent.effective_entry_date, "missing", "short", "extra")

    open_ = BooksVariance.objects.filter(status=VarianceStatus.OPEN)
    assert sorted(open_.values_list("kind", flat=True)) == sorted(
        [VarianceKind.MISSING_SETTLEMENT, VarianceKind.SHORT_AMOUNT, VarianceKind.EXTRA_LINE]
    )
    short = open_.get(kind=VarianceKind.SHORT_AMOUNT)
    assert short.expected_amount - short.bank_amount == Decimal("1.00")
    assert short.line.match_status == MatchStatus.PARTIAL
    assert short.payments.count() >= 1 and short.nacha_file == sent
    missing = open_.get(kind=VarianceKind.MISSING_SETTLEMENT)
    assert missing.line is None and missing.payments.count() >= 1
    extra = open_.get(kind=VarianceKind.EXTRA_LINE)
    assert extra.merchant_ids == [] and extra.bank_amount == Decimal("123.45")
    figures = books_day_figures(day=sent.effective_entry_date)
    assert sum(f.variances for f in figures if f.merchant_id is None) == 1  # the extra line
    assert set(written.injected) == {"missing", "short", "extra"}


def test_a_statement_read_twice_or_resent_with_other_bytes_counts_each_line_once(books):
    sent = _day_with_three_batches(books)
    _statement(books, sent.effective_entry_date)
    lines = StatementLine.objects.count()

    # The bank resends the day (another creation time: other bytes, the same lines).
    _statement(books, sent.effective_entry_date)

    assert StatementLine.objects.count() == lines
    assert BooksVariance.objects.count() == 0


def test_a_settlement_the_bank_posts_a_day_late_clears_the_missing_variance(books):
    sent = _day_with_three_batches(books)
    day = sent.effective_entry_date
    _statement(books, day, "missing")
    [missing] = BooksVariance.objects.filter(kind=VarianceKind.MISSING_SETTLEMENT)

    _statement(books, day)  # the bank's corrected statement carries the line

    missing.refresh_from_db()
    assert missing.status == VarianceStatus.CLEARED and missing.cleared_by_line is not None


def test_a_short_line_never_takes_the_batch_another_line_settles_in_full(books):
    from datetime import datetime

    from bank.books.bai2_writer import Line, bai2_statement_write
    from bank.books.models import StatementMatch

    bank_payment(holder="Paying One", amount="100.00", merchant="m-1", sec_code="PPD")
    bank_payment(holder="Paying Two", amount="85.00", merchant="m-2", sec_code="CCD")
    sent = send_and_answer(books)
    # The short line comes first and names no SEC code; 90.00 is nearer the CCD batch's 85.00.
    content = bai2_statement_write(
        sender="011000015",
        receiver="US",
        account_number="000123456789",
        as_of_date=sent.effective_entry_date,
        created_at=datetime(2026, 12, 2, 6, 0),
        file_id="1",
        lines=[
            Line("166", 9000, "B1", sent.name, "ACH SETTLEMENT"),
            Line("166", 8500, "B2", sent.name, "ACH SETTLEMENT"),
        ],
    )
    (Path(books.statements)).mkdir(exist_ok=True)
    (Path(books.statements) / "hand.bai").write_bytes(content)
    bank_statements_collect(transport=books.statement_transport, min_age_seconds=0)

    matches = {m.sec_code: m.line.amount for m in StatementMatch.objects.select_related("line")}
    assert matches == {"CCD": Decimal("85.00"), "PPD": Decimal("90.00")}
    [short] = BooksVariance.objects.filter(kind=VarianceKind.SHORT_AMOUNT)
    assert (short.sec_code, short.expected_amount, short.bank_amount) == (
        "PPD",
        Decimal("100.00"),
        Decimal("90.00"),
    )


def test_a_line_that_matched_nothing_waits_for_a_person_not_for_every_pass(
    books, django_assert_max_num_queries
):
    from bank.books.services import statement_lines_match

    sent = _day_with_three_batches(books)
    _statement(books, sent.effective_entry_date, "extra")

    with django_assert_max_num_queries(2):
        assert statement_lines_match() == 0
    assert BooksVariance.objects.filter(kind=VarianceKind.EXTRA_LINE).count() == 1


def test_an_interim_report_matches_what_has_posted_but_finds_nothing_missing(books):
    from datetime import datetime

    from bank.books.bai2_writer import bai2_statement_write
    from bank.books.selectors import day_reported

    sent = _day_with_three_batches(books)
    day = sent.effective_entry_date
    # The bank's same-day interim report: nothing of ours has posted yet.
    content = bai2_statement_write(
        sender="011000015",
        receiver="US",
        account_number="000123456789",
        as_of_date=day,
        created_at=datetime(2026, 12, 1, 11, 0),
        file_id="1",
        lines=[],
        as_of_modifier="3",
    )
    Path(books.statements).mkdir(exist_ok=True)
    (Path(books.statements) / "interim.bai").write_bytes(content)
    bank_statements_collect(transport=books.statement_transport, min_age_seconds=0)

    assert not day_reported(day)
    assert BooksVariance.objects.count() == 0

    _statement(books, day, "missing")  # the final report

    assert day_reported(day)
    assert BooksVariance.objects.get().kind == VarianceKind.MISSING_SETTLEMENT


def _returned_day(books):
    bank_payment(holder="Paying One", amount="100.00", merchant="m-1", sec_code="PPD")
    bank_payment(holder="NSF Two", amount="60.00", merchant="m-2", sec_code="PPD")
    return send_and_answer(books)


def test_a_return_booked_but_not_debited_at_the_bank_is_a_missing_return(books):
    sent = _returned_day(books)
    # The bank's statement without the return's debit: its answer file is not in it.
    for answer in Path(books.inbound).rglob("answers-*"):
        answer.unlink()

    _statement(books, sent.effective_entry_date)

    [missing] = BooksVariance.objects.all()
    assert missing.kind == VarianceKind.MISSING_RETURN
    assert missing.merchant_ids == ["m-2"] and missing.expected_amount == Decimal("60.00")
    assert [p.merchant_id for p in missing.payments.all()] == ["m-2"]


def test_a_return_debited_for_another_amount_is_partly_matched_by_its_trace_number(books):
    from datetime import datetime

    from bank.books.bai2_writer import Line, bai2_statement_write
    from payments.models import PaymentReturn

    sent = _returned_day(books)
    trace = PaymentReturn.objects.get().payment.nacha_entry.trace_number
    content = bai2_statement_write(
        sender="011000015",
        receiver="US",
        account_number="000123456789",
        as_of_date=sent.effective_entry_date,
        created_at=datetime(2026, 12, 2, 6, 0),
        file_id="1",
        lines=[
            Line("166", 16000, "B1", sent.name, "ACH SETTLEMENT PPD"),
            Line("555", 5000, "", "", f"ACH RETURN R01 ORIGINAL TRACE {trace}"),
        ],
    )
    Path(books.statements).mkdir(exist_ok=True)
    (Path(books.statements) / "hand.bai").write_bytes(content)
    bank_statements_collect(transport=books.statement_transport, min_age_seconds=0)

    [short] = BooksVariance.objects.all()
    assert short.kind == VarianceKind.SHORT_AMOUNT and short.merchant_ids == ["m-2"]
    assert (short.expected_amount, short.bank_amount) == (Decimal("60.00"), Decimal("50.00"))
    assert short.line.match_status == MatchStatus.PARTIAL
