"""Money out read back: a refund and a payout are retrieved and listed in the one shape their
create answered with (``object`` naming it), only by a caller who may act for their merchant
(another merchant's id is the same 404 as a made-up one), in the payments list's cursor pages,
filters refused by name."""

import base64
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from payments.models import DoubleLoss, Payment, PaymentDirection, PaymentPurpose, PaymentState
from payments.services import payment_apply_event
from tests.factories import PaymentFactory, grant, processor_event

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 3, 2, 15, 0, tzinfo=UTC)
TOKEN = "tok_payout_acct_0001"


@pytest.fixture(autouse=True)
def available_at_once(module_settings):
    module_settings.AVAILABLE_AFTER_BANKING_DAYS = 0


def _collected(merchant: str = "acme", amount: str = "100.00") -> Payment:
    debit = PaymentFactory(
        merchant_id=merchant, state=PaymentState.SUBMITTED, amount=Decimal(amount)
    )
    payment_apply_event(event=processor_event(debit, "settled"))
    return debit


def _refund(api_client, debit: Payment, amount: str, **body) -> dict:
    response = api_client.post(
        f"/api/payments/{debit.id}/refunds/", {"amount": amount, **body}, format="json"
    )
    assert response.status_code == 201, response.content
    return response.json()


def _payout(api_client, merchant: str, amount: str, **body) -> dict:
    response = api_client.post(
        "/api/payouts/",
        {"merchant_id": merchant, "amount": amount, "destination_token": TOKEN, **body},
        format="json",
    )
    assert response.status_code == 201, response.content
    return response.json()


def _at(payment_id: str, moment: datetime) -> None:
    Payment.objects.filter(pk=payment_id).update(created_at=moment)


def _results(response) -> list[dict]:
    assert response.status_code == 200, response.content
    return response.json()["results"]


def _refused(response, status: int = 400) -> dict:
    assert response.status_code == status, response.content
    return response.json()["error"]


# --- refunds ------------------------------------------------------------------------------------


def test_a_refund_reads_back_in_the_shape_its_create_answered_and_its_debit_lists(api_client, user):
    grant(user, "acme")
    debit = _collected()
    created = _refund(api_client, debit, "30.00", reason="damaged", metadata={"ticket": "T-1"})

    read = api_client.get(f"/api/refunds/{created['id']}/")
    nested = api_client.get(f"/api/payments/{debit.id}/").json()["refunds"]

    assert read.status_code == 200, read.content
    assert read.json() == created
    assert nested == [created]
    assert (created["object"], created["payment_id"], created["merchant_id"]) == (
        "refund",
        str(debit.id),
        "acme",
    )
    assert (created["reason"], created["metadata"]) == ("damaged", {"ticket": "T-1"})


def test_a_debits_refunds_are_listed_newest_first_in_cursor_pages(api_client, user):
    grant(user, "acme")
    debit = _collected()
    first = _refund(api_client, debit, "10.00")
    second = _refund(api_client, debit, "20.00")
    _at(first["id"], T0)
    _at(second["id"], T0 + timedelta(minutes=1))
    other_debit = _collected()
    _refund(api_client, other_debit, "5.00")  # another debit's: never in this list

    page_one = api_client.get(f"/api/payments/{debit.id}/refunds/", {"limit": 1})
    page_two = api_client.get(page_one.json()["next"])

    assert [r["id"] for r in _results(page_one)] == [second["id"]]
    assert [r["id"] for r in _results(page_two)] == [first["id"]]
    assert page_two.json()["next"] is None
    assert all(r["object"] == "refund" for r in _results(page_one) + _results(page_two))


def test_the_refund_list_filters_by_state_and_creation_time(api_client, user):
    grant(user, "acme")
    debit = _collected()
    early = _refund(api_client, debit, "10.00")
    late = _refund(api_client, debit, "20.00")
    _at(early["id"], T0)
    _at(late["id"], T0 + timedelta(hours=2))
    Payment.objects.filter(pk=late["id"]).update(state=PaymentState.CANCELED)
    url = f"/api/payments/{debit.id}/refunds/"

    pending = _results(api_client.get(url, {"state": "pending"}))
    after = _results(api_client.get(url, {"created_gte": (T0 + timedelta(hours=1)).isoformat()}))

    assert [r["id"] for r in pending] == [early["id"]]
    assert [r["id"] for r in after] == [late["id"]]


