"""The bank demo's books check (demo/books_check.py) on the real stack: the sandbox bank's
statements of the run's days, the first with every injection; the check passes when exactly
those variances are found."""

from pathlib import Path

import pytest

from bank.books.models import BooksVariance
from demo.books_check import books_check
from tests.bank.books.conftest import bank_payment, send_and_answer

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_demo_finds_exactly_the_injected_variances(books):
    bank_payment(holder="Paying One", amount="100.00", merchant="m-1", sec_code="PPD")
    bank_payment(holder="Paying Two", amount="25.00", merchant="m-2", sec_code="CCD")
    bank_payment(holder="NSF Three", amount="60.00", merchant="m-2", sec_code="WEB")
    send_and_answer(books)

    checks = books_check(
        outbound=books.outbound, inbound=books.inbound, statements=books.statements
    )

    assert checks and all(passed for _, passed in checks), checks
    assert sorted(BooksVariance.objects.values_list("kind", flat=True)) == [
        "extra_line",
        "missing_settlement",
        "short_amount",
    ]


def test_the_demo_check_fails_when_a_variance_is_found_that_was_not_injected(books):
    bank_payment(holder="Paying One", amount="100.00", merchant="m-1", sec_code="PPD")
    bank_payment(holder="Paying Two", amount="25.00", merchant="m-2", sec_code="CCD")
    sent = send_and_answer(books)
    # A file the bank lost: its batches are missing though nothing injected that.
    (Path(books.outbound) / "answered" / sent.name).unlink()

    checks = books_check(
        outbound=books.outbound, inbound=books.inbound, statements=books.statements
    )

    assert not all(passed for _, passed in checks)
