"""End to end through the sandbox processor: a notification of change is recorded once, and a
returned debit is reinitiated and settles.

Real parts only: the sandbox over HTTP sends signed callbacks to the callback endpoint of a
live server, which publishes them to the local SQS server; the worker applies them.
"""

import json
import re

import pytest

from callbacks.models import QueueMessage
from payments.models import (
    LedgerEntry,
    NocStatus,
    NotificationOfChange,
    Payment,
    PaymentEvent,
    PaymentState,
)
from tests.callbacks.sandbox_support import sandbox_posting_callbacks
from tests.callbacks.test_endpoint import event_body, post_json, queued_messages
from tests.callbacks.test_returns_end_to_end import _work_until
from tests.factories import PaymentFactory, grant
from triage.models import DeadLetter

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def sandbox_with_callbacks(module_settings, live_server):
    with sandbox_posting_callbacks(
        module_settings, live_server, return_after_seconds=0.3
    ) as server:
        yield server


def test_a_noc_from_the_processor_is_recorded_once_and_the_next_debit_is_warned(
    sqs_queues, sandbox_with_callbacks, api_client, user
):
    grant(user, "m-noc")
    created = api_client.post(
        "/api/payments/",
        {"merchant_id": "m-noc", "amount": "19.00", "source_token": "tok_noc_C06_e2e_01"},
        format="json",
    )
    assert created.status_code == 201 and "warnings" not in created.json()
    payment_id = created.json()["id"]

    assert _work_until(lambda: NotificationOfChange.objects.filter(payment_id=payment_id).exists())
    noc = NotificationOfChange.objects.get(payment_id=payment_id)
    assert (noc.change_code, noc.status, noc.source_token) == (
        "C06",
        NocStatus.OPEN,
        noc.source_token,
    )
    assert noc.corrected_data == {
        "account_number_last4": "6789",
        "source_token": "tok_corrected_0001",
        "transaction_code": "37",
        "account_type": "savings",
    }
    # It moved nothing: the payment stays settled with its one credit.
    payment = Payment.objects.get(pk=payment_id)
    assert payment.state == PaymentState.CONFIRMED
    assert LedgerEntry.objects.filter(payment=payment).count() == 1
    assert not DeadLetter.objects.exists()
    assert not QueueMessage.objects.exclude(status="done").exists()

    # The token's next debit, inside the deadline: made, with a warning naming the NOC only.
    again = api_client.post(
        "/api/payments/",
        {"merchant_id": "m-noc", "amount": "19.00", "source_token": "tok_noc_C06_e2e_01"},
        format="json",
    )
    assert again.status_code == 201
    assert [w["noc_id"] for w in again.json()["warnings"]] == [noc.id]
    assert "6789" not in again.content.decode()


def test_a_returned_debit_reinitiated_through_the_api_settles_and_shows_its_chain(
    sqs_queues, sandbox_with_callbacks, api_client, user
):
    grant(user, "m-reinit")
    created = api_client.post(
        "/api/payments/",
        {"merchant_id": "m-reinit", "amount": "30.00", "source_token": "tok_nsfonce_e2e_1"},
        format="json",
    )
    original_id = created.json()["id"]
    assert _work_until(lambda: Payment.objects.get(pk=original_id).state == "returned")

    response = api_client.post(
        f"/api/payments/{original_id}/reinitiate/",
        {},
        format="json",
        headers={"Idempotency-Key": "reinit-e2e"},
    )
    assert response.status_code == 201, response.json()
    again_id = response.json()["id"]
    assert _work_until(lambda: Payment.objects.get(pk=again_id).state == "confirmed")

    detail = api_client.get(f"/api/payments/{original_id}/").json()
    assert [(e["id"], e["state"], e["return_code"]) for e in detail["reinitiation"]["chain"]] == [
        (original_id, "returned", "R01"),
        (again_id, "confirmed", ""),
    ]
    # Each entry was charged once by the processor; the merchant's net is the one that stood.
    assert sandbox_with_callbacks.stats()["charges_by_payment"] == {original_id: 1, again_id: 1}
    balance = api_client.get("/api/merchants/m-reinit/balance/").json()["balances"][0]
    assert (balance["credits"], balance["reversals"], balance["net"]) == (
        "60.00",
        "30.00",
        "30.00",
    )


def test_a_hostile_noc_callback_is_refused_at_the_edge_naming_the_field(sqs_queues):
    payment = PaymentFactory(state=PaymentState.CONFIRMED)
    body = event_body(
        payment_id=str(payment.id),
        amount=f"{payment.amount:.2f}",
        event_type="notification_of_change",
        change_code="C01",
        corrected_data={"account_number": "123456789012"},
    )
    response = post_json(body)
    assert response.status_code == 400
    errors = response.json()["error"]["errors"]
    assert list(errors) == ["corrected_data[account_number]"]
    assert "123456789012" not in response.content.decode()
    assert queued_messages(sqs_queues) == []


