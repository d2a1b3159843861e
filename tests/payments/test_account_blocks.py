"""Accounts a return blocks: an R17 return the bank marked QUESTIONABLE blocks the account's
debits for every merchant with a high alert; an unauthorized return blocks it for the merchant;
a debit from a blocked account is refused (409 ``account_blocked``); only a person with the
permission clears a block, with a note the row keeps."""

from decimal import Decimal

import pytest
from django.contrib.auth.models import Permission
from django.core.exceptions import PermissionDenied, ValidationError
from django.utils import timezone

from payments.exceptions import AccountBlocked, ReinitiationRefused
from payments.models import AccountBlock, Payment, PaymentState
from payments.services import payment_apply_event, payment_create, payment_reinitiate
from payments.services.fraud import account_block_clear, questionable
from payments.signals import alert_raised
from tests.factories import PaymentFactory, UserFactory, grant, processor_event

pytestmark = pytest.mark.django_db

TOKEN = "tok_blocked_acct_01"


@pytest.fixture
def alerts():
    calls = []

    def receiver(sender, **kwargs):
        calls.append(kwargs)

    alert_raised.connect(receiver, weak=False)
    yield calls
    alert_raised.disconnect(receiver)


def _returned(merchant: str, code: str, message: str = "", **fields) -> Payment:
    debit = PaymentFactory(
        merchant_id=merchant, state=PaymentState.SUBMITTED, source_token=TOKEN, **fields
    )
    payment_apply_event(event=processor_event(debit, "settled"))
    event = processor_event(
        debit, "returned", reason_code=code, message=message, timestamp=timezone.now()
    )
    payment_apply_event(event=event)
    return debit


def _debit(merchant: str, token: str = TOKEN) -> Payment:
    return payment_create(merchant_id=merchant, amount=Decimal("10.00"), source_token=token)


def _clearer():
    user = UserFactory(is_staff=True, username="risk-officer")
    user.user_permissions.add(Permission.objects.get(codename="clear_account_block"))
    return type(user).objects.get(pk=user.pk)


