"""``books_close --date``: one JSON line per merchant and currency, exit 0 green and 1 with
unexplained variances; a person explains each variance in the admin (a note, an audit row, no
amount changed) and the day is then green."""

import io
import json

import pytest
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.urls import reverse

from bank.books.models import (
    BankStatement,
    BooksVariance,
    StatementStatus,
    VarianceExplanation,
    VarianceStatus,
)
from bank.books.services import bank_statements_collect
from bank.vault.services import vault_account_store
from payments.models import HOUSE_ACCOUNT
from payments.services.validation import account_validation_start
from sandbox.statements import bank_statement_write
from tests.bank.books.conftest import bank_payment, send_and_answer
from tests.bank.vault.conftest import ACCOUNT
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db(transaction=True)


def close(day) -> tuple[int, list[dict]]:
    out = io.StringIO()
    try:
        call_command("books_close", "--date", day.isoformat(), stdout=out)
        code = 0
    except SystemExit as exit_:
        code = exit_.code
    return code, [json.loads(line) for line in out.getvalue().splitlines()]


def _day(books, *inject):
    bank_payment(holder="Paying One", amount="100.00", merchant="m-1", sec_code="PPD")
    bank_payment(holder="Paying Two", amount="25.00", merchant="m-2", sec_code="CCD")
    bank_payment(holder="NSF Three", amount="60.00", merchant="m-2", sec_code="CCD")
    sent = send_and_answer(books)
    day = sent.effective_entry_date
    bank_statement_write(
        outbound=books.outbound,
        inbound=books.inbound,
        statements=books.statements,
        day=day,
        inject=inject,
    )
    bank_statements_collect(transport=books.statement_transport, min_age_seconds=0)
    return day


def _explainer():
    user = UserFactory(is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(
            content_type__app_label="bank",
            codename__in=["explain_variance", "view_booksvariance"],
        )
    )
    return type(user).objects.get(pk=user.pk)


def test_a_green_day_prints_each_merchant_and_exits_0(books):
    day = _day(books)

    code, lines = close(day)

    assert code == 0
    by_merchant = {line["merchant_id"]: line for line in lines}
    assert set(by_merchant) == {"m-1", "m-2"}
    assert by_merchant["m-1"] == {
        "date": day.isoformat(),
        "merchant_id": "m-1",
        "currency": "USD",
        "expected": "100.00",
        "settled": "100.00",
        "returned": "0.00",
        "variances": 0,
        "reported_by_bank": True,
    }
    assert by_merchant["m-2"]["expected"] == "85.00" and by_merchant["m-2"]["returned"] == "60.00"


def test_a_day_with_variances_exits_1_counting_them_per_merchant_and_for_the_bank(books):
    day = _day(books, "missing", "extra")

    code, lines = close(day)

    assert code == 1
    by_merchant = {line["merchant_id"]: line for line in lines}
    # The first batch (PPD, m-1's) is missing; the extra wire is the bank account's own.
    assert by_merchant["m-1"]["variances"] == 1 and by_merchant["m-1"]["settled"] == "0.00"
    assert by_merchant["m-2"]["variances"] == 0
    assert by_merchant[None]["variances"] == 1
    assert close(day)[0] == 1  # checked again: the same variances, none added
    assert BooksVariance.objects.count() == 2


def test_a_day_the_bank_has_not_reported_is_checked_as_far_as_it_goes(books):
    bank_payment(holder="Paying One", amount="100.00")
    sent = send_and_answer(books)

    code, [line] = close(sent.effective_entry_date)

    # Nothing is missing yet: the bank has not spoken for the day.
    assert code == 0 and line["reported_by_bank"] is False
    assert (line["expected"], line["settled"], line["variances"]) == ("100.00", "0.00", 0)


def test_a_bad_date_is_refused_by_the_command():
    with pytest.raises(Exception, match="date"):
        call_command("books_close", "--date", "2026-13-01")


def test_a_person_explains_each_variance_with_a_note_and_the_day_is_then_green(books, client):
    day = _day(books, "short", "extra")
    assert close(day)[0] == 1
    person = _explainer()
    client.force_login(person)

    for variance in BooksVariance.objects.filter(status=VarianceStatus.OPEN):
        page = client.get(reverse("admin:bank_booksvariance_change", args=[variance.pk]))
        assert variance.summary in page.content.decode()  # the evidence is shown
        for payment in variance.payments.all():  # each payment, its trace number
            assert str(payment.pk) in page.content.decode()
            assert payment.nacha_entry.trace_number in page.content.decode()
        url = reverse("admin:bank_booksvariance_explain", args=[variance.pk])
        assert client.post(url, {"note": "   "}).status_code == 200  # a note is required
        response = client.post(url, {"note": f"bank ticket 42 for {variance.kind}"})
        assert response.status_code == 302

    code, lines = close(day)
    assert code == 0 and all(line["variances"] == 0 for line in lines)
    audit = VarianceExplanation.objects.select_related("variance")
    assert audit.count() == 2
    assert {a.explained_by_id for a in audit} == {person.pk}
    assert all(a.note.startswith("bank ticket 42") for a in audit)
    # Nothing was plugged: the amounts stand as the bank and the books said.
    short = BooksVariance.objects.get(kind="short_amount")
    assert short.expected_amount - short.bank_amount == 1
    assert short.status == VarianceStatus.EXPLAINED


