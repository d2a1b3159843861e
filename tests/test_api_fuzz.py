"""schemathesis against the live test server, driven by the served OpenAPI schema: the payments
API (with a Token) and the callback endpoint (signed in a ``before_call`` hook). Checks: no 5xx,
every documented answer conforms to the schema, and every callback answered 202 is accounted
for once the worker drains. Operations and their bodies come from the schema, so changes to the
API's serializers are fuzzed without touching this test.

The schema carries the create body's patterns (merchant id, token, amount), so positive cases
are valid bodies; two hooks supply what no schema can: the grant of the generated merchant to
the fuzzing user, and a token without a bank-number-like digit run. A good share of creates
then answers 201 instead of stopping at a 400 or 403."""

import re
import uuid

import hypothesis
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from payments import signing
from payments.models import MerchantAccess
from payments.services import looks_like_bank_number
from tests.callbacks.accounting import unaccounted
from tests.callbacks.test_endpoint import SECRET
from tests.callbacks.worker_support import drain, run_worker

CALLBACK_PATH = "/callbacks/processor/"
CREATE_PATH = "/api/payments/"
# The user the fuzzed payments API acts as: its generated merchants are granted to it.
FUZZ_USER: list = []
_DIGITS_TO_LETTERS = str.maketrans("0123456789", "abcdefghij")
_CONTROL = re.compile(r"[\x00-\x1f\x7f\ud800-\udfff]")
CHECKS = [not_a_server_error, response_schema_conformance]


class ProcessorSignature(requests.auth.AuthBase):
    """Signs the prepared request's body, so the signature covers the exact bytes sent."""

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        body = request.body or b""
        if isinstance(body, str):
            body = body.encode()
        request.headers[signing.HEADER] = signing.sign(body, [SECRET])
        return request


def _is_create(operation) -> bool:
    return operation is not None and operation.path == CREATE_PATH and operation.method == "post"


@schemathesis.hook
def map_body(context, body):
    """The bank-number rule is not in the schema (a digit run the token pattern allows, such
    as ``00000000``): a schema-valid token or description that trips it gets letters for its
    digits, so it stays schema-valid and becomes acceptable. Other values are left as they are,
    so negative cases stay negative."""
    if not _is_create(context.operation) or not isinstance(body, dict):
        return body
    fixed = dict(body)
    for name in ("merchant_id", "source_token", "description"):
        value = fixed.get(name)
        if isinstance(value, str) and looks_like_bank_number(value):
            fixed[name] = value.translate(_DIGITS_TO_LETTERS)
    metadata = fixed.get("metadata")
    if isinstance(metadata, dict):
        # OpenAPI 3.0 cannot bound metadata's keys (1-40 characters, no control character):
        # schema-valid keys past the bounds are brought within them, like bank numbers above.
        fixed["metadata"] = {
            (_CONTROL.sub("_", key)[:40] or "k").translate(_DIGITS_TO_LETTERS): (
                value.translate(_DIGITS_TO_LETTERS) if isinstance(value, str) else value
            )
            for key, value in metadata.items()
        }
    return fixed


@schemathesis.hook
def before_call(context, case, kwargs) -> None:
    if case.operation.path == CALLBACK_PATH:
        kwargs["auth"] = ProcessorSignature()
    elif _is_create(case.operation) and FUZZ_USER and isinstance(case.body, dict):
        # Generated keys repeat across cases (hypothesis reuses and shrinks values), and a key
        # reused with another body is refused: a key the view takes is made unique to the case,
        # so the answer is about the body. Replays under one key are tested in tests/payments.
        key = (case.headers or {}).get("Idempotency-Key")
        if isinstance(key, str) and 1 <= len(key) <= 200:
            case.headers["Idempotency-Key"] = f"{key}-{uuid.uuid4().hex}"
        # An operator grants the merchant before its client creates payments for it.
        merchant_id = case.body.get("merchant_id")
        if isinstance(merchant_id, str) and 0 < len(merchant_id) <= 64:
            MerchantAccess.objects.get_or_create(user=FUZZ_USER[0], merchant_id=merchant_id)


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
    """Run positive and negative cases of one operation, half of ``max_examples`` each (drawn
    apart, so every run sends both kinds); return how many were sent."""
    sent = 0
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

        @hypothesis.settings(
            max_examples=max_examples // 2,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=operation.as_strategy(generation_mode=mode))
        def run(case) -> None:
            nonlocal sent
            response = case.call(base_url=base_url, headers=headers, timeout=30)
            sent += 1
            case.validate_response(response, checks=CHECKS)
            on_response(case, response)

        run()
    return sent


# Cases per operation (the create and the callback endpoint, then each other operation). The full
# count (64 to 72 s on two shared cores) runs in the scale tier (make test-slow); make test sends
# a third of it: every operation, positive and negative cases, the same checks.
BUDGETS = [
    pytest.param((20, 10), id="a-third"),
    pytest.param((60, 30), id="full", marks=pytest.mark.scale),
]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("budget", BUDGETS)
def test_the_api_and_the_callback_endpoint_hold_to_their_schema(
    live_server, api_schema, sqs_queues, module_settings, user, budget
):
    from rest_framework.authtoken.models import Token

    module_settings.WORKER_BACKOFF_BASE_SECONDS = 0  # events for unknown payments fail fast
    token = Token.objects.create(user=user)
    FUZZ_USER[:] = [user]
    accepted: list[str] = []
    statuses: dict[str, set[int]] = {}
    created: list[tuple[str, int]] = []  # the generation mode and status of every create sent

    def record(case, response) -> None:
        statuses.setdefault(f"{case.method} {case.operation.path}", set()).add(response.status_code)
        if _is_create(case.operation):
            created.append((case.meta.generation.mode.value, response.status_code))
        if case.operation.path == CALLBACK_PATH and response.status_code == 202:
            accepted.append(response.json()["processor_event_id"])

    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert {op.path for op in operations} >= {CALLBACK_PATH, CREATE_PATH}
    try:
        for operation in operations:
            is_callback = operation.path == CALLBACK_PATH
            fuzz(
                operation,
                base_url=live_server.url,
                headers={} if is_callback else {"Authorization": f"Token {token.key}"},
                max_examples=budget[0] if is_callback or _is_create(operation) else budget[1],
                on_response=record,
            )
    finally:
        FUZZ_USER.clear()

    run_worker()

    assert accepted, f"no callback was accepted; answers seen: {statuses}"
    # A positive case is a schema-valid body with a granted merchant: most must get through to
    # a payment. (Negative cases are drawn too, and hypothesis's share of each varies by run.)
    positive = [status for mode, status in created if mode == "positive"]
    creates = positive.count(201)
    assert positive, f"no positive create was sent: {created}"
    assert creates >= len(positive) // 2, f"{creates} of {len(positive)} positives answered 201"
    assert not any(code >= 500 for codes in statuses.values() for code in codes), statuses
    assert drain(sqs_queues.client, sqs_queues.url) == []
    assert unaccounted(accepted) == []
