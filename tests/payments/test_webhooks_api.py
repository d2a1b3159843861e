"""``/api/webhook_endpoints/`` and ``/api/events/``: a merchant's own only, https only, event
types from the catalogue, the secret shown once; hostile input answered 4xx naming the field."""

import threading
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from payments import retention
from payments.services import payment_apply_event
from payments.webhooks.delivery import events_dispatch
from payments.webhooks.models import Event, WebhookEndpoint
from payments.webhooks.services import webhook_endpoint_create
from tests.factories import PaymentFactory, grant, processor_event
from tests.payments.webhook_support import settle

pytestmark = pytest.mark.django_db

URL = "https://hooks.example.com/payments"


def create(api_client, **body):
    return api_client.post(
        "/api/webhook_endpoints/", {"merchant_id": "acme", "url": URL, **body}, format="json"
    )


def error_fields(response) -> dict:
    return response.json()["error"]["errors"]


def test_creating_an_endpoint_shows_its_secret_once(api_client, user):
    grant(user, "acme")
    created = create(api_client, event_types=["payment.confirmed", "refund.failed"])
    assert created.status_code == 201
    body = created.json()
    assert body["secret"].startswith("whsec_") and body["object"] == "webhook_endpoint"
    detail = api_client.get(f"/api/webhook_endpoints/{body['id']}/")
    listed = api_client.get("/api/webhook_endpoints/?merchant=acme")
    assert detail.status_code == 200 and "secret" not in detail.json()
    assert body["secret"] not in detail.content.decode() + listed.content.decode()
    assert [e["id"] for e in listed.json()["data"]] == [body["id"]]


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("http://hooks.example.com/x", "must use https"),
        ("file:///etc/passwd", "must use https"),
        ("gopher://hooks.example.com/", "must use https"),
        ("https://127.0.0.1/x", "private, loopback or link-local"),
        ("https://10.1.2.3/x", "private, loopback or link-local"),
        ("https://169.254.169.254/latest/meta-data/", "private, loopback or link-local"),
        ("https://[::1]/x", "private, loopback or link-local"),
        ("https://[::ffff:127.0.0.1]/x", "private, loopback or link-local"),
        ("https://[fd00::1]/x", "private, loopback or link-local"),
        ("https://0.0.0.0/x", "private, loopback or link-local"),
        ("https://hooks.example.com/\x00x", "NUL"),
        ("https://hooks.example.com/a b", "control characters"),
        ("https://user:pw@hooks.example.com/", "credentials"),
        ("https://hooks.example.com:99999/", "not a valid URL"),
        ("https:///nohost", "has no host"),
        ("https://hooks.example.com/" + "a" * 10_000, "at most 2048 characters"),
    ],
)
def test_a_hostile_url_is_refused_naming_url(api_client, user, url, problem):
    grant(user, "acme")
    response = create(api_client, url=url)
    assert response.status_code == 400, response.content
    assert problem in " ".join(error_fields(response)["url"])
    assert not WebhookEndpoint.objects.exists()


def test_a_url_with_a_lone_surrogate_is_refused(api_client, user):
    grant(user, "acme")
    response = api_client.post(
        "/api/webhook_endpoints/",
        data='{"merchant_id": "acme", "url": "https://hooks.example.com/\\ud800"}',
        content_type="application/json",
    )
    assert response.status_code == 400, response.content
    assert "url" in error_fields(response)
    assert not WebhookEndpoint.objects.exists()


def test_an_idn_host_is_taken_in_its_ascii_form(api_client, user):
    grant(user, "acme")
    response = create(api_client, url="https://bücher.example/hooks")
    assert response.status_code == 201


def test_an_unknown_event_type_an_unknown_field_and_a_number_for_a_url_are_named(api_client, user):
    grant(user, "acme")
    unknown_type = create(api_client, event_types=["payment.confirmed", "payment.exploded"])
    unknown_field = create(api_client, secret="whsec_mine")
    not_text = create(api_client, url=12345)
    nan = api_client.post(
        "/api/webhook_endpoints/",
        data='{"merchant_id": "acme", "url": NaN}',
        content_type="application/json",
    )
    assert unknown_type.status_code == 400
    assert "payment.exploded" in error_fields(unknown_type)["event_types"][0]
    assert unknown_field.status_code == 400 and "secret" in error_fields(unknown_field)
    assert not_text.status_code == 400 and "url" in error_fields(not_text)
    assert nan.status_code == 400
    assert not WebhookEndpoint.objects.exists()


