"""The dead-letter admin: list, filters, search, one page per payment story, read-only, 403s."""

import uuid
from datetime import timedelta
from decimal import Decimal
from urllib.parse import parse_qs, urlsplit

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from callbacks.models import (
    ParkedMessage,
    PaymentHold,
    QueueMessageStatus,
)
from callbacks.schema import processor_event_message
from payments.models import PaymentState
from tests.factories import (
    DeadLetterFactory,
    ParkedMessageFactory,
    PaymentEventFactory,
    PaymentFactory,
    PaymentHoldFactory,
    ProcessingErrorFactory,
    ProcessorAttemptFactory,
    QueueMessageFactory,
    TriageActionFactory,
    processor_event,
)
from tests.triage.deadletters import operator, viewer
from triage.models import DeadLetter, DeadLetterStatus, TriageAction

pytestmark = pytest.mark.django_db

ACTIONS = ["redrive", "resolve", "discard"]


def change_url(dead_letter) -> str:
    return reverse("admin:triage_deadletter_change", args=[dead_letter.pk])


def history(size: int):
    """A dead letter whose payment has ``size`` of everything: errors, processor attempts,
    events, messages, parked messages and triage actions."""
    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    group = str(payment.id)
    now = timezone.now()
    dead_letter = DeadLetterFactory(payment=payment)
    dead = QueueMessageFactory(
        message_id=dead_letter.original_message_id,
        group_id=group,
        sequence_number="1".zfill(40),
        body=dead_letter.body,
        enqueued_at=now,
        first_started_at=now,
        attempts=size,
        status=QueueMessageStatus.DEAD_LETTERED,
    )
    for i in range(size):
        ProcessingErrorFactory(
            queue_message=dead,
            attempt_number=i + 1,
            message=f"failure {i}",
            traceback=f'Traceback (most recent call last):\n  File "x.py", line {i}\n<Boom {i}>',
            delay_seconds=1.5,
        )
        ProcessorAttemptFactory(
            payment=payment,
            attempt_number=i + 1,
            error_kind="http",
            latency_ms=120.5 + i,
            started_at=now,
        )
        PaymentEventFactory(payment=payment, outcome="stale", event_type="submitted")
        QueueMessageFactory(
            message_id=f"{group}-m{i}",
            group_id=group,
            sequence_number=str(i + 2).zfill(40),
            first_started_at=now,
            status=QueueMessageStatus.PARKED,
        )
    hold = PaymentHoldFactory(payment_id=group, caused_by=dead)
    for i in range(size):
        ParkedMessageFactory(
            hold=hold,
            message_id=f"{group}-m{i}",
            sequence_number=str(i + 2).zfill(40),
            kind="processor_event",
            # The queue envelope as the endpoint writes it: the event nested under ``event``.
            body=processor_event_message(
                processor_event(payment, "settled", processor_event_id=f"p{i}")
            ),
        )
    user = operator()
    for i in range(size):
        other = DeadLetterFactory(payment=payment, status=DeadLetterStatus.RESOLVED)
        TriageActionFactory(dead_letter=other, user=user, note=f"note {i}")
    return dead_letter


def test_the_detail_page_tells_the_whole_story(client):
    dead_letter = history(3)
    client.force_login(viewer())
    response = client.get(change_url(dead_letter))
    assert response.status_code == 200
    page = response.content.decode()
    assert '<pre class="triage-json">' in page and "&quot;processor_event_id&quot;" in page
    assert "&lt;Boom 2&gt;" in page  # tracebacks escaped, in <pre>
    assert page.count("traceback</summary>") == 3
    assert "122.5 ms" in page  # processor attempt latency
    assert 'id="triage-timeline"' in page and 'id="triage-events"' in page
    assert "Nothing parked." not in page and "p2" in page  # parked messages, in order
    assert page.index("<code>p0</code>") < page.index("<code>p1</code>")
    assert "note 2" in page  # earlier triage actions
    assert "You can view dead letters but not act on them" in page
    assert 'id="triage-redrive"' not in page


