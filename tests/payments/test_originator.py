"""A payment's SEC code and company entry description, and the merchant's originator profile:
what the create path takes, refuses and defaults to, and what the admin records."""

import json
import threading
from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError
from django.db import connection
from django.urls import reverse

from payments.exceptions import SecCodeNotAllowed
from payments.models import OriginatorProfile, OriginatorProfileChange, Payment, PaymentEvent
from payments.originator import entry_description_problem
from payments.services import payment_create
from payments.services.originators import originator_profile_save
from tests.factories import UserFactory, account_validated, grant

pytestmark = pytest.mark.django_db

TOKEN = "tok_originator_01"
BODY = {"merchant_id": "m-orig", "amount": "25.00", "source_token": TOKEN}


@pytest.fixture(autouse=True)
def _grants(user):
    grant(user, "m-orig", "m-other")
    # WEB debits from the token: validated, as NACHA's rule wants (tests/payments/
    # test_account_validation.py holds the rule itself).
    account_validated(TOKEN, "m-orig")


def _profile(merchant_id="m-orig", codes=("PPD", "WEB"), description="", **fields):
    values = {
        "company_name": "ORIG SHOP",
        "company_identification": "1999999999",
        "allowed_sec_codes": list(codes),
        "default_entry_description": description,
        **fields,
    }
    return originator_profile_save(merchant_id=merchant_id, values=values)


def _post(api_client, **fields):
    return api_client.post("/api/payments/", {**BODY, **fields}, format="json")


# --- the create path ---------------------------------------------------------------------------


@pytest.mark.parametrize("sec_code", ["PPD", "CCD", "WEB"])
def test_the_api_creates_a_payment_of_each_sec_code_and_shows_it(api_client, sec_code):
    response = _post(api_client, sec_code=sec_code, entry_description="SUBSCRIPTN")

    assert response.status_code == 201, response.json()
    body = response.json()
    assert (body["sec_code"], body["entry_description"]) == (sec_code, "SUBSCRIPTN")
    payment = Payment.objects.get(pk=body["id"])
    assert (payment.sec_code, payment.entry_description) == (sec_code, "SUBSCRIPTN")
    created = PaymentEvent.objects.get(payment=payment, kind="created")
    assert created.payload["sec_code"] == sec_code
    assert created.payload["entry_description"] == "SUBSCRIPTN"
    detail = api_client.get(f"/api/payments/{payment.id}/").json()
    assert (detail["sec_code"], detail["entry_description"]) == (sec_code, "SUBSCRIPTN")


def test_a_payment_without_a_sec_code_takes_the_default_setting(api_client, module_settings):
    assert _post(api_client).json()["sec_code"] == "PPD"
    module_settings.DEFAULT_SEC_CODE = "CCD"
    body = _post(api_client).json()
    assert (body["sec_code"], body["entry_description"]) == ("CCD", "")


def test_a_sec_code_the_profile_does_not_allow_is_refused_409_and_nothing_is_written(api_client):
    _profile(codes=["PPD"])

    response = _post(api_client, sec_code="WEB")

    assert response.status_code == 409
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("sec_code_not_allowed", "sec_code")
    assert "WEB" in error["message"] and "PPD" in error["message"]
    assert not Payment.objects.exists()


def test_the_default_sec_code_is_refused_too_when_the_profile_does_not_allow_it(
    api_client, module_settings
):
    _profile(codes=["CCD"])
    module_settings.DEFAULT_SEC_CODE = "PPD"
    assert _post(api_client).json()["error"]["code"] == "sec_code_not_allowed"
    assert _post(api_client, sec_code="CCD").status_code == 201


def test_another_merchants_profile_does_not_limit_this_one(api_client):
    _profile(merchant_id="m-other", codes=["CCD"])
    assert _post(api_client, sec_code="WEB").status_code == 201


def test_the_profiles_default_description_fills_a_payment_that_names_none(api_client):
    _profile(description="ORIG SHOP")
    assert _post(api_client).json()["entry_description"] == "ORIG SHOP"
    assert _post(api_client, entry_description="MEMBERSHIP").json()["entry_description"] == (
        "MEMBERSHIP"
    )


def test_purchase_is_taken_for_a_web_debit_only(api_client):
    web = _post(api_client, sec_code="WEB", entry_description="PURCHASE")
    ppd = _post(api_client, sec_code="PPD", entry_description="PURCHASE")

    assert web.status_code == 201 and web.json()["entry_description"] == "PURCHASE"
    assert ppd.status_code == 400
    assert ppd.json()["error"]["param"] == "entry_description"
    assert "WEB debit" in ppd.json()["error"]["message"]


