"""schemathesis against the live test server, driven by the served OpenAPI schema: the payments
API (with a Token) and the callback endpoint (signed in a ``before_call`` hook). Checks: no 5xx,
every documented answer conforms to the schema, and every callback answered 202 is accounted
for once the worker drains. Operations and their bodies come from the schema, so changes to the
API's serializers are fuzzed without touching this test."""

import hypothesis
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from payments import signing
from tests.callbacks.accounting import unaccounted
from tests.callbacks.test_endpoint import SECRET
from tests.callbacks.worker_support import drain, run_worker

CALLBACK_PATH = "/callbacks/processor/"
CHECKS = [not_a_server_error, response_schema_conformance]


class ProcessorSignature(requests.auth.AuthBase):
    """Signs the prepared request's body, so the signature covers the exact bytes sent."""

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        body = request.body or b""
        if isinstance(body, str):
            body = body.encode()
        request.headers[signing.HEADER] = signing.sign(body, [SECRET])
        return request


@schemathesis.hook
def before_call(context, case, kwargs) -> None:
    if case.operation.path == CALLBACK_PATH:
        kwargs["auth"] = ProcessorSignature()


@pytest.fixture
def api_schema(live_server):
    response = requests.get(
        f"{live_server.url}/api/schema/",
        headers={"Accept": "application/vnd.oai.openapi+json"},
        timeout=30,
    )
    assert response.status_code == 200
    return schemathesis.openapi.from_dict(response.json())


def fuzz(operation, *, base_url: str, headers: dict, max_examples: int, on_response) -> int:
    """Run positive and negative cases of one operation; return how many were sent."""
    sent = 0
    strategy = st.one_of(
        operation.as_strategy(generation_mode=GenerationMode.POSITIVE),
        operation.as_strategy(generation_mode=GenerationMode.NEGATIVE),
    )

    @hypothesis.settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def run(case) -> None:
        nonlocal sent
        response = case.call(base_url=base_url, headers=headers, timeout=30)
        sent += 1
        case.validate_response(response, checks=CHECKS)
        on_response(case, response)

    run()
    return sent


@pytest.mark.django_db(transaction=True)
def test_the_api_and_the_callback_endpoint_hold_to_their_schema(
    live_server, api_schema, sqs_queues, settings, user
):
    from rest_framework.authtoken.models import Token

    settings.WORKER_BACKOFF_BASE_SECONDS = 0  # events for unknown payments fail fast
    token = Token.objects.create(user=user)
    accepted: list[str] = []
    statuses: dict[str, set[int]] = {}

    def record(case, response) -> None:
        statuses.setdefault(f"{case.method} {case.operation.path}", set()).add(response.status_code)
        if case.operation.path == CALLBACK_PATH and response.status_code == 202:
            accepted.append(response.json()["processor_event_id"])

    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert {op.path for op in operations} >= {CALLBACK_PATH, "/api/payments/"}
    for operation in operations:
        is_callback = operation.path == CALLBACK_PATH
        fuzz(
            operation,
            base_url=live_server.url,
            headers={} if is_callback else {"Authorization": f"Token {token.key}"},
            max_examples=60 if is_callback else 30,
            on_response=record,
        )

    run_worker()

    assert accepted, f"no callback was accepted; answers seen: {statuses}"
    assert drain(sqs_queues.client, sqs_queues.url) == []
    assert unaccounted(accepted) == []