def test_another_merchants_endpoint_answers_404_on_every_route(api_client, user):
    grant(user, "acme")
    theirs = webhook_endpoint_create(merchant_id="globex", url=URL, event_types=[])
    for method, path in [
        ("get", ""),
        ("patch", ""),
        ("delete", ""),
        ("post", "rotate_secret/"),
        ("post", "enable/"),
    ]:
        response = getattr(api_client, method)(
            f"/api/webhook_endpoints/{theirs.id}/{path}", {}, format="json"
        )
        assert response.status_code == 404, (method, path)
        assert theirs.secret not in response.content.decode()
    for bogus in ["not-a-uuid", "%00", "x" * 5000]:
        assert api_client.get(f"/api/webhook_endpoints/{bogus}/").status_code == 404
    assert create(api_client, merchant_id="globex").status_code == 403
    theirs.refresh_from_db()
    assert theirs.url == URL


def test_rotating_returns_a_new_secret_and_keeps_the_old_one_signing(api_client, user):
    grant(user, "acme")
    created = create(api_client).json()
    rotated = api_client.post(f"/api/webhook_endpoints/{created['id']}/rotate_secret/")
    assert rotated.status_code == 200
    assert rotated.json()["secret"].startswith("whsec_")
    assert rotated.json()["secret"] != created["secret"]
    endpoint = WebhookEndpoint.objects.get()
    assert endpoint.previous_secret == created["secret"]
    assert endpoint.previous_secret_expires_at > timezone.now() + timedelta(hours=23)


def test_patch_validates_like_create(api_client, user):
    grant(user, "acme")
    created = create(api_client).json()
    path = f"/api/webhook_endpoints/{created['id']}/"
    bad = api_client.patch(path, {"url": "https://192.168.1.1/"}, format="json")
    good = api_client.patch(path, {"event_types": ["payout.failed"]}, format="json")
    assert bad.status_code == 400 and "url" in error_fields(bad)
    assert good.status_code == 200 and good.json()["event_types"] == ["payout.failed"]


def test_events_list_oldest_first_after_a_cursor_filtered_by_type(api_client, user):
    grant(user, "m-hooks")
    first, second = settle(), settle()
    settle(merchant_id="globex")
    events_dispatch()

    page = api_client.get("/api/events/?merchant=m-hooks&limit=3").json()
    rest = api_client.get(f"/api/events/?merchant=m-hooks&after={page['next_cursor']}").json()
    confirmed = api_client.get("/api/events/?merchant=m-hooks&type=payment.confirmed").json()

    listed = page["data"] + rest["data"]
    assert page["has_more"] and not rest["has_more"]
    assert [e["data"]["object"]["id"] for e in listed] == [str(first.id)] * 2 + [str(second.id)] * 2
    assert [e["type"] for e in listed] == ["payment.submitted", "payment.confirmed"] * 2
    assert [e["data"]["object"]["id"] for e in confirmed["data"]] == [
        str(first.id),
        str(second.id),
    ]
    assert all(e["merchant_id"] == "m-hooks" for e in listed)


def test_events_list_refuses_another_merchants_cursor_and_unknown_parameters(api_client, user):
    grant(user, "m-hooks")
    settle(merchant_id="globex")
    events_dispatch()
    theirs = Event.objects.first().id
    for query in [
        f"merchant=m-hooks&after={theirs}",
        "merchant=m-hooks&after=evt_%00",
        "merchant=m-hooks&type=payment.exploded",
        "merchant=m-hooks&limit=NaN",
        "merchant=m-hooks&limit=100000000000000000000",
        "merchant=m-hooks&color=red",
        "merchant=m-hooks&merchant=globex",
    ]:
        response = api_client.get(f"/api/events/?{query}")
        assert response.status_code == 400, query
    assert api_client.get("/api/events/?merchant=globex").status_code == 403