def test_the_page_shows_the_event_of_each_message_parked_behind_the_hold(client):
    """The envelope nests the processor's event under ``event``: the page reads it there, and
    says what a parked ``submit_payment`` would do."""
    payment = PaymentFactory(state=PaymentState.SUBMITTED, amount=Decimal("12.34"))
    group = str(payment.id)
    dead_letter = DeadLetterFactory(payment=payment)
    hold = PaymentHold.objects.create(payment_id=group, reason="dead-lettered")
    bodies = [
        processor_event_message(
            processor_event(payment, "settled", processor_event_id="evt_parked_settled")
        ),
        processor_event_message(
            processor_event(
                payment, "returned", processor_event_id="evt_parked_return", reason_code="R01"
            )
        ),
        {"kind": "submit_payment", "payment_id": group},
    ]
    for i, body in enumerate(bodies):
        ParkedMessage.objects.create(
            hold=hold,
            payment_id=group,
            message_id=f"{group}-parked{i}",
            sequence_number=str(i + 2).zfill(40),
            kind=body["kind"],
            body=body,
        )
    client.force_login(operator())

    page = client.get(change_url(dead_letter)).content.decode()
    rows = page[page.index('id="triage-holds"') : page.index('id="triage-dead-letters"')]
    assert "Nothing parked." not in rows
    for text in (
        "<td>settled</td>",
        "<code>evt_parked_settled</code>",
        "<td>returned</td>",
        "<code>evt_parked_return</code>",
        "12.34",
        "submission of the payment to the processor",
    ):
        assert text in rows, text
    assert rows.index("evt_parked_settled") < rows.index("evt_parked_return")
    assert rows.count("<td>12.34</td>") == 2  # both events' amounts, none for the submission

    confirm = client.get(
        reverse("admin:triage_deadletter_act", args=[dead_letter.pk, "resolve"])
    ).content.decode()
    assert "settled 12.34 (<code>evt_parked_settled</code>)" in confirm
    assert "returned 12.34 (<code>evt_parked_return</code>)" in confirm
    assert "submission of the payment to the processor" in confirm


def test_an_operator_sees_the_action_links(client):
    dead_letter = history(1)
    client.force_login(operator())
    page = client.get(change_url(dead_letter)).content.decode()
    for action in ACTIONS:
        assert reverse("admin:triage_deadletter_act", args=[dead_letter.pk, action]) in page


def test_the_detail_page_takes_the_same_few_queries_with_50_attempts_as_with_1(client):
    small, large = history(1), history(50)
    client.force_login(viewer())
    counts = []
    for dead_letter in (small, large):
        client.get(change_url(dead_letter))  # warm the session and permission caches
        with CaptureQueriesContext(connection) as queries:
            response = client.get(change_url(dead_letter))
        assert response.status_code == 200
        counts.append(len(queries))
    assert counts[0] == counts[1]
    assert counts[1] <= 20, counts


def test_the_detail_page_with_50_attempts_stays_within_20_queries(
    client, django_assert_max_num_queries
):
    dead_letter = history(50)
    client.force_login(viewer())
    with django_assert_max_num_queries(20):
        response = client.get(change_url(dead_letter))
    assert response.content.decode().count("traceback</summary>") == 50


@pytest.mark.parametrize("make_user", [viewer, operator, "superuser"])
def test_nobody_can_add_edit_or_delete_a_dead_letter(client, make_user):
    dead_letter = DeadLetterFactory()
    if make_user == "superuser":
        user = User.objects.create_superuser("root", "root@example.com", "pw")
    else:
        user = make_user()
    client.force_login(user)
    assert client.get(reverse("admin:triage_deadletter_add")).status_code == 403
    assert (
        client.get(reverse("admin:triage_deadletter_delete", args=[dead_letter.pk])).status_code
        == 403
    )
    response = client.post(change_url(dead_letter), {"body": "{}", "status": "resolved"})
    assert response.status_code == 403
    dead_letter.refresh_from_db()
    assert dead_letter.status == DeadLetterStatus.OPEN
    page = client.get(change_url(dead_letter)).content.decode()
    assert 'name="body"' not in page and 'name="_save"' not in page
    changelist = client.get(reverse("admin:triage_deadletter_changelist")).content.decode()
    assert "delete_selected" not in changelist


