"""``GET /api/merchants/<id>/books/?date=YYYY-MM-DD``: a merchant's banking day, scoped as the
balance is: another merchant's id is a 404 exactly like the balance's, a bad date a 400 naming
``date``."""

from datetime import date

import pytest

from bank.books.models import BooksVariance, VarianceKind
from tests.factories import grant

pytestmark = pytest.mark.django_db

DAY = "2026-12-01"


def _variance(merchant: str) -> BooksVariance:
    return BooksVariance.objects.create(
        key=f"missing_settlement:x:{merchant}",
        day=date(2026, 12, 1),
        kind=VarianceKind.MISSING_SETTLEMENT,
        currency="USD",
        merchant_ids=[merchant],
        expected_amount="10.00",
        summary="batch not settled",
    )


def test_a_granted_merchants_day_answers_its_figures_per_currency(api_client, user):
    grant(user, "acme")
    _variance("acme")
    _variance("globex")

    response = api_client.get(f"/api/merchants/acme/books/?date={DAY}")

    assert response.status_code == 200
    assert response.json() == {
        "merchant_id": "acme",
        "date": DAY,
        "reported_by_bank": False,
        "currencies": [
            {
                "currency": "USD",
                "expected": "0.00",
                "settled": "0.00",
                "returned": "0.00",
                "variances": 1,  # its own, not globex's
            }
        ],
    }


def test_another_merchants_books_answer_404_exactly_like_its_balance(api_client, user):
    grant(user, "acme")
    _variance("globex")

    books = api_client.get(f"/api/merchants/globex/books/?date={DAY}")
    balance = api_client.get("/api/merchants/globex/balance/")

    assert books.status_code == balance.status_code == 404
    books_error, balance_error = books.json()["error"], balance.json()["error"]
    books_error.pop("request_id"), balance_error.pop("request_id")
    assert books_error == balance_error
    assert "10.00" not in books.content.decode()


@pytest.mark.parametrize(
    "query",
    [
        "",
        "?date=2026-13-01",
        "?date=12/01/2026",
        "?date=20261201",
        f"?date={DAY}&date={DAY}",
        "?date=2026-12-01%00",
        "?date=%ED%A0%80",  # a lone surrogate, as UTF-8 bytes
        "?date=NaN",
        "?date=" + "9" * 10_000,
        "?date=77668056869313516",
        "?date=%D9%A2%D9%A0%D9%A2%D9%A6-12-01",  # Arabic-Indic digits
        "?date=0000-01-01",
    ],
)
def test_a_missing_or_bad_date_is_a_400_naming_date(api_client, user, query):
    grant(user, "acme")

    response = api_client.get(f"/api/merchants/acme/books/{query}")

    assert response.status_code == 400
    assert response.json()["error"]["param"] == "date"
    assert "77668056869313516" not in response.content.decode()


def test_an_unknown_query_parameter_is_refused_by_name(api_client, user):
    grant(user, "acme")

    response = api_client.get(f"/api/merchants/acme/books/?date={DAY}&merchant=globex")

    assert response.status_code == 400 and response.json()["error"]["param"] == "merchant"


def test_a_bad_date_of_another_merchant_is_still_a_404(api_client, user):
    grant(user, "acme")

    assert api_client.get("/api/merchants/globex/books/?date=nope").status_code == 404


def test_an_anonymous_caller_is_refused(client):
    assert client.get(f"/api/merchants/acme/books/?date={DAY}").status_code in (401, 403)
