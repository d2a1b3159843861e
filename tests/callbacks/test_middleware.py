"""``ProcessorCallbackMiddleware``: the callback endpoint is served past the middleware below
it, with the same answers; every other request goes down the whole chain."""

import json

import pytest
from django.conf import settings
from django.test import Client, override_settings
from django.urls import include, path

from payments import signing
from tests.callbacks.test_endpoint import SECRET, event_body, queued_messages

FAST_PATH = "callbacks.middleware.ProcessorCallbackMiddleware"
SPY = "tests.callbacks.test_middleware.Spy"


class Spy:
    """A middleware below the fast path: the paths of the requests that reached it."""

    seen: list[str] = []

    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request):
        Spy.seen.append(request.path)
        return self.get_response(request)


# A project that mounts the module's URLs under a prefix of its own.
urlpatterns = [
    path("ach/callbacks/", include("callbacks.urls")),
    path("", include("triage.urls")),
]


@pytest.fixture
def spied():
    """The project's middleware with the spy right below the fast path."""
    Spy.seen = []
    middleware = list(settings.MIDDLEWARE)
    middleware.insert(middleware.index(FAST_PATH) + 1, SPY)
    with override_settings(MIDDLEWARE=middleware):
        yield Spy.seen


def signed_post(client: Client, url: str, body: dict, **kwargs):
    raw = json.dumps(body).encode()
    return client.post(
        url,
        data=raw,
        content_type="application/json",
        headers={signing.HEADER: signing.sign(raw, [SECRET])},
        **kwargs,
    )


def test_the_project_serves_callbacks_past_the_middleware_below_it():
    middleware = settings.MIDDLEWARE
    assert middleware.index(FAST_PATH) == 1
    assert middleware[0] == "django.middleware.security.SecurityMiddleware"


def test_a_callback_skips_the_middleware_below_and_is_queued(sqs_queues, spied):
    body = event_body()

    response = signed_post(Client(), "/callbacks/processor/", body)

    assert response.status_code == 202
    assert spied == []
    assert response.content == (
        b'{"status":"accepted","processor_event_id":"' + body["processor_event_id"].encode() + b'"}'
    )
    assert response["Content-Type"] == "application/json"
    assert response["Content-Length"] == str(len(response.content))
    assert response["Request-Id"].startswith("req_")
    # The middleware above it still runs: SecurityMiddleware's headers.
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["Referrer-Policy"] == "same-origin"
    [message] = queued_messages(sqs_queues)
    assert message["Attributes"]["MessageGroupId"] == body["payment_id"]


def test_a_refused_callback_is_answered_past_the_middleware_below(sqs_queues, spied):
    response = signed_post(Client(), "/callbacks/processor/", event_body(amount="-1.00"))

    assert response.status_code == 400
    assert spied == []
    assert response.json()["error"]["errors"].keys() == {"amount"}
    assert response["Content-Length"] == str(len(response.content))
    assert queued_messages(sqs_queues) == []


def test_a_bad_signature_is_answered_past_the_middleware_below(sqs_queues, spied):
    response = Client().post(
        "/callbacks/processor/",
        data=json.dumps(event_body()).encode(),
        content_type="application/json",
        headers={signing.HEADER: "t=1,v1=00"},
    )

    assert response.status_code == 401
    assert spied == []
    assert response.json()["error"]["request_id"] == response["Request-Id"]


def test_every_other_request_goes_down_the_whole_chain(spied):
    client = Client()

    assert client.get("/healthz").status_code == 200
    # The endpoint's path without its slash is not the endpoint's: CommonMiddleware's to answer.
    client.get("/callbacks/processor")

    assert spied == ["/healthz", "/callbacks/processor"]


@override_settings(ROOT_URLCONF=__name__)
def test_the_endpoint_is_found_where_the_project_mounts_it(sqs_queues, spied):
    response = signed_post(Client(), "/ach/callbacks/processor/", event_body())

    assert response.status_code == 202
    assert spied == []
    assert len(queued_messages(sqs_queues)) == 1


@override_settings(ROOT_URLCONF="triage.urls")
def test_a_project_without_the_endpoint_goes_down_the_whole_chain(spied):
    client = Client()

    assert client.get("/healthz").status_code == 200
    assert client.post("/callbacks/processor/").status_code == 404

    assert spied == ["/healthz", "/callbacks/processor/"]


def test_the_endpoint_answers_the_same_without_the_middleware(sqs_queues):
    body = event_body()
    without = [name for name in settings.MIDDLEWARE if name != FAST_PATH]

    with override_settings(MIDDLEWARE=without):
        response = signed_post(Client(), "/callbacks/processor/", body)

    assert response.status_code == 202
    assert response.json() == {
        "status": "accepted",
        "processor_event_id": body["processor_event_id"],
    }
    assert len(queued_messages(sqs_queues)) == 1
