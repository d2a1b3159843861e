"""Triage dashboard: the numbers (selectors), the page, its server-drawn charts, SQS down."""

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from callbacks import sqs
from callbacks.models import QueueMessage
from payments.models import Payment, PaymentState
from tests.factories import (
    DeadLetterFactory,
    ParkedMessageFactory,
    PaymentFactory,
    PaymentHoldFactory,
    ProcessingErrorFactory,
    QueueMessageFactory,
)
from tests.triage.deadletters import user_with, viewer
from triage import selectors
from triage.models import DeadLetter, DeadLetterStatus
from triage.operations import charts

pytestmark = pytest.mark.django_db
DASHBOARD = "admin:triage_triagedashboard_changelist"


def message(n: int, *, status="done", attempts=1, enqueued_ago=None, latency=None, now=None):
    now = now or timezone.now()
    enqueued = now - (enqueued_ago or timedelta(minutes=5))
    return QueueMessageFactory(
        message_id=f"m{n}",
        group_id="g",
        enqueued_at=enqueued,
        first_started_at=now - timedelta(minutes=1),
        last_started_at=now,
        attempts=attempts,
        status=status,
        finished_at=(enqueued + latency) if latency is not None else None,
    )


def test_latency_buckets_count_done_messages_by_enqueue_to_applied_time():
    now = timezone.now()
    latencies = [
        timedelta(milliseconds=300),
        timedelta(milliseconds=999),
        timedelta(seconds=1),
        timedelta(seconds=59),
        timedelta(minutes=30),
        timedelta(hours=5),
        timedelta(days=2),
    ]
    for i, latency in enumerate(latencies):
        message(i, latency=latency, enqueued_ago=latency, now=now)
    message(99, status="in_progress", now=now)  # not finished: not counted
    buckets = selectors.enqueue_to_applied_buckets(now=now)
    assert buckets == [
        ("< 1 s", 2),
        ("1 s – 1 min", 2),
        ("1 min – 1 h", 1),
        ("1 h – 1 day", 1),
        ("> 1 day", 1),
    ]


def test_reprocessing_rate_counts_messages_that_needed_more_than_one_attempt():
    for i, attempts in enumerate([1, 1, 1, 2, 6]):
        message(i, attempts=attempts)
    old = message(50, attempts=3)
    QueueMessage.objects.filter(pk=old.pk).update(
        first_started_at=timezone.now() - timedelta(days=2)
    )
    rate = selectors.reprocessing_rate()
    assert (rate.reprocessed, rate.total) == (2, 5)
    assert rate.ratio == pytest.approx(0.4)
    assert selectors.reprocessing_rate(now=timezone.now() + timedelta(days=5)).ratio is None


def test_oldest_unfinished_age_comes_from_the_workers_records():
    now = timezone.now()
    message(1, status="done", enqueued_ago=timedelta(hours=9), latency=timedelta(seconds=1))
    message(2, status="retrying", enqueued_ago=timedelta(minutes=40), now=now)
    message(3, status="in_progress", enqueued_ago=timedelta(minutes=2), now=now)
    age = selectors.oldest_unfinished_age(now=now)
    assert timedelta(minutes=39) < age <= timedelta(minutes=40)
    QueueMessage.objects.all().update(status="done")
    assert selectors.oldest_unfinished_age() is None


def test_open_dead_letters_and_the_oldest_age():
    old = DeadLetterFactory()
    DeadLetter.objects.filter(pk=old.pk).update(ingested_at=timezone.now() - timedelta(hours=7))
    DeadLetterFactory()
    DeadLetterFactory(status=DeadLetterStatus.RESOLVED)
    summary = selectors.dead_letters_open_summary()
    assert summary.count == 2
    assert timedelta(hours=7) <= summary.oldest_age < timedelta(hours=7, minutes=1)


def test_stuck_payments_are_the_oldest_pending_or_submitted():
    now = timezone.now()
    ages = {"pending": 3, "submitted": 10, "confirmed": 50}
    made = {}
    for state, hours in ages.items():
        p = PaymentFactory(state=state)
        Payment.objects.filter(pk=p.pk).update(state_changed_at=now - timedelta(hours=hours))
        made[state] = p.pk
    stuck = [p.pk for p in selectors.payments_stuck()]
    assert stuck == [made["submitted"], made["pending"]]


def test_error_classes_are_ranked_by_frequency():
    record = message(1, status="retrying")
    for i, cls in enumerate(["A", "B", "B", "C", "B", "A"]):
        ProcessingErrorFactory(queue_message=record, attempt_number=i + 1, error_class=cls)
    assert selectors.error_classes_ranked() == [("B", 3), ("A", 2), ("C", 1)]


def test_payments_on_hold_count_their_unreleased_parked_messages():
    hold = PaymentHoldFactory(payment_id="p1")
    PaymentHoldFactory(payment_id="p2", released_at=timezone.now())
    for i in range(3):
        ParkedMessageFactory(
            hold=hold, message_id=f"x{i}", republished_message_id="sent" if i == 0 else ""
        )
    holds = list(selectors.payments_on_hold())
    assert [(h.payment_id, h.parked_count) for h in holds] == [("p1", 2)]


def test_the_dashboard_shows_depths_numbers_and_svg_charts(client, sqs_queues):
    sqs.send_message_now(body={"kind": "x"}, group_id="g1", deduplication_id="1")
    sqs.send_message_now(body={"kind": "x"}, group_id="g2", deduplication_id="2")
    message(1, latency=timedelta(milliseconds=200))
    DeadLetterFactory()
    PaymentFactory(state=PaymentState.SUBMITTED)
    client.force_login(viewer())
    response = client.get(reverse(DASHBOARD))
    assert response.status_code == 200
    page = response.content.decode()
    depths = response.context["depths"]
    assert [(d.visible, d.available) for d in depths] == [(2, True), (0, True)]
    # Charts drawn on the server; the only scripts are the admin's own static files (no CDN).
    assert page.count('class="triage-chart"') >= 2
    assert 'src="http' not in page and "//cdn" not in page
    assert "open dead letters" in page and "oldest message not yet finished" in page
    assert "Payments stuck longest" in page


def test_the_dashboard_says_unavailable_with_the_reason_when_sqs_is_down(client, module_settings):
    module_settings.SQS_ENDPOINT_URL = "http://127.0.0.1:9"
    sqs.reset()
    try:
        client.force_login(viewer())
        response = client.get(reverse(DASHBOARD))
    finally:
        sqs.reset()
    assert response.status_code == 200
    page = response.content.decode()
    assert page.count(">unavailable<") == 2
    assert "cannot resolve queue" in page


def test_the_dashboard_needs_the_dead_letter_view_permission(client):
    client.force_login(user_with())
    assert client.get(reverse(DASHBOARD)).status_code == 403


def test_bar_chart_escapes_labels_and_says_when_empty():
    svg = charts.bar_chart([("<b>x</b>", 3), ("y", 0)], title="t & u")
    assert "<b>" not in svg and "&lt;b&gt;x&lt;/b&gt;" in svg
    assert "t &amp; u" in svg and svg.count("<rect") == 2
    assert "no data" in charts.bar_chart([], title="empty")
    assert "40.0%" in charts.ratio_bar(2, 5, title="r")
