"""The OpenAPI 3 schema served at /api/schema/ (drf-spectacular)."""

import pytest

pytestmark = pytest.mark.django_db


@pytest.fixture
def schema(client) -> dict:
    response = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    return response.json()


def test_the_schema_is_openapi_3_and_describes_the_api_and_the_callback_endpoint(schema):
    assert schema["openapi"].startswith("3.")
    assert {
        "/api/payments/",
        "/api/payments/{payment_id}/",
        "/api/merchants/{merchant_id}/balance/",
        "/callbacks/processor/",
    } <= set(schema["paths"])


def test_the_callback_is_described_with_its_signature_and_every_answer(schema):
    operation = schema["paths"]["/callbacks/processor/"]["post"]
    assert operation["security"] == [{"processorSignature": []}]
    assert {"202", "400", "401", "413", "415", "503"} <= set(operation["responses"])
    assert "Retry-After" in operation["responses"]["503"]["headers"]
    scheme = schema["components"]["securitySchemes"]["processorSignature"]
    assert (scheme["type"], scheme["in"], scheme["name"]) == (
        "apiKey",
        "header",
        "X-Processor-Signature",
    )


def test_the_callback_body_carries_the_contracts_grammar(schema):
    body = schema["components"]["schemas"]["ProcessorEventRequest"]
    assert set(body["required"]) == {
        "payment_id",
        "event_type",
        "processor_event_id",
        "amount",
        "timestamp",
    }
    assert body["properties"]["amount"]["pattern"].startswith("^")
    assert body["properties"]["payment_id"]["format"] == "uuid"


def test_the_callback_body_describes_the_optional_restated_fields(schema):
    properties = schema["components"]["schemas"]["ProcessorEventRequest"]["properties"]
    assert properties["currency"]["pattern"] == "^(?:[A-Z]{3})$"
    assert properties["direction"]["pattern"] == "^(?:debit|credit)$"
    assert properties["processor_id"]["pattern"].startswith("^")
    assert properties["currency"]["nullable"] is True
    assert "compared" in properties["currency"]["description"]


def test_the_payments_api_is_described_with_token_authentication(schema):
    operation = schema["paths"]["/api/payments/"]["post"]
    assert {"tokenAuth": []} in operation["security"]
    assert "201" in operation["responses"]
    assert operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]


def _operations(schema):
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            yield f"{method.upper()} {path}", operation


def test_every_error_answer_of_every_operation_is_the_one_envelope(schema):
    for name, operation in _operations(schema):
        for status, response in operation["responses"].items():
            if int(status) < 400:
                continue
            ref = response["content"]["application/json"]["schema"]["$ref"]
            assert ref == "#/components/schemas/ErrorOutput", (name, status)
        assert {"401", "413", "405"} <= set(operation["responses"]), name
    envelope = schema["components"]["schemas"]["ErrorDetailOutput"]
    assert set(envelope["required"]) == {"type", "code", "param", "message", "request_id", "errors"}
    assert "rate_limit_error" in envelope["properties"]["type"]["pattern"]


def test_every_answer_is_described_with_its_request_id(schema):
    for name, operation in _operations(schema):
        for status, response in operation["responses"].items():
            assert "Request-Id" in response.get("headers", {}), (name, status)


def test_the_list_is_described_with_its_filters_and_cursor_pages(schema):
    operation = schema["paths"]["/api/payments/"]["get"]
    parameters = {p["name"]: p for p in operation["parameters"] if p["in"] == "query"}
    assert set(parameters) == {
        "merchant",
        "state",
        "direction",
        "purpose",
        "created_gte",
        "created_lt",
        "limit",
        "cursor",
    }
    assert (parameters["limit"]["schema"]["minimum"], parameters["limit"]["schema"]["maximum"]) == (
        1,
        100,
    )
    assert parameters["created_gte"]["schema"]["format"] == "date-time"
    assert {"200", "400", "403", "429"} <= set(operation["responses"])
    page = schema["components"]["schemas"]["PaymentList"]
    assert set(page["properties"]) == {"object", "next", "previous", "has_more", "results"}


def test_metadata_is_described_with_its_bounds(schema):
    metadata = schema["components"]["schemas"]["PaymentCreateInputRequest"]["properties"][
        "metadata"
    ]
    assert metadata["maxProperties"] == 50
    assert metadata["additionalProperties"]["maxLength"] == 500
    assert "metadata" in schema["components"]["schemas"]["PaymentOutput"]["properties"]


def test_the_callback_body_describes_a_notification_of_change(schema):
    body = schema["components"]["schemas"]["ProcessorEventRequest"]["properties"]
    assert "notification_of_change" in schema["components"]["schemas"]["EventTypeEnum"]["enum"]
    assert body["change_code"]["pattern"] == "^(?:[A-Z0-9]{1,8})$"
    data = body["corrected_data"]
    assert data["type"] == "object" and data["additionalProperties"] is False
    assert data["properties"]["account_number_last4"]["pattern"] == "^(?:[0-9]{4})$"
    assert "C01: account_number_last4, source_token" in data["description"]


def test_reinitiation_is_described_with_its_body_its_chain_and_its_refusals(schema):
    operation = schema["paths"]["/api/payments/{payment_id}/reinitiate/"]["post"]
    assert operation["operationId"] == "payment_reinitiate"
    assert {"201", "400", "404", "409", "422"} <= set(operation["responses"])
    assert "reinitiation_limit" in operation["responses"]["409"]["description"]
    assert "Idempotency-Key" in {p["name"] for p in operation["parameters"]}
    body = schema["components"]["schemas"]["PaymentReinitiateInputRequest"]
    assert body["additionalProperties"] is False
    assert set(body["properties"]) == {"authorization_reference"}
    created = schema["components"]["schemas"]["PaymentCreatedOutput"]["properties"]
    assert "warnings" in created
    detail = schema["components"]["schemas"]["PaymentDetailOutput"]["properties"]
    assert "reinitiation" in detail


def test_the_callback_body_names_the_dishonor_answers_and_their_codes(schema):
    properties = schema["components"]["schemas"]["ProcessorEventRequest"]["properties"]
    ref = properties["event_type"]["$ref"].rsplit("/", 1)[-1]
    enum = schema["components"]["schemas"][ref]["enum"]
    assert {"return_dishonored", "dishonor_contested"} <= set(enum)
    assert "R61-R69" in properties["reason_code"]["description"]
    assert "R71-R77" in properties["reason_code"]["description"]


def test_the_balance_is_described_with_its_re_credits(schema):
    balance = schema["components"]["schemas"]["BalanceOutput"]
    assert "recredits" in balance["required"]
