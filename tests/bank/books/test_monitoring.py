"""The books' gauges and alerts: the age of the oldest unmatched entry and bank line, a banking
day not closed by its hour (Eastern, the next banking day), a variance unexplained too long;
each alert cleared once its condition is gone."""

from datetime import timedelta

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from bank.books.models import BooksVariance, VarianceStatus
from bank.books.monitoring import (
    BooksCollector,
    books_alerts_check,
    books_snapshot,
    close_deadline,
)
from bank.books.services import bank_statements_collect, variance_explain
from payments.banking_days import add_banking_days, end_of_banking_day
from payments.signals import alert_cleared, alert_raised
from sandbox.statements import bank_statement_write
from tests.bank.books.conftest import bank_payment, send_and_answer
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def alerts():
    raised, cleared = [], []
    alert_raised.connect(lambda sender, **kw: raised.append(kw), weak=False, dispatch_uid="b-r")
    alert_cleared.connect(lambda sender, **kw: cleared.append(kw), weak=False, dispatch_uid="b-c")
    yield raised, cleared
    alert_raised.disconnect(dispatch_uid="b-r")
    alert_cleared.disconnect(dispatch_uid="b-c")


def _sent(books):
    bank_payment(holder="Paying One", amount="100.00", merchant="m-1", sec_code="PPD")
    bank_payment(holder="Paying Two", amount="25.00", merchant="m-2", sec_code="CCD")
    return send_and_answer(books).effective_entry_date


def _statement(books, day, *inject):
    bank_statement_write(
        outbound=books.outbound,
        inbound=books.inbound,
        statements=books.statements,
        day=day,
        inject=inject,
    )
    bank_statements_collect(transport=books.statement_transport, min_age_seconds=0)


def test_the_gauges_age_the_oldest_unmatched_entry_and_line(books):
    day = _sent(books)
    _statement(books, day, "missing", "extra")
    later = end_of_banking_day(day) + timedelta(hours=2)

    snapshot = books_snapshot(now=later)

    # The missing batch's entry, since the end of its settlement day.
    assert snapshot.oldest_unmatched_entry_age == pytest.approx(2 * 3600, abs=1)
    assert snapshot.oldest_unmatched_line_age > 0  # the extra line, since its import
    assert snapshot.open_variances == 2
    registry = CollectorRegistry()
    registry.register(BooksCollector())
    text = generate_latest(registry).decode()
    assert "payments_books_oldest_unmatched_entry_age_seconds" in text
    assert "payments_books_open_variances 2.0" in text


def test_a_green_day_ages_nothing(books):
    day = _sent(books)
    _statement(books, day)

    snapshot = books_snapshot(now=end_of_banking_day(day) + timedelta(days=3))

    assert snapshot.oldest_unmatched_entry_age == snapshot.oldest_unmatched_line_age == 0
    assert snapshot.days_not_closed == [] and snapshot.open_variances == 0


def test_a_day_with_variances_alerts_after_its_close_hour_and_clears_once_explained(books, alerts):
    raised, cleared = alerts
    day = _sent(books)
    _statement(books, day, "short")
    deadline = close_deadline(day)

    books_alerts_check(now=deadline - timedelta(minutes=1))
    assert [a for a in raised if a["key"].startswith("books.day_not_closed")] == []

    books_alerts_check(now=deadline + timedelta(minutes=1))
    [alert] = [a for a in raised if a["key"] == f"books.day_not_closed:{day}"]
    assert alert["severity"] == "high" and "unexplained variances" in alert["summary"]

    [variance] = BooksVariance.objects.filter(status=VarianceStatus.OPEN)
    variance_explain(variance_id=variance.pk, user=UserFactory(), note="bank fee, ticket 9")
    books_alerts_check(now=deadline + timedelta(minutes=2))
    assert f"books.day_not_closed:{day}" in [c["key"] for c in cleared]


def test_a_day_the_bank_never_reported_alerts_after_its_close_hour(books, alerts):
    raised, _ = alerts
    day = _sent(books)  # no statement comes

    books_alerts_check(now=close_deadline(day) + timedelta(minutes=1))

    [alert] = [a for a in raised if a["key"] == f"books.day_not_closed:{day}"]
    assert "has not been imported" in alert["summary"]
    assert alert["details"]["reported_by_bank"] is False


def test_the_close_hour_is_a_setting_on_the_next_banking_day(module_settings):
    from datetime import date

    module_settings.BOOKS_CLOSE_BY_HOUR_EASTERN = 9

    # A Friday closes on Monday; Thanksgiving's Wednesday on the Friday after.
    assert close_deadline(date(2026, 12, 4)).isoformat() == "2026-12-07T09:00:00-05:00"
    assert close_deadline(date(2026, 11, 25)).isoformat() == "2026-11-27T09:00:00-05:00"


def test_a_variance_unexplained_for_more_than_the_set_banking_days_alerts(
    books, alerts, module_settings
):
    raised, _ = alerts
    module_settings.BOOKS_VARIANCE_ALERT_BANKING_DAYS = 2
    day = _sent(books)
    _statement(books, day, "extra")
    [variance] = BooksVariance.objects.all()

    books_alerts_check(now=add_banking_days(end_of_banking_day(day), 2))
    assert [a for a in raised if a["key"].startswith("books.variance_aged")] == []

    books_alerts_check(now=add_banking_days(end_of_banking_day(day), 3))
    [alert] = [a for a in raised if a["key"] == f"books.variance_aged:{variance.pk}"]
    assert alert["severity"] == "high" and alert["details"]["variance_id"] == variance.pk