def test_a_view_only_staff_user_gets_403_on_every_action(client):
    dead_letter = DeadLetterFactory()
    closed = DeadLetterFactory(status=DeadLetterStatus.RESOLVED)
    client.force_login(viewer())
    urls = [reverse("admin:triage_deadletter_act", args=[dead_letter.pk, a]) for a in ACTIONS]
    urls += [
        reverse("admin:triage_deadletter_bulk", args=[a]) + f"?ids={dead_letter.pk}"
        for a in ACTIONS
    ]
    urls.append(reverse("admin:triage_deadletter_release_hold", args=[closed.pk]))
    for url in urls:
        assert client.get(url).status_code == 403, url
        assert client.post(url, {"note": "n", "ids": str(dead_letter.pk)}).status_code == 403, url
    dead_letter.refresh_from_db()
    assert dead_letter.status == DeadLetterStatus.OPEN
    assert not TriageAction.objects.exists()
    # The bulk actions are not even offered.
    changelist = client.get(reverse("admin:triage_deadletter_changelist")).content.decode()
    assert "resolve_selected" not in changelist


@pytest.mark.parametrize("action", ["resolve", "discard"])
def test_the_confirmation_page_refuses_a_missing_note_with_a_clear_message(client, action):
    dead_letter = DeadLetterFactory()
    client.force_login(operator())
    url = reverse("admin:triage_deadletter_act", args=[dead_letter.pk, action])
    page = client.get(url).content.decode()
    assert 'name="note"' in page and "Note (required)" in page
    response = client.post(url, {"note": "   "})
    assert response.status_code == 200
    assert "A note is required" in response.content.decode()
    dead_letter.refresh_from_db()
    assert dead_letter.status == DeadLetterStatus.OPEN
    assert not TriageAction.objects.exists()


def test_confirming_with_a_note_acts_and_reports(client):
    payment = PaymentFactory()
    dead_letter = DeadLetterFactory(payment=payment)
    user = operator()
    client.force_login(user)
    url = reverse("admin:triage_deadletter_act", args=[dead_letter.pk, "discard"])
    response = client.post(url, {"note": "duplicate of a settled event"}, follow=True)
    assert response.redirect_chain[-1][0] == change_url(dead_letter)
    page = response.content.decode()
    assert f"Dead letter {dead_letter.pk} discarded." in page
    assert "The payment has no active hold." in page
    dead_letter.refresh_from_db()
    assert dead_letter.status == DeadLetterStatus.DISCARDED
    assert TriageAction.objects.get().user == user
    # A closed dead letter: its action page sends the operator back with the reason.
    response = client.get(url, follow=True)
    assert "only open dead letters can be discarded" in response.content.decode()


def test_the_bulk_action_acts_on_exactly_the_filtered_selection(client):
    submits = [DeadLetterFactory(kind="submit_payment") for _ in range(3)]
    events = [DeadLetterFactory() for _ in range(2)]
    client.force_login(operator())
    changelist = reverse("admin:triage_deadletter_changelist")
    response = client.post(
        f"{changelist}?kind__exact=submit_payment&status__exact=open",
        {
            "action": "resolve_selected",
            "select_across": "1",
            "index": "0",
            "_selected_action": [str(submits[0].pk)],
        },
    )
    assert response.status_code == 302
    target = urlsplit(response["Location"])
    query = parse_qs(target.query)
    assert sorted(int(i) for i in query["ids"][0].split(",")) == sorted(d.pk for d in submits)
    assert "kind__exact=submit_payment" in query["_changelist_filters"][0]

    page = client.get(response["Location"]).content.decode()
    for d in submits:
        assert change_url(d) in page
    for d in events:
        assert change_url(d) not in page

    response = client.post(
        target.path,
        {
            "ids": query["ids"][0],
            "_changelist_filters": query["_changelist_filters"][0],
            "note": "processor outage INC-9 fixed",
        },
    )
    assert response.status_code == 302
    assert "kind__exact=submit_payment" in response["Location"]
    statuses = dict(DeadLetter.objects.values_list("pk", "status"))
    assert all(statuses[d.pk] == "resolved" for d in submits)
    assert all(statuses[d.pk] == "open" for d in events)
    assert TriageAction.objects.count() == 3


def test_the_bulk_action_on_checked_rows_only(client):
    rows = [DeadLetterFactory() for _ in range(3)]
    client.force_login(operator())
    response = client.post(
        reverse("admin:triage_deadletter_changelist"),
        {"action": "discard_selected", "index": "0", "_selected_action": [str(rows[1].pk)]},
    )
    assert parse_qs(urlsplit(response["Location"]).query)["ids"] == [str(rows[1].pk)]