@pytest.mark.parametrize(
    "word", ["RETRY PYMT", "REFUND", "PAYOUT", "PAYROLL", "ACCTVERIFY", "REVERSAL"]
)
def test_a_mandated_description_of_another_kind_of_entry_is_refused(api_client, word):
    response = _post(api_client, sec_code="WEB", entry_description=word)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "entry_description" and "reserve" in error["message"]
    assert not Payment.objects.exists()


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("sec_code", "web", "PPD, CCD, WEB"),
        ("sec_code", "TEL", "PPD, CCD, WEB"),
        ("sec_code", "WEB\x00", "NUL character"),
        ("sec_code", "WEB ", "PPD, CCD, WEB"),
        ("sec_code", "", "blank"),
        ("sec_code", 7, "JSON string"),
        ("sec_code", None, "null"),
        ("entry_description", "purchase", "lower-case"),
        ("entry_description", "ELEVEN CHAR", "1 to 10"),
        ("entry_description", "X" * 60_000, "1 to 10"),
        ("entry_description", "", "blank"),
        ("entry_description", "NUL\x00BYTE", "NUL character"),
        ("entry_description", "CAF\u00c9", "printable ASCII"),
        ("entry_description", " PADDED", "space"),
        ("entry_description", "TAB\tHERE", "printable ASCII"),
        ("entry_description", ["PURCHASE"], "JSON string"),
    ],
    ids=lambda v: repr(v)[:20],
)
def test_a_hostile_sec_code_or_description_is_refused_400_naming_it(
    api_client, field, value, message
):
    response = _post(api_client, **{field: value})

    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["param"] == field
    assert message in str(error["errors"][field]), error
    assert not Payment.objects.exists()


def test_a_lone_surrogate_in_the_description_is_refused_400(api_client):
    raw = json.dumps({**BODY, "entry_description": "SURROGATE"}).replace("SURROGATE", "\\ud800A")
    response = api_client.post("/api/payments/", raw, content_type="application/json")
    assert response.status_code == 400
    assert "entry_description" in response.json()["error"]["message"]
    assert not Payment.objects.exists()


def test_an_unknown_field_beside_them_is_refused_by_name(api_client):
    response = _post(api_client, sec_code="WEB", standard_entry_class="WEB")
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "standard_entry_class"


def test_the_service_refuses_a_bad_sec_code_given_directly():
    with pytest.raises(ValidationError) as raised:
        payment_create(
            merchant_id="m-orig", amount=Decimal("1.00"), source_token=TOKEN, sec_code="ARC"
        )
    assert "sec_code" in raised.value.message_dict
    with pytest.raises(SecCodeNotAllowed):
        _profile(codes=["CCD"])
        payment_create(merchant_id="m-orig", amount=Decimal("1.00"), source_token=TOKEN)
    assert not Payment.objects.exists()


def test_a_create_reads_the_profile_in_one_statement(django_assert_num_queries):
    _profile(codes=["WEB"], description="ORIG SHOP")
    payment_create(merchant_id="m-orig", amount=Decimal("1.00"), source_token=TOKEN, sec_code="WEB")
    # The profile's read with the account's validation (a WEB debit's), its notifications of
    # change and blocks and the merchant's exposure limits (1), in the caller's transaction
    # without a savepoint; then the payment with its audit row, its outbox row and its
    # merchant's event (1). The fraud rules are off here: no exposure lock.
    with django_assert_num_queries(2):
        payment = payment_create(
            merchant_id="m-orig", amount=Decimal("1.00"), source_token=TOKEN, sec_code="WEB"
        )
    assert payment.entry_description == "ORIG SHOP"


# --- the rules, as a unit ----------------------------------------------------------------------


def test_the_description_rules_allow_payroll_only_on_a_payout():
    assert entry_description_problem("PAYROLL", entry="payout", sec_code="PPD") is None
    assert entry_description_problem("PAYROLL", entry="debit", sec_code="PPD") is not None
    assert entry_description_problem("PAYROLL") is not None  # a merchant's default
    assert entry_description_problem("RENT", entry="debit", sec_code="PPD") is None


# --- the profile and its audit -----------------------------------------------------------------


def test_a_profile_save_records_who_changed_what_once_per_change():
    admin_user = UserFactory(is_staff=True)
    _profile(codes=["PPD"])
    originator_profile_save(
        merchant_id="m-orig",
        values={"allowed_sec_codes": ["PPD", "WEB"], "company_name": "ORIG SHOP"},
        user=admin_user,
    )
    # The same values again: nothing changed, nothing recorded.
    originator_profile_save(
        merchant_id="m-orig", values={"allowed_sec_codes": ["PPD", "WEB"]}, user=admin_user
    )

    changes = list(OriginatorProfileChange.objects.filter(merchant_id="m-orig"))
    assert len(changes) == 2
    assert changes[0].changes["allowed_sec_codes"] == [None, ["PPD"]]
    assert changes[1].user == admin_user
    assert changes[1].changes == {"allowed_sec_codes": [["PPD"], ["PPD", "WEB"]]}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("company_name", "A" * 17),
        ("company_name", "lower case"),
        ("company_name", "NUL\x00"),
        ("company_identification", "12345678901"),
        ("company_identification", "12-345"),
        ("allowed_sec_codes", []),
        ("allowed_sec_codes", ["PPD", "PPD"]),
        ("allowed_sec_codes", ["TEL"]),
        ("allowed_sec_codes", "PPD"),
        ("default_entry_description", "RETRY PYMT"),
        ("default_entry_description", "PURCHASE"),
    ],
)
def test_a_profile_value_the_rules_refuse_is_refused_by_field_and_nothing_is_written(field, value):
    with pytest.raises(ValidationError) as raised:
        _profile(**{field: value})
    assert list(raised.value.message_dict) == [field]
    assert not OriginatorProfile.objects.exists()
    assert not OriginatorProfileChange.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_two_admins_saving_at_once_each_record_the_value_they_replaced():
    _profile(codes=["PPD"])
    barrier = threading.Barrier(2)
    errors = []

    def save(codes):
        try:
            barrier.wait()
            originator_profile_save(merchant_id="m-orig", values={"allowed_sec_codes": codes})
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=save, args=(c,)) for c in (["CCD"], ["WEB"])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    later = list(OriginatorProfileChange.objects.filter(merchant_id="m-orig").order_by("id")[1:])
    # The second writer saw the first one's value, not the value both read before: a chain.
    first, second = (c.changes["allowed_sec_codes"] for c in later)
    assert first[0] == ["PPD"] and second[0] == first[1]
    final = OriginatorProfile.objects.get(merchant_id="m-orig").allowed_sec_codes
    assert final == second[1]


