"""The books in the admin: statements, lines and variances read-only, a refused statement shown
with its record and reason, a variance's page showing its evidence."""

import pytest
from django.urls import reverse

from bank.books.models import BankStatement, BooksVariance, StatementLine, VarianceKind
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


def _statement(**fields) -> BankStatement:
    defaults = {
        "name": "prior-day.bai",
        "sha256": "a" * 64,
        "status": "imported",
        "key_version": "k1",
        "wrapped_key": b"w",
        "nonce": b"n",
        "ciphertext": b"c",
    }
    return BankStatement.objects.create(**(defaults | fields))


@pytest.fixture
def admin_client(client):
    client.force_login(UserFactory(is_staff=True, is_superuser=True))
    return client


def test_every_books_page_answers_and_nothing_can_be_added(admin_client):
    statement = _statement(status="refused", refused_record=10, refused_reason="49 total")
    for model in ("bankstatement", "statementline", "booksvariance", "varianceexplanation"):
        assert admin_client.get(reverse(f"admin:bank_{model}_changelist")).status_code == 200
        assert admin_client.get(reverse(f"admin:bank_{model}_add")).status_code == 403
    page = admin_client.get(reverse("admin:bank_bankstatement_change", args=[statement.pk]))
    assert "49 total" in page.content.decode()
    assert "ciphertext" not in page.content.decode()


def test_a_variance_page_shows_the_bank_line_as_evidence_and_cannot_be_edited(admin_client):
    line = StatementLine.objects.create(
        statement=_statement(),
        record_number=7,
        account_last4="6789",
        currency="USD",
        as_of_date="2026-12-01",
        type_code="166",
        direction="credit",
        amount="123.45",
        customer_reference="<script>x</script>",
        text="INCOMING WIRE",
        fingerprint="f" * 64,
    )
    variance = BooksVariance.objects.create(
        key=f"extra_line:{line.pk}",
        day="2026-12-01",
        kind=VarianceKind.EXTRA_LINE,
        currency="USD",
        bank_amount="123.45",
        line=line,
        summary="bank line matches nothing of ours",
    )
    url = reverse("admin:bank_booksvariance_change", args=[variance.pk])

    page = admin_client.get(url).content.decode()
    admin_client.post(url, {"status": "explained", "summary": "plugged"})

    assert "INCOMING WIRE" in page and "record 7" in page
    assert "<script>x</script>" not in page  # the bank's text is escaped
    assert "Explain" in page
    variance.refresh_from_db()
    assert (variance.status, variance.summary) == ("open", "bank line matches nothing of ours")