def test_another_merchants_refund_is_the_same_404_as_a_made_up_one(api_client, user):
    grant(user, "acme")
    theirs = _collected("globex")
    refund = PaymentFactory(
        merchant_id="globex",
        direction=PaymentDirection.CREDIT,
        purpose=PaymentPurpose.REFUND,
        refund_of=theirs,
        amount=Decimal("5.00"),
    )
    made_up = "6f1c3b8e-0000-4000-8000-000000000000"

    answers = [
        api_client.get(f"/api/refunds/{refund.id}/"),
        api_client.get(f"/api/refunds/{made_up}/"),
    ]
    listed = api_client.get(f"/api/payments/{theirs.id}/refunds/")

    theirs_answer, made_up_answer = (_refused(a, 404) for a in answers)
    theirs_answer.pop("request_id"), made_up_answer.pop("request_id")
    assert theirs_answer == made_up_answer
    assert _refused(answers[0], 404)["param"] == "refund_id"
    assert _refused(listed, 404)["param"] == "payment_id"


def test_a_payment_or_payout_id_is_not_a_refund_and_a_refund_has_no_refunds(api_client, user):
    grant(user, "acme")
    debit = _collected()
    refund = _refund(api_client, debit, "10.00")
    payout = _payout(api_client, "acme", "5.00")

    assert _refused(api_client.get(f"/api/refunds/{debit.id}/"), 404)["param"] == "refund_id"
    assert _refused(api_client.get(f"/api/refunds/{payout['id']}/"), 404)["param"] == "refund_id"
    assert _refused(api_client.get(f"/api/payouts/{refund['id']}/"), 404)["param"] == "payout_id"
    assert (
        _refused(api_client.get(f"/api/payments/{refund['id']}/refunds/"), 404)["param"]
        == "payment_id"
    )


@pytest.mark.parametrize(
    "refund_id",
    ["not-a-uuid", "%00", "%ED%A0%80", "9" * 5000],
    ids=["text", "nul", "surrogate", "huge"],
)
def test_a_malformed_id_is_answered_404_by_the_api(api_client, user, refund_id):
    grant(user, "acme")

    for path in (f"/api/refunds/{refund_id}/", f"/api/payouts/{refund_id}/"):
        error = _refused(api_client.get(path), 404)
        assert error["code"] == "resource_missing"


# --- payouts ------------------------------------------------------------------------------------


def test_a_payout_reads_back_with_its_metadata_and_destination(api_client, user):
    grant(user, "acme")
    _collected()
    created = _payout(api_client, "acme", "40.00", metadata={"run": "march-payroll"})

    read = api_client.get(f"/api/payouts/{created['id']}/")

    assert read.status_code == 200, read.content
    assert read.json() == created
    assert created["object"] == "payout"
    assert created["metadata"] == {"run": "march-payroll"}
    assert created["destination"] == {"token": TOKEN, "last4": None}
    assert Payment.objects.get(pk=created["id"]).metadata == {"run": "march-payroll"}


def test_payouts_list_only_the_callers_merchants_payouts(api_client, user):
    grant(user, "acme")
    grant(user, "globex")
    _collected("acme")
    _collected("globex")
    _collected("initech")
    ours = _payout(api_client, "acme", "10.00")
    theirs = _payout(api_client, "globex", "20.00")
    _at(ours["id"], T0)
    _at(theirs["id"], T0 + timedelta(minutes=1))
    PaymentFactory(  # not granted: never listed
        merchant_id="initech", direction=PaymentDirection.CREDIT, purpose=PaymentPurpose.PAYOUT
    )

    listed = _results(api_client.get("/api/payouts/"))
    acme_only = _results(api_client.get("/api/payouts/", {"merchant": "acme"}))

    assert [p["id"] for p in listed] == [theirs["id"], ours["id"]]
    assert [p["id"] for p in acme_only] == [ours["id"]]
    assert all(p["object"] == "payout" for p in listed)


def test_the_payout_list_holds_no_debits_or_refunds(api_client, user):
    grant(user, "acme")
    debit = _collected()
    _refund(api_client, debit, "10.00")
    payout = _payout(api_client, "acme", "10.00")

    assert [p["id"] for p in _results(api_client.get("/api/payouts/"))] == [payout["id"]]
    assert _results(api_client.get("/api/payouts/", {"purpose": "refund"})) == []