def test_bulk_confirmation_refuses_a_missing_note(client):
    rows = [DeadLetterFactory() for _ in range(2)]
    client.force_login(operator())
    url = reverse("admin:triage_deadletter_bulk", args=["discard"])
    response = client.post(url, {"ids": ",".join(str(r.pk) for r in rows), "note": ""})
    assert response.status_code == 200
    assert "A note is required" in response.content.decode()
    assert DeadLetter.objects.filter(status="open").count() == 2


def test_list_filters_and_search(client):
    payment = PaymentFactory()
    mine = DeadLetterFactory(payment=payment, processor_event_id="evt_find_me")
    old = DeadLetterFactory(last_error_class="")
    DeadLetter.objects.filter(pk=old.pk).update(ingested_at=timezone.now() - timedelta(days=3))
    client.force_login(viewer())
    changelist = reverse("admin:triage_deadletter_changelist")

    def listed(query: str) -> set[int]:
        response = client.get(f"{changelist}?{query}")
        assert response.status_code == 200
        return {d.pk for d in response.context["cl"].result_list}

    assert listed(f"q={payment.id}") == {mine.pk}
    assert listed("q=evt_find_me") == {mine.pk}
    assert listed(f"q={uuid.uuid4()}") == set()
    assert listed("age=1d-7d") == {old.pk}
    assert listed("age=lt1h") == {mine.pk}
    assert listed("error_class=__none__") == {old.pk}
    assert listed("error_class=payments.exceptions.InvalidTransition") == {mine.pk}
    assert listed("status__exact=open&kind__exact=processor_event") == {mine.pk, old.pk}
    page = client.get(changelist).content.decode()
    assert reverse("admin:triage_triagedashboard_changelist") in page


def test_the_admin_index_links_the_dashboard(client):
    client.force_login(viewer())
    page = client.get(reverse("admin:index")).content.decode()
    assert reverse("admin:triage_triagedashboard_changelist") in page


def test_release_hold_page_releases_a_hold_left_behind(client, sqs_queues):
    payment = PaymentFactory()
    dead_letter = DeadLetterFactory(payment=payment, status=DeadLetterStatus.RESOLVED)
    hold = PaymentHold.objects.create(payment_id=str(payment.id), reason="queue was down")
    ParkedMessage.objects.create(
        hold=hold, payment_id=str(payment.id), message_id="late-1", body={"kind": "x"}
    )
    client.force_login(operator())
    page = client.get(change_url(dead_letter)).content.decode()
    url = reverse("admin:triage_deadletter_release_hold", args=[dead_letter.pk])
    assert url in page
    response = client.post(url, {"note": ""})
    assert "A note is required" in response.content.decode()
    response = client.post(url, {"note": "queue back, releasing"}, follow=True)
    assert "1 parked message(s) republished" in response.content.decode()
    hold.refresh_from_db()
    assert hold.released_at is not None and hold.note == "queue back, releasing"
    assert TriageAction.objects.get().action == "release_hold"


def test_release_hold_is_refused_while_the_dead_letter_is_open(client):
    payment = PaymentFactory()
    dead_letter = DeadLetterFactory(payment=payment)
    PaymentHold.objects.create(payment_id=str(payment.id), reason="r")
    client.force_login(operator())
    url = reverse("admin:triage_deadletter_release_hold", args=[dead_letter.pk])
    response = client.post(url, {"note": "n"})
    assert "is still open" in response.content.decode()
    assert PaymentHold.objects.get().released_at is None


def test_bulk_selection_over_the_limit_is_refused_with_a_message(client, monkeypatch):
    from triage import admin as triage_admin

    monkeypatch.setattr(triage_admin, "BULK_LIMIT", 2)
    rows = [DeadLetterFactory() for _ in range(3)]
    client.force_login(operator())
    response = client.post(
        reverse("admin:triage_deadletter_changelist"),
        {
            "action": "resolve_selected",
            "select_across": "1",
            "index": "0",
            "_selected_action": [str(rows[0].pk)],
        },
        follow=True,
    )
    assert "3 dead letters selected: at most 2 per bulk action" in response.content.decode()
    assert "use “Redrive all matching…”" in response.content.decode()
    assert not TriageAction.objects.exists()


def test_an_unknown_action_is_404(client):
    dead_letter = DeadLetterFactory()
    client.force_login(operator())
    assert (
        client.get(
            reverse("admin:triage_deadletter_act", args=[dead_letter.pk, "delete"])
        ).status_code
        == 404
    )
    assert client.get(reverse("admin:triage_deadletter_bulk", args=["delete"])).status_code == 404