@pytest.mark.parametrize(
    ("key", "param"),
    [
        ("7766805686931", "corrected_data[****6931]"),
        ("77668056869313516", "corrected_data[****3516]"),
        ("acct_77668056869313516", "corrected_data[acct_****3516]"),
        ("1234", "corrected_data[1234]"),
        ("\u0667" * 13, "corrected_data[(a key)]"),
        ("\uff17" * 17, "corrected_data[(a key)]"),
    ],
    ids=["13-digits", "17-digits", "in-a-name", "4-digits", "arabic-indic", "full-width"],
)
def test_a_corrected_data_key_of_digits_is_refused_without_echoing_them(sqs_queues, key, param):
    payment = PaymentFactory(state=PaymentState.CONFIRMED)
    body = event_body(
        payment_id=str(payment.id),
        amount=f"{payment.amount:.2f}",
        event_type="notification_of_change",
        change_code="C01",
        corrected_data={key: "x"},
    )
    response = post_json(body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == param and list(error["errors"]) == [param]
    assert "not a corrected field of C01" in error["message"]
    text = json.dumps(error, ensure_ascii=False).replace(error["request_id"], "")
    assert not re.search(r"\d{5,}", text), text
    assert queued_messages(sqs_queues) == []


def test_a_noc_callback_through_the_queue_is_applied_exactly_once_even_when_sent_twice(
    sqs_queues,
):
    from tests.callbacks.worker_support import run_worker

    payment = PaymentFactory(state=PaymentState.CONFIRMED)
    body = event_body(
        payment_id=str(payment.id),
        amount=f"{payment.amount:.2f}",
        event_type="notification_of_change",
        change_code="C02",
        corrected_data={"routing_number_last4": "0021"},
    )
    assert post_json(body).status_code == 202
    run_worker()
    assert post_json(body).status_code == 202  # a resend after the first was applied
    run_worker()

    assert NotificationOfChange.objects.filter(payment=payment).count() == 1
    outcomes = list(
        PaymentEvent.objects.filter(payment=payment, event_type="notification_of_change")
        .order_by("id")
        .values_list("outcome", flat=True)
    )
    # SQS drops the resend inside its window, or the dedup record marks it a duplicate.
    assert outcomes in (["recorded"], ["recorded", "duplicate"])


ACCOUNT_17 = "77668056869313516"
ACCOUNT_13 = "7766805686931"
ARABIC_17 = "".join(chr(0x0660 + int(d)) for d in ACCOUNT_17)


def test_a_noc_callback_keeps_its_extra_members_and_message_with_bank_numbers_masked(
    sqs_queues, admin_client, caplog
):
    from tests.callbacks.worker_support import run_worker

    caplog.set_level("DEBUG")
    payment = PaymentFactory(state=PaymentState.CONFIRMED)
    body = event_body(
        payment_id=str(payment.id),
        amount=f"{payment.amount:.2f}",
        event_type="notification_of_change",
        change_code="C01",
        corrected_data={"account_number_last4": "3516", "source_token": "tok_corrected_0001"},
        message=f"C01: account now {ACCOUNT_17} (was 7766 8056 8693 1351 6, {ARABIC_17})",
        corrected_dfi_account_number=ACCOUNT_17,
        processor_reference={
            "accounts": [ACCOUNT_13, int(ACCOUNT_13), f"acct-{ACCOUNT_13}"],
            "batch": "B-2026-11-02",
            "posted_at": "2026-11-02T12:00:00.123456+00:00",
            "fee": "12500.00",
            "bank_reference": "1234",
            "payment": str(payment.id),
        },
    )
    assert post_json(body).status_code == 202
    run_worker()

    assert NotificationOfChange.objects.filter(payment=payment).count() == 1
    event = PaymentEvent.objects.get(payment=payment, event_type="notification_of_change")
    payload = event.payload
    assert payload["corrected_dfi_account_number"] == "****3516"
    assert (
        payload["message"]
        == "C01: account now ****3516 (was ****3516, ****\u0663\u0665\u0661\u0666)"
    )
    assert payload["processor_reference"] == {
        "accounts": ["****6931", "****6931", "acct-****6931"],
        "batch": "B-2026-11-02",
        "posted_at": "2026-11-02T12:00:00.123456+00:00",
        "fee": "12500.00",
        "bank_reference": "1234",
        "payment": str(payment.id),
    }
    page = admin_client.get(f"/admin/payments/paymentevent/{event.pk}/change/")
    assert page.status_code == 200 and "****3516" in page.content.decode()
    logged = "\n".join(f"{r.getMessage()} {r.__dict__}" for r in caplog.records)
    for shown in (json.dumps(payload), page.content.decode(), logged):
        assert ACCOUNT_13 not in shown and ARABIC_17[:5] not in shown
        assert "7766 8056" not in shown


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({ACCOUNT_17: "x"}, "****3516"),
        ({"ref": {f"acct_{ACCOUNT_13}": 1}}, "ref.acct_****6931"),
        ({"ref": [{ARABIC_17: 1}]}, "ref[0].****\u0663\u0665\u0661\u0666"),
    ],
    ids=["top-level", "nested", "arabic-in-a-list"],
)
def test_a_callback_member_named_by_a_bank_number_is_refused_naming_its_place(
    sqs_queues, extra, param
):
    payment = PaymentFactory(state=PaymentState.CONFIRMED)
    body = event_body(payment_id=str(payment.id), amount=f"{payment.amount:.2f}", **extra)
    response = post_json(body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == param, error
    assert "a member's name holds a run of digits" in error["message"]
    text = json.dumps(error, ensure_ascii=False).replace(error["request_id"], "")
    assert not re.search(r"\d{5,}", text), text
    assert queued_messages(sqs_queues) == []
