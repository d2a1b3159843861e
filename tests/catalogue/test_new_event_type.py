"""The yardstick of the event catalogue: a new recorded event type, declared in a module of
its own outside the product (``tests.catalogue.remittance``), goes through the real callback
endpoint, the local SQS server and the real worker to one event-log row, with no product file
changed; the contract refuses it malformed and before it is registered, and the OpenAPI schema
publishes it."""

import pytest

from payments.catalogue import event_type_register, event_type_unregister
from payments.models import EventKind, PaymentEvent, PaymentState
from tests.callbacks.test_endpoint import event_body, post_json, queued_messages
from tests.callbacks.worker_support import run_worker
from tests.catalogue import remittance
from tests.factories import PaymentFactory

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def remittance_type():
    remittance.RECORDED.clear()
    event_type_register(remittance.REMITTANCE_ADVICE)
    yield remittance.REMITTANCE_ADVICE
    event_type_unregister(remittance.REMITTANCE_ADVICE.name)


def _advice(payment, **overrides) -> dict:
    return event_body(
        payment_id=str(payment.id),
        amount=f"{payment.amount:.2f}",
        event_type="remittance_advice",
        **{"invoice": "INV-20261102", **overrides},
    )


def test_an_unregistered_type_is_refused_at_the_edge_naming_the_catalogue(sqs_queues):
    payment = PaymentFactory(state=PaymentState.CONFIRMED)
    response = post_json(_advice(payment))
    assert response.status_code == 400
    errors = response.json()["error"]["errors"]
    assert "Must be one of submitted, settled" in errors["event_type"][0]
    assert queued_messages(sqs_queues) == []


def test_a_new_recorded_type_goes_from_the_endpoint_through_the_worker_to_one_log_row(
    sqs_queues, remittance_type
):
    payment = PaymentFactory(state=PaymentState.CONFIRMED)
    body = _advice(payment)

    assert post_json(body).status_code == 202
    run_worker()
    assert post_json(body).status_code == 202  # a resend: SQS drops it, or it is a duplicate
    run_worker()

    rows = PaymentEvent.objects.filter(
        payment=payment, kind=EventKind.PROCESSOR_EVENT, event_type="remittance_advice"
    ).order_by("id")
    assert [row.outcome for row in rows] in (["recorded"], ["recorded", "duplicate"])
    first = rows[0]
    assert (first.from_state, first.to_state) == ("confirmed", "confirmed")
    assert first.payload["invoice"] == "INV-20261102"
    assert remittance.RECORDED == [(str(payment.id), "INV-20261102")]  # its handler, once
    payment.refresh_from_db()
    assert payment.state == PaymentState.CONFIRMED and not payment.ledger_entries.exists()


@pytest.mark.parametrize(
    ("overrides", "field", "message"),
    [
        ({"invoice": "12345"}, "invoice", "Must be INV- and 1-12 digits"),
        ({"invoice": None}, "invoice", "Required for a remittance_advice event."),
        ({"invoice": 42}, "invoice", "Must be a string"),
        ({"change_code": "C01"}, "change_code", "Only a notification_of_change event carries"),
    ],
    ids=["malformed", "missing", "not-a-string", "another-types-field"],
)
def test_a_new_types_own_field_is_held_to_its_rules_at_the_edge(
    sqs_queues, remittance_type, overrides, field, message
):
    payment = PaymentFactory(state=PaymentState.CONFIRMED)
    response = post_json(_advice(payment, **overrides))
    assert response.status_code == 400
    assert message in " ".join(response.json()["error"]["errors"][field])
    assert queued_messages(sqs_queues) == []


def test_another_types_event_may_not_carry_the_new_types_field(sqs_queues, remittance_type):
    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    body = event_body(
        payment_id=str(payment.id),
        amount=f"{payment.amount:.2f}",
        event_type="settled",
        invoice="INV-1",
    )
    response = post_json(body)
    assert response.status_code == 400
    assert response.json()["error"]["errors"]["invoice"] == [
        "Only a remittance_advice event carries invoice."
    ]


def test_the_openapi_schema_publishes_the_new_type_and_its_field(remittance_type, client):
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    components = schema["components"]["schemas"]
    assert "remittance_advice" in components["EventTypeEnum"]["enum"]
    assert "invoice" in components["ProcessorEventRequest"]["properties"]