def test_another_merchants_payout_is_404_and_their_list_403(api_client, user):
    grant(user, "acme")
    theirs = PaymentFactory(
        merchant_id="globex", direction=PaymentDirection.CREDIT, purpose=PaymentPurpose.PAYOUT
    )

    assert _refused(api_client.get(f"/api/payouts/{theirs.id}/"), 404)["param"] == "payout_id"
    forbidden = _refused(api_client.get("/api/payouts/", {"merchant": "globex"}), 403)
    assert forbidden["param"] == "merchant"


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ({"state": "pending\x00"}, "state"),
        ({"state": "settled"}, "state"),
        ({"direction": "sideways"}, "direction"),
        ({"purpose": "gift"}, "purpose"),
        ({"created_gte": "NaN"}, "created_gte"),
        ({"created_gte": "2026-13-45"}, "created_gte"),
        ({"limit": "1e3"}, "limit"),
        ({"limit": "0"}, "limit"),
        ({"limit": "101"}, "limit"),
        ({"cursor": "!!!***"}, "cursor"),
        ({"cursor": base64.b64encode(b"p=yesterday").decode()}, "cursor"),
        ({"merchant": "a" * 65}, "merchant"),
        ({"colour": "blue"}, "colour"),
    ],
)
def test_a_bad_list_query_is_refused_naming_it(api_client, user, query, param):
    grant(user, "acme")
    debit = _collected()

    for path in ("/api/payouts/", f"/api/payments/{debit.id}/refunds/"):
        assert _refused(api_client.get(path, query))["param"] == param


def test_a_filter_given_twice_is_refused(api_client, user):
    grant(user, "acme")

    error = _refused(api_client.get("/api/payouts/?state=pending&state=failed"))

    assert error["param"] == "state"


@pytest.mark.parametrize(
    ("metadata", "param"),
    [
        ({"k": "v\x00"}, "metadata"),
        ({"k": 1.5}, "metadata[k]"),
        ({"k": {"deep": "x"}}, "metadata[k]"),
        ({"k": "021000021 123456789"}, "metadata[k]"),
        ([1, 2], "metadata"),
        ({f"k{i}": "v" for i in range(51)}, "metadata"),
    ],
    ids=["nul", "number", "nested", "bank-number", "list", "too-many"],
)
def test_a_payouts_bad_metadata_is_refused_and_nothing_is_created(
    api_client, user, metadata, param
):
    grant(user, "acme")
    _collected()

    response = api_client.post(
        "/api/payouts/",
        {"merchant_id": "acme", "amount": "5.00", "destination_token": TOKEN, "metadata": metadata},
        format="json",
    )

    assert _refused(response)["param"] == param
    assert not Payment.objects.filter(purpose=PaymentPurpose.PAYOUT).exists()


def test_a_refund_hit_by_a_double_loss_shows_it_wherever_it_is_read(api_client, user):
    grant(user, "acme")
    debit = _collected()
    created = _refund(api_client, debit, "45.00")
    assert created["double_loss"] is None
    Payment.objects.filter(pk=created["id"]).update(state=PaymentState.SUBMITTED)
    debit.refresh_from_db()

    payment_apply_event(event=processor_event(debit, "returned", reason_code="R10"))

    read = api_client.get(f"/api/refunds/{created['id']}/").json()
    listed = _results(api_client.get(f"/api/payments/{debit.id}/refunds/"))
    nested = api_client.get(f"/api/payments/{debit.id}/").json()["refunds"]
    loss = DoubleLoss.objects.get()
    expected = {
        "amount": "45.00",
        "currency": "USD",
        "status": "open",
        "detected_at": loss.detected_at.isoformat().replace("+00:00", "Z"),
    }
    assert read["double_loss"] == listed[0]["double_loss"] == nested[0]["double_loss"] == expected


def test_a_refunds_create_answer_reads_no_double_loss(api_client, user):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    grant(user, "acme")
    debit = _collected()

    with CaptureQueriesContext(connection) as queries:
        _refund(api_client, debit, "5.00")

    assert not [q for q in queries.captured_queries if "payments_doubleloss" in q["sql"]]