def test_an_r17_questionable_return_blocks_the_account_for_every_merchant_with_a_high_alert(
    alerts, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        returned = _returned("acme", "R17", "ACH return R17, bank trace 1: QUESTIONABLE")

    block = AccountBlock.objects.get()
    assert (block.scope, block.return_code, block.payment_id) == ("all", "R17", returned.id)
    [alert] = [a for a in alerts if a["key"].startswith("payments.account_blocked:")]
    assert alert["severity"] == "high"
    assert TOKEN in alert["summary"] and "every merchant" in alert["summary"]
    for merchant in ("acme", "other"):
        with pytest.raises(AccountBlocked) as refused:
            _debit(merchant)
        assert refused.value.return_code == "R17"
    assert not Payment.objects.filter(merchant_id="other").exists()


def test_an_r17_without_questionable_blocks_nothing():
    _returned("acme", "R17", "ACH return R17, bank trace 1")

    assert not AccountBlock.objects.exists()
    assert _debit("acme").state == "pending"


@pytest.mark.parametrize(
    "event", [{"message": "questionable"}, {"addenda_information": "QUESTIONABLE"}]
)
def test_questionable_is_read_from_the_message_or_the_addenda_in_any_case(event):
    debit = PaymentFactory()

    assert questionable(processor_event(debit, "returned", reason_code="R17", **event))
    assert not questionable(processor_event(debit, "returned", reason_code="R03", **event))


@pytest.mark.parametrize("code", ["R05", "R07", "R10", "R11", "R29", "R51"])
def test_an_unauthorized_return_blocks_the_account_for_that_merchant_only(code):
    _returned("acme", code)

    with pytest.raises(AccountBlocked):
        _debit("acme")
    assert _debit("other").state == "pending"
    assert _debit("acme", token="tok_another_acct_1").state == "pending"
    assert AccountBlock.objects.get().scope == "merchant"


@pytest.mark.parametrize("code", ["R01", "R02", "R03", "R09"])
def test_other_returns_block_nothing(code):
    _returned("acme", code)

    assert not AccountBlock.objects.exists()


def test_a_second_unauthorized_return_of_a_blocked_account_keeps_one_open_block():
    _returned("acme", "R10")
    _returned("acme", "R07")

    assert AccountBlock.objects.filter(cleared_at__isnull=True).count() == 1


def test_a_returned_payout_blocks_nothing(module_settings):
    payout = PaymentFactory(
        merchant_id="acme",
        state=PaymentState.CONFIRMED,
        source_token=TOKEN,
        direction="credit",
        purpose="payout",
    )
    event = processor_event(
        payout, "returned", reason_code="R10", direction="credit", timestamp=timezone.now()
    )

    payment_apply_event(event=event)

    assert not AccountBlock.objects.exists()


def test_a_debit_from_a_blocked_account_answers_409_and_releases_the_key(api_client, user):
    grant(user, "acme")
    _returned("acme", "R10")
    body = {"merchant_id": "acme", "amount": "10.00", "source_token": TOKEN}

    refused = api_client.post("/api/payments/", body, format="json", HTTP_IDEMPOTENCY_KEY="b-1")
    block = AccountBlock.objects.get()
    account_block_clear(block_id=block.id, user=_clearer(), note="customer re-authorized")
    again = api_client.post("/api/payments/", body, format="json", HTTP_IDEMPOTENCY_KEY="b-1")

    assert refused.status_code == 409, refused.json()
    error = refused.json()["error"]
    assert (error["code"], error["param"]) == ("account_blocked", "source_token")
    assert "R10" in error["message"]
    assert again.status_code == 201, again.json()


def test_a_reinitiation_under_a_new_authorization_passes_the_merchants_own_block():
    original = _returned("acme", "R10")

    again = payment_reinitiate(payment_id=original.id, authorization_reference="auth-2026-12")

    assert again.reinitiation_of_id == original.id


def test_a_reinitiation_never_passes_a_questionable_block():
    _returned("other", "R17", "QUESTIONABLE")
    original = _returned("acme", "R10")

    with pytest.raises(ReinitiationRefused) as refused:
        payment_reinitiate(payment_id=original.id, authorization_reference="auth-2026-12")

    assert refused.value.rule == "account_blocked"


def test_clearing_needs_the_permission_and_a_note_and_happens_once():
    _returned("acme", "R10")
    block = AccountBlock.objects.get()
    clearer = _clearer()

    with pytest.raises(PermissionDenied):
        account_block_clear(block_id=block.id, user=UserFactory(is_staff=True), note="ok")
    for note in ("", "  ", "a\x00b"):
        with pytest.raises(ValidationError) as refused:
            account_block_clear(block_id=block.id, user=clearer, note=note)
        assert "note" in refused.value.message_dict
    account_block_clear(block_id=block.id, user=clearer, note="customer confirmed by phone")
    with pytest.raises(ValidationError) as twice:
        account_block_clear(block_id=block.id, user=clearer, note="again")
    with pytest.raises(ValidationError) as unknown:
        account_block_clear(block_id=block.id + 999, user=clearer, note="x")

    block.refresh_from_db()
    assert (block.cleared_by, block.note) == (clearer, "customer confirmed by phone")
    assert "cleared already" in twice.value.message_dict["block"][0]
    assert "no account block" in unknown.value.message_dict["block"][0]
    assert _debit("acme").state == "pending"


def _clear_url(block) -> str:
    return f"/admin/payments/accountblock/{block.pk}/clear/"


def test_the_admin_clears_a_block_with_a_note_for_a_user_with_the_permission(client):
    _returned("acme", "R10")
    block = AccountBlock.objects.get()
    client.force_login(UserFactory(is_staff=True))
    denied = client.post(_clear_url(block), {"note": "ok"})
    client.force_login(_clearer())

    page = client.get(_clear_url(block))
    no_note = client.post(_clear_url(block), {"note": ""})
    cleared = client.post(_clear_url(block), {"note": "re-authorized, ticket 42"})
    again = client.post(_clear_url(block), {"note": "again"})
    listed = client.get("/admin/payments/accountblock/")
    change = client.get(f"/admin/payments/accountblock/{block.pk}/change/")

    assert denied.status_code == 403
    assert page.status_code == 200 and TOKEN.encode() in page.content
    assert no_note.status_code == 200 and b"This field is required" in no_note.content
    assert cleared.status_code == 302
    assert again.status_code == 200 and b"cleared already" in again.content
    assert listed.status_code == 200 and change.status_code == 200
    block.refresh_from_db()
    assert (block.note, block.cleared_by.username) == ("re-authorized, ticket 42", "risk-officer")


def test_the_clear_page_refuses_a_forged_post_and_an_unknown_block():
    from django.test import Client

    _returned("acme", "R10")
    block = AccountBlock.objects.get()
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(_clearer())

    forged = strict.post(_clear_url(block), {"note": "ok"})
    unknown = strict.get("/admin/payments/accountblock/999999/clear/")

    assert forged.status_code == 403
    assert unknown.status_code == 404
    block.refresh_from_db()
    assert block.cleared_at is None


def test_a_block_is_never_added_changed_or_deleted_in_the_admin(client):
    _returned("acme", "R10")
    block = AccountBlock.objects.get()
    superuser = UserFactory(is_staff=True, is_superuser=True)
    client.force_login(superuser)

    add = client.get("/admin/payments/accountblock/add/")
    delete = client.post(f"/admin/payments/accountblock/{block.pk}/delete/", {"post": "yes"})
    change = client.post(f"/admin/payments/accountblock/{block.pk}/change/", {"note": "x"})

    assert add.status_code == 403
    assert delete.status_code == 403
    assert change.status_code == 403
    assert AccountBlock.objects.filter(pk=block.pk, note="").exists()
