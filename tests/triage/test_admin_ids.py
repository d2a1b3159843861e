"""Malformed ids in the triage admin's URLs and forms answer 400 or 404, never 500."""

import pytest
from django.urls import reverse

from tests.factories import DeadLetterFactory, PaymentFactory, TriageActionFactory
from tests.triage.deadletters import operator
from triage.models import DeadLetter, DeadLetterStatus, TriageAction

pytestmark = pytest.mark.django_db

# "²" passes str.isdigit() but not int(); "1e3" passes float(); the long ones overflow a bigint.
HOSTILE = ["²", "-1", "1e3", "9" * 30, "9223372036854775808", "\x00", "a1b2", "1.0", "+1"]


@pytest.fixture
def acting_client(client):
    client.force_login(operator())
    return client


@pytest.mark.parametrize("raw", HOSTILE)
def test_a_malformed_id_in_the_bulk_confirmation_is_400_naming_it(acting_client, raw):
    dead_letter = DeadLetterFactory()
    url = reverse("admin:triage_deadletter_bulk", args=["redrive"])
    for ids in (raw, f"{dead_letter.pk},{raw}"):
        response = acting_client.get(url, {"ids": ids})
        assert response.status_code == 400
        assert "is not a dead letter id" in response.content.decode()
    response = acting_client.post(url, {"ids": raw, "note": "x"})
    assert response.status_code == 400
    assert DeadLetter.objects.get().status == DeadLetterStatus.OPEN


def test_empty_ids_in_the_bulk_confirmation_are_400(acting_client):
    url = reverse("admin:triage_deadletter_bulk", args=["discard"])
    for query in ({"ids": ""}, {"ids": ",,"}, {}):
        response = acting_client.get(url, query)
        assert response.status_code == 400
        assert "No dead letter ids were given" in response.content.decode()


def test_ids_of_another_model_are_404_or_400(acting_client):
    payment = PaymentFactory()
    dead_letter = DeadLetterFactory(payment=payment)
    TriageActionFactory(dead_letter=dead_letter, user=operator(), status_after="open")
    action_id = TriageAction.objects.get().pk + 1000  # an id no dead letter has
    url = reverse("admin:triage_deadletter_bulk", args=["resolve"])
    assert acting_client.get(url, {"ids": str(action_id)}).status_code == 404
    assert acting_client.get(url, {"ids": str(payment.id)}).status_code == 400
    act = reverse("admin:triage_deadletter_act", args=[str(payment.id), "resolve"])
    assert acting_client.get(act).status_code == 404


@pytest.mark.parametrize("raw", HOSTILE)
@pytest.mark.parametrize("page", ["act/redrive/", "release-hold/", "change/"])
def test_a_malformed_id_in_a_dead_letter_url_is_404(acting_client, raw, page):
    DeadLetterFactory()
    base = reverse("admin:triage_deadletter_changelist")
    response = acting_client.get(f"{base}{raw}/{page}")
    assert response.status_code == 404
    assert acting_client.post(f"{base}{raw}/{page}", {"note": "x"}).status_code == 404
    assert DeadLetter.objects.get().status == DeadLetterStatus.OPEN


@pytest.mark.parametrize("raw", ["²", "1e3", "", "\x00", "a1b2", "9" * 30, "-1"])
def test_a_malformed_checkbox_value_in_a_changelist_action_is_400(acting_client, raw):
    dead_letter = DeadLetterFactory()
    response = acting_client.post(
        reverse("admin:triage_deadletter_changelist"),
        {
            "action": "resolve_selected",
            "index": "0",
            "_selected_action": [str(dead_letter.pk), raw],
        },
    )
    assert response.status_code == 400
    assert "is not a dead letter id" in response.content.decode()
    assert DeadLetter.objects.get().status == DeadLetterStatus.OPEN


@pytest.mark.parametrize("raw", ["0", "9223372036854775807"])
def test_a_well_formed_id_that_matches_nothing_selects_nothing(acting_client, raw):
    DeadLetterFactory()
    response = acting_client.post(
        reverse("admin:triage_deadletter_changelist"),
        {"action": "resolve_selected", "index": "0", "_selected_action": [raw]},
        follow=True,
    )
    assert response.status_code == 200
    assert "None of the selected dead letters exists" in response.content.decode()
    assert DeadLetter.objects.get().status == DeadLetterStatus.OPEN