def test_explaining_needs_the_right_and_audit_rows_are_read_only(books, client):
    day = _day(books, "extra")
    [variance] = BooksVariance.objects.all()
    viewer = UserFactory(is_staff=True)
    viewer.user_permissions.set(Permission.objects.filter(codename="view_booksvariance"))
    client.force_login(viewer)

    url = reverse("admin:bank_booksvariance_explain", args=[variance.pk])
    assert client.post(url, {"note": "x"}).status_code == 403
    assert close(day)[0] == 1
    client.force_login(UserFactory(is_staff=True, is_superuser=True))
    client.post(url, {"note": "fee the bank charged"})
    [row] = VarianceExplanation.objects.all()
    change = reverse("admin:bank_varianceexplanation_change", args=[row.pk])
    client.post(change, {"note": "rewritten"})
    row.refresh_from_db()
    assert row.note == "fee the bank charged"
    assert client.post(url, {"note": "again"}).status_code == 200  # not open any more
    assert VarianceExplanation.objects.count() == 1


def test_the_sandbox_bank_writes_a_days_statement_with_injections_by_command(books):
    bank_payment(holder="Paying One", amount="100.00", merchant="m-1", sec_code="PPD")
    sent = send_and_answer(books)
    out = io.StringIO()

    call_command(
        "sandbox_bank_statement",
        "--date",
        sent.effective_entry_date.isoformat(),
        "--inject",
        "short,extra",
        stdout=out,
    )
    call_command("bank_statements_collect", "--min-age-seconds", "0", stdout=io.StringIO())

    assert "2 lines; injected short" in out.getvalue()
    assert close(sent.effective_entry_date)[0] == 1
    assert sorted(BooksVariance.objects.values_list("kind", flat=True)) == [
        "extra_line",
        "short_amount",
    ]


def test_prenotes_and_a_prenotes_return_post_nothing_and_the_day_stays_green(books):
    # A merchant whose batch holds prenotes alone (one its bank returns R03), beside a debit.
    for holder in ("Paying Prenote", "NOACCOUNT Prenote"):
        token = vault_account_store(
            **(ACCOUNT | {"holder_name": holder, "merchant_id": "m-3", "sec_code": "WEB"})
        ).token
        account_validation_start(account_token=token, merchant_id="m-3", method="prenote")
    bank_payment(holder="Paying One", amount="100.00", merchant="m-1", sec_code="PPD")
    sent = send_and_answer(books)
    day = sent.effective_entry_date

    written = bank_statement_write(
        outbound=books.outbound, inbound=books.inbound, statements=books.statements, day=day
    )
    bank_statements_collect(transport=books.statement_transport, min_age_seconds=0)

    assert written.lines == 1  # the debit's batch; no zero-dollar settlement, no R03 debit
    assert list(BankStatement.objects.values_list("status", flat=True)) == [
        StatementStatus.IMPORTED
    ]
    assert close(day)[0] == 0
    assert not BooksVariance.objects.exists()


def test_micro_entries_and_a_returned_round_keep_the_day_green(books):
    # A merchant validating two accounts by micro-entries (the bank returns one round R03),
    # beside another merchant's debit: the rounds are one ACCTVERIFY batch, settled as the
    # batch settles, and the returned round's entries come back as returns of the day.
    for holder in ("Paying Micro", "NOACCOUNT Micro"):
        token = vault_account_store(
            **(ACCOUNT | {"holder_name": holder, "merchant_id": "m-3", "sec_code": "WEB"})
        ).token
        account_validation_start(account_token=token, merchant_id="m-3", method="micro_entries")
    bank_payment(holder="Paying One", amount="100.00", merchant="m-1", sec_code="CCD")
    sent = send_and_answer(books)
    day = sent.effective_entry_date

    written = bank_statement_write(
        outbound=books.outbound, inbound=books.inbound, statements=books.statements, day=day
    )
    bank_statements_collect(transport=books.statement_transport, min_age_seconds=0)

    assert sent.entry_count == 7
    assert written.lines == 2 + 3  # two batches settled, the returned round's three entries
    code, rows = close(day)
    assert code == 0, rows
    assert not BooksVariance.objects.exists()
    # The rounds are booked on the house's account (MICRO_ENTRY_COST): the merchant's figures
    # never show its validations' amounts.
    assert "m-3" not in {row["merchant_id"] for row in rows}
    (house,) = [row for row in rows if row["merchant_id"] == HOUSE_ACCOUNT]
    assert house["expected"] == house["settled"] != "0.00"
    assert house["returned"] != "0.00"