@pytest.mark.django_db(transaction=True)
def test_an_event_committed_late_is_not_skipped_by_a_reader_paging_by_cursor(api_client, user):
    """A transaction writes its event and stays open while a later one commits and is listed:
    the late event gets a position after the cursor when it commits, so the reader sees it.
    (Submissions: a settlement would wait on the merchant's day counter the first one holds.)"""
    grant(user, "m-hooks")
    written, release = threading.Event(), threading.Event()

    def slow():
        with transaction.atomic():
            submit()
            written.set()
            release.wait(10)
        connection.close()

    thread = threading.Thread(target=slow)
    thread.start()
    assert written.wait(10)
    submit()
    events_dispatch()
    page = api_client.get("/api/events/?merchant=m-hooks").json()
    release.set()
    thread.join()
    events_dispatch()
    rest = api_client.get(f"/api/events/?merchant=m-hooks&after={page['next_cursor']}").json()

    assert len(page["data"]) == 1 and len(rest["data"]) == 1
    assert {e["id"] for e in page["data"] + rest["data"]} == set(
        Event.objects.values_list("id", flat=True)
    )
    # The late one was created first, and is listed second: in the order it became visible.
    assert rest["data"][0]["created_at"] < page["data"][0]["created_at"]


def submit():
    payment = PaymentFactory(state="pending", merchant_id="m-hooks", processor_id="")
    payment_apply_event(event=processor_event(payment, "submitted"))


def test_events_past_retention_are_purged_with_their_deliveries(module_settings):
    module_settings.EVENT_RETENTION_DAYS = 30
    webhook_endpoint_create(merchant_id="m-hooks", url=URL, event_types=[])
    settle()
    events_dispatch()
    Event.objects.filter(type="payment.submitted").update(
        created_at=timezone.now() - timedelta(days=31)
    )
    assert retention.events_purge() == 1
    assert list(Event.objects.values_list("type", flat=True)) == ["payment.confirmed"]


def test_an_events_object_is_the_payment_as_the_api_shows_it(api_client, user):
    grant(user, "m-hooks")
    payment = settle()
    events_dispatch()
    shown = api_client.get(f"/api/payments/{payment.id}/").json()
    [confirmed] = api_client.get("/api/events/?type=payment.confirmed").json()["data"]
    carried = confirmed["data"]["object"]
    assert set(carried) < set(shown)
    # updated_at is the transition's time; the row's own is set as it is written, a moment on.
    assert {k: v for k, v in carried.items() if k != "updated_at"} == {
        k: shown[k] for k in carried if k != "updated_at"
    }
    assert carried["updated_at"] <= shown["updated_at"]


def test_the_merchant_enables_a_disabled_endpoint_and_what_it_missed_is_due(api_client, user):
    from django.db import transaction

    from payments.webhooks.delivery import endpoint_disable
    from payments.webhooks.models import WebhookAction, WebhookDelivery

    grant(user, "m-hooks")
    endpoint = webhook_endpoint_create(merchant_id="m-hooks", url=URL, event_types=[])
    with transaction.atomic():
        endpoint_disable(endpoint=endpoint, reason="failing", now=timezone.now())
    settle()  # two events while it is disabled
    events_dispatch()
    assert not WebhookDelivery.objects.filter(endpoint=endpoint).exists()

    enabled = api_client.post(f"/api/webhook_endpoints/{endpoint.id}/enable/", {}, format="json")
    again = api_client.post(f"/api/webhook_endpoints/{endpoint.id}/enable/", {}, format="json")

    assert enabled.status_code == 200 and enabled.json()["enabled"] is True
    assert enabled.json()["replayed"] == 3  # its own disabling, and the two missed
    assert again.json()["replayed"] == 0  # enabled already: nothing written
    assert WebhookDelivery.objects.filter(endpoint=endpoint, status="pending").count() == 3
    action = WebhookAction.objects.get(kind="enable")
    assert (action.actor_label, action.deliveries) == (f"api:{user.get_username()}", 3)


def test_deleting_an_endpoint_leaves_an_audit_row_naming_it(api_client, user):
    from payments.webhooks.models import WebhookAction, WebhookDelivery

    grant(user, "acme")
    endpoint = webhook_endpoint_create(merchant_id="acme", url=URL, event_types=[])
    settle(merchant_id="acme")
    events_dispatch()

    deleted = api_client.delete(f"/api/webhook_endpoints/{endpoint.id}/")

    assert deleted.status_code == 204
    assert not WebhookEndpoint.objects.exists() and not WebhookDelivery.objects.exists()
    action = WebhookAction.objects.get(kind="delete")
    assert (action.endpoint_ref, action.merchant_id, action.endpoint_id) == (
        str(endpoint.id),
        "acme",
        None,
    )
    assert action.actor_label == f"api:{user.get_username()}" and URL in action.note
    assert endpoint.secret not in str(list(WebhookAction.objects.values()))