# The read-only audit inline's management form, as the page posts it.
INLINE_EMPTY = {
    "changes-TOTAL_FORMS": "0",
    "changes-INITIAL_FORMS": "0",
    "changes-MIN_NUM_FORMS": "0",
    "changes-MAX_NUM_FORMS": "0",
}


def test_the_admin_creates_and_changes_a_profile_with_an_audit_row_each(client):
    admin_user = UserFactory(is_staff=True, is_superuser=True)
    client.force_login(admin_user)
    add = client.post(
        reverse("admin:payments_originatorprofile_add"),
        {
            "merchant_id": "m-orig",
            "company_name": "ORIG SHOP",
            "company_identification": "1999999999",
            "allowed_sec_codes": ["PPD", "WEB"],
            "default_entry_description": "",
            **INLINE_EMPTY,
        },
    )
    assert add.status_code == 302, add.content.decode()[:2000]
    profile = OriginatorProfile.objects.get(merchant_id="m-orig")

    change = client.post(
        reverse("admin:payments_originatorprofile_change", args=[profile.pk]),
        {
            "company_name": "ORIG SHOP NYC",
            "company_identification": "1999999999",
            "allowed_sec_codes": ["WEB"],
            "default_entry_description": "ORIG SHOP",
            **INLINE_EMPTY,
        },
    )
    assert change.status_code == 302, change.content.decode()[:2000]

    profile.refresh_from_db()
    assert (profile.company_name, profile.allowed_sec_codes) == ("ORIG SHOP NYC", ["WEB"])
    rows = list(OriginatorProfileChange.objects.filter(profile=profile))
    assert [r.user for r in rows] == [admin_user, admin_user]
    assert rows[1].changes == {
        "company_name": ["ORIG SHOP", "ORIG SHOP NYC"],
        "allowed_sec_codes": [["PPD", "WEB"], ["WEB"]],
        "default_entry_description": ["", "ORIG SHOP"],
    }
    page = client.get(reverse("admin:payments_originatorprofile_change", args=[profile.pk]))
    assert "ORIG SHOP NYC" in page.content.decode()


def test_the_admin_refuses_a_bad_value_with_its_reason_and_records_nothing(client):
    client.force_login(UserFactory(is_staff=True, is_superuser=True))
    response = client.post(
        reverse("admin:payments_originatorprofile_add"),
        {
            "merchant_id": "m-orig",
            "company_name": "orig shop",
            "company_identification": "1999999999",
            "allowed_sec_codes": ["PPD"],
            "default_entry_description": "REFUND",
            **INLINE_EMPTY,
        },
    )
    assert response.status_code == 200
    text = response.content.decode()
    assert "lower-case" in text and "reserve" in text
    assert not OriginatorProfile.objects.exists()


def test_the_audit_rows_are_read_only_in_the_admin(client):
    _profile()
    staff = UserFactory(is_staff=True, is_superuser=True)
    client.force_login(staff)
    row = OriginatorProfileChange.objects.get()
    url = reverse("admin:payments_originatorprofilechange_change", args=[row.pk])
    assert client.post(url, {"changes": "{}"}).status_code == 403
    delete = reverse("admin:payments_originatorprofilechange_delete", args=[row.pk])
    assert client.post(delete, {"post": "yes"}).status_code == 403
    assert OriginatorProfileChange.objects.filter(pk=row.pk).exists()


def test_a_staff_user_without_the_permission_cannot_change_a_profile(client):
    profile = _profile()
    client.force_login(UserFactory(is_staff=True))
    url = reverse("admin:payments_originatorprofile_change", args=[profile.pk])
    response = client.post(url, {"company_name": "HIJACK"})
    assert response.status_code == 403
    profile.refresh_from_db()
    assert profile.company_name == "ORIG SHOP"
