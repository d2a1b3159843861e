"""Notifications of change: the contract's fields, the record per payment and token, its
banking-day deadline, the debits it blocks, and the operator's closing of it."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import transaction
from django.utils import timezone

from payments.change_codes import CHANGE_CODES, NOC_DEADLINE_BANKING_DAYS, change_code_get
from payments.exceptions import AmountMismatch, EventConflict, InvalidCallback, NocPastDeadline
from payments.history import retention_delete
from payments.models import (
    AccountValidation,
    EventOutcome,
    LedgerEntry,
    NocAction,
    NocStatus,
    NotificationOfChange,
    PaymentEvent,
    PaymentState,
    ProcessedEvent,
)
from payments.processor.contract import processor_event_parse
from payments.selectors import nocs_due_count
from payments.services import (
    NocNoteRequired,
    NocNotOpen,
    noc_mark_applied,
    payment_apply_event,
    payment_create,
)
from payments.services.nocs import noc_deadline
from tests.factories import PaymentFactory, UserFactory, grant, processor_event
from triage.models import Alert

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("event_write_path")]

# Wednesday 2026-11-25: Thanksgiving (Thursday 26th) falls inside the 6 banking days.
RECEIVED = datetime(2026, 11, 25, 15, 0, tzinfo=UTC)


def _noc(payment, code="C01", data=None, **overrides):
    if data is None:
        row = change_code_get(code)
        data = {} if row.refused else {row.fields[0]: _SAMPLE[row.fields[0]]}
    return processor_event(
        payment,
        "notification_of_change",
        change_code=code,
        corrected_data=data,
        timestamp=overrides.pop("timestamp", RECEIVED),
        **overrides,
    )


_SAMPLE = {
    "account_number_last4": "6789",
    "routing_number_last4": "0021",
    "receiving_dfi_identification_last4": "0021",
    "transaction_code": "37",
    "individual_name": "JANE Q PUBLIC",
    "individual_identification_number": "CUST-42",
    "company_name": "EXAMPLE CO",
    "company_identification": "EXAMPLE01",
    "addenda_information": "CORRECTED",
    "sec_code": "PPD",
}


# --- the table and the deadline ----------------------------------------------------------------


def test_the_table_holds_c01_to_c14_and_the_refused_codes_c61_to_c69():
    assert [c for c in CHANGE_CODES if not CHANGE_CODES[c].refused] == [
        f"C{n:02d}" for n in range(1, 15)
    ]
    assert [c for c in CHANGE_CODES if CHANGE_CODES[c].refused] == [f"C{n}" for n in range(61, 70)]
    assert CHANGE_CODES["C01"].title == "Incorrect DFI Account Number"
    assert CHANGE_CODES["C01"].fields == ("account_number_last4", "source_token")


def test_the_deadline_is_six_banking_days_skipping_the_weekend_and_thanksgiving():
    # Wed 25th -> Fri 27, Mon 30, Tue 1, Wed 2, Thu 3, Fri 4 (Thu 26 is Thanksgiving).
    assert NOC_DEADLINE_BANKING_DAYS == 6
    assert noc_deadline(RECEIVED).date() == datetime(2026, 12, 4).date()
    assert noc_deadline(RECEIVED).hour == 23


# --- the contract ------------------------------------------------------------------------------


def _fields(**overrides) -> dict:
    body = {
        "payment_id": "7b0a4c7e-1d4f-4f8e-9d1a-0c2f3e4d5a6b",
        "event_type": "notification_of_change",
        "processor_event_id": "evt_noc_1",
        "amount": "10.00",
        "timestamp": "2026-11-25T15:00:00+00:00",
        "change_code": "C01",
        "corrected_data": {"account_number_last4": "6789"},
    }
    body.update(overrides)
    return {k: v for k, v in body.items() if v is not None}


def test_a_noc_parses_with_its_change_code_and_corrected_data_and_both_count_in_the_fingerprint():
    event = processor_event_parse(_fields())
    assert (event.change_code, event.corrected_data) == ("C01", {"account_number_last4": "6789"})
    other = processor_event_parse(_fields(corrected_data={"account_number_last4": "1111"}))
    assert event.fingerprint != other.fingerprint
    assert event.as_payload()["corrected_data"] == {"account_number_last4": "6789"}


@pytest.mark.parametrize(
    ("overrides", "field", "words"),
    [
        ({"change_code": None}, "change_code", "Required"),
        ({"change_code": 1}, "change_code", "string"),
        ({"change_code": "c01;drop"}, "change_code", "change code"),
        ({"corrected_data": None}, "corrected_data", "at least one"),
        ({"corrected_data": []}, "corrected_data", "JSON object"),
        ({"corrected_data": "6789"}, "corrected_data", "JSON object"),
        (
            {"corrected_data": {"account_number": "123456789"}},
            "corrected_data[account_number]",
            "not a corrected field",
        ),
        (
            {"corrected_data": {"account_number_last4": "123456789"}},
            "corrected_data[account_number_last4]",
            "4 digits",
        ),
        (
            {"corrected_data": {"account_number_last4": 6789}},
            "corrected_data[account_number_last4]",
            "JSON string",
        ),
        (
            {"corrected_data": {"account_number_last4": {"deep": "1"}}},
            "corrected_data[account_number_last4]",
            "JSON string",
        ),
        (
            {"corrected_data": {"account_number_last4": "67\x0089"}},
            "corrected_data[account_number_last4]",
            "4 digits",
        ),
        (
            {"change_code": "C04", "corrected_data": {"individual_name": "Jo\ud800"}},
            "corrected_data[individual_name]",
            "1-35",
        ),
        (
            {"change_code": "C04", "corrected_data": {"individual_name": "x" * 36}},
            "corrected_data[individual_name]",
            "1-35",
        ),
        (
            {"change_code": "C04", "corrected_data": {"individual_name": "JO 1234 5678"}},
            "corrected_data[individual_name]",
            "bank account",
        ),
        ({"corrected_data": {f"k{i}": "1" for i in range(50)}}, "corrected_data", "at most"),
        ({"corrected_data": {"x" * 41: "1"}}, "corrected_data", "1-40"),
        (
            {"change_code": "C61", "corrected_data": {"account_number_last4": "6789"}},
            "corrected_data[account_number_last4]",
            "refused NOC",
        ),
        (
            {"change_code": "C99", "corrected_data": {"\x00": "1"}},
            "corrected_data[(a key)]",
            "not a corrected field",
        ),
        ({"event_type": "settled"}, "change_code", "Only a notification_of_change"),
    ],
    ids=lambda value: str(value)[:40] if not isinstance(value, dict) else None,
)
def test_hostile_noc_fields_are_refused_naming_the_field(overrides, field, words):
    with pytest.raises(InvalidCallback) as refused:
        processor_event_parse(_fields(**overrides))
    errors = refused.value.errors
    assert field in errors, errors
    assert words in " ".join(errors[field])
    # A refused value is never quoted back.
    assert "123456789" not in str(errors)


def test_an_unknown_change_code_and_a_refused_one_without_data_are_taken():
    assert processor_event_parse(_fields(change_code="C15", corrected_data={})).change_code == "C15"
    assert processor_event_parse(_fields(change_code="C65", corrected_data={})).corrected_data == {}


# --- recording ---------------------------------------------------------------------------------


def test_a_noc_is_recorded_per_payment_and_token_and_moves_no_state_and_no_money():
    payment = PaymentFactory(state=PaymentState.CONFIRMED, source_token="tok_acct_0001")
    result = payment_apply_event(event=_noc(payment))

    assert result.outcome == "recorded" and not result.changed
    payment.refresh_from_db()
    assert payment.state == PaymentState.CONFIRMED
    assert not LedgerEntry.objects.filter(payment=payment).exists()
    noc = NotificationOfChange.objects.get(payment=payment)
    assert (noc.source_token, noc.merchant_id) == ("tok_acct_0001", payment.merchant_id)
    assert (noc.change_code, noc.change_title) == ("C01", "Incorrect DFI Account Number")
    assert noc.status == NocStatus.OPEN and not noc.unknown_code
    assert noc.deadline == noc_deadline(RECEIVED)
    assert noc.corrected_data == {"account_number_last4": "6789"}
    row = PaymentEvent.objects.get(payment=payment, event_type="notification_of_change")
    assert (row.outcome, row.from_state, row.to_state) == ("recorded", "confirmed", "confirmed")
    assert ProcessedEvent.objects.get(pk=row.processor_event_id).outcome == EventOutcome.RECORDED


def test_a_noc_delivered_twice_is_recorded_once_and_a_conflicting_resend_goes_to_a_human():
    payment = PaymentFactory(state=PaymentState.CONFIRMED)
    event = _noc(payment, processor_event_id="evt_noc_twice")

    assert payment_apply_event(event=event).outcome == "recorded"
    assert payment_apply_event(event=event).outcome == "duplicate"
    assert NotificationOfChange.objects.filter(payment=payment).count() == 1
    with pytest.raises(EventConflict):
        payment_apply_event(
            event=_noc(
                payment, data={"source_token": "tok_other_0001"}, processor_event_id="evt_noc_twice"
            )
        )
    assert NotificationOfChange.objects.filter(payment=payment).count() == 1


def test_a_noc_resent_after_its_dedup_record_was_purged_is_still_a_duplicate_or_a_conflict():
    payment = PaymentFactory(state=PaymentState.CONFIRMED)
    event = _noc(payment, processor_event_id="evt_noc_purged")
    payment_apply_event(event=event)
    with transaction.atomic(), retention_delete():  # as the retention purge does
        ProcessedEvent.objects.filter(pk="evt_noc_purged").delete()

    assert payment_apply_event(event=event).outcome == "duplicate"
    with pytest.raises(EventConflict):
        payment_apply_event(
            event=_noc(
                payment,
                data={"source_token": "tok_other_0001"},
                processor_event_id="evt_noc_purged",
            )
        )
    assert NotificationOfChange.objects.filter(payment=payment).count() == 1


def test_a_noc_restating_another_amount_is_refused_and_records_nothing():
    payment = PaymentFactory(state=PaymentState.CONFIRMED, amount=Decimal("10.00"))
    with pytest.raises(AmountMismatch):
        payment_apply_event(event=_noc(payment, amount=Decimal("11.00")))
    assert not NotificationOfChange.objects.exists()
    assert not ProcessedEvent.objects.exists()


def test_a_noc_for_a_payment_in_any_state_is_recorded_in_that_state():
    payment = PaymentFactory(state=PaymentState.RETURNED)
    assert payment_apply_event(event=_noc(payment)).to_state == PaymentState.RETURNED
    assert NotificationOfChange.objects.filter(payment=payment).exists()


def test_a_refused_noc_is_recorded_with_nothing_to_apply_and_blocks_nothing():
    payment = PaymentFactory(state=PaymentState.CONFIRMED, source_token="tok_refused_01")
    payment_apply_event(event=_noc(payment, "C65", timestamp=RECEIVED - timedelta(days=60)))
    noc = NotificationOfChange.objects.get(payment=payment)
    assert (noc.status, noc.deadline, noc.change_title) == (
        NocStatus.REFUSED,
        None,
        "Incorrectly Formatted Corrected Data",
    )
    assert payment_create(merchant_id="m-1", amount=Decimal("5.00"), source_token="tok_refused_01")


def test_an_unknown_change_code_is_recorded_open_flagged_and_alerted(
    django_capture_on_commit_callbacks,
):
    payment = PaymentFactory(state=PaymentState.CONFIRMED)
    with django_capture_on_commit_callbacks(execute=True):
        payment_apply_event(event=_noc(payment, "C42", data={"account_number_last4": "1234"}))
    noc = NotificationOfChange.objects.get(payment=payment)
    assert noc.unknown_code and noc.status == NocStatus.OPEN and noc.change_title == ""
    alert = Alert.objects.get(key=f"payment.noc_unknown_code:{payment.id}")
    assert "C42" in alert.summary and "1234" not in alert.summary


# --- the debits it blocks ------------------------------------------------------------------------


def _open_noc(token: str, *, deadline_passed: bool) -> NotificationOfChange:
    payment = PaymentFactory(state=PaymentState.CONFIRMED, source_token=token)
    when = timezone.now() - timedelta(days=30 if deadline_passed else 0)
    payment_apply_event(event=_noc(payment, timestamp=when))
    return NotificationOfChange.objects.get(payment=payment)


def test_a_debit_on_a_token_with_an_open_noc_past_its_deadline_is_refused_naming_it():
    noc = _open_noc("tok_overdue_01", deadline_passed=True)
    with pytest.raises(NocPastDeadline) as refused:
        payment_create(merchant_id="m-1", amount=Decimal("5.00"), source_token="tok_overdue_01")
    assert refused.value.noc_id == noc.id and refused.value.change_code == "C01"
    assert str(noc.id) in str(refused.value) and "6789" not in str(refused.value)


def test_the_api_refuses_it_with_409_in_the_envelope_without_the_corrected_data(api_client, user):
    grant(user, "m-api")
    noc = _open_noc("tok_overdue_02", deadline_passed=True)
    response = api_client.post(
        "/api/payments/",
        {"merchant_id": "m-api", "amount": "5.00", "source_token": "tok_overdue_02"},
        format="json",
        headers={"Idempotency-Key": "noc-409"},
    )
    assert response.status_code == 409
    error = response.json()["error"]
    assert error["code"] == "notification_of_change_past_deadline"
    assert error["param"] == "source_token"
    assert f"notification of change {noc.id} (C01)" in error["message"]
    assert "6789" not in response.content.decode()
    assert error["request_id"] == response["Request-Id"]

    # Once applied, the same request with the same key executes (the refusal was not stored).
    noc_mark_applied(noc_id=noc.id, user=UserFactory(), note="updated the token at the processor")
    again = api_client.post(
        "/api/payments/",
        {"merchant_id": "m-api", "amount": "5.00", "source_token": "tok_overdue_02"},
        format="json",
        headers={"Idempotency-Key": "noc-409"},
    )
    assert again.status_code == 201
    assert "warnings" not in again.json()


def test_before_the_deadline_the_create_succeeds_and_warns_without_the_corrected_data(
    api_client, user
):
    grant(user, "m-api")
    noc = _open_noc("tok_within_01", deadline_passed=False)
    response = api_client.post(
        "/api/payments/",
        {"merchant_id": "m-api", "amount": "5.00", "source_token": "tok_within_01"},
        format="json",
    )
    assert response.status_code == 201
    [warning] = response.json()["warnings"]
    assert warning["noc_id"] == noc.id and warning["change_code"] == "C01"
    assert warning["code"] == "notification_of_change_open"
    assert warning["deadline"] == noc.deadline.isoformat()
    assert "6789" not in response.content.decode()


# --- closing it ----------------------------------------------------------------------------------


def test_marking_a_noc_applied_needs_a_note_writes_an_audit_row_and_only_once():
    noc = _open_noc("tok_close_001", deadline_passed=True)
    operator = UserFactory()
    with pytest.raises(NocNoteRequired):
        noc_mark_applied(noc_id=noc.id, user=operator, note="  ")
    noc_mark_applied(noc_id=noc.id, user=operator, note="token updated, ticket OPS-1")
    noc.refresh_from_db()
    assert noc.status == NocStatus.APPLIED and noc.applied_by == operator
    action = NocAction.objects.get(noc=noc)
    assert (action.status_before, action.status_after, action.note) == (
        "open",
        "applied",
        "token updated, ticket OPS-1",
    )
    with pytest.raises(NocNotOpen):
        noc_mark_applied(noc_id=noc.id, user=operator, note="again")
    assert NocAction.objects.filter(noc=noc).count() == 1


def test_the_due_count_holds_open_nocs_due_in_the_next_two_banking_days():
    now = datetime(2026, 11, 25, 15, 0, tzinfo=UTC)  # Wednesday before Thanksgiving
    due_soon = _open_noc("tok_due_00001", deadline_passed=False)
    later = _open_noc("tok_due_00002", deadline_passed=False)
    overdue = _open_noc("tok_due_00003", deadline_passed=False)
    # Two banking days after Wed 25th: Fri 27th and Mon 30th (Thanksgiving skipped).
    NotificationOfChange.objects.filter(pk=due_soon.pk).update(
        deadline=datetime(2026, 11, 30, 23, 0, tzinfo=UTC)
    )
    NotificationOfChange.objects.filter(pk=later.pk).update(
        deadline=datetime(2026, 12, 1, 23, 0, tzinfo=UTC)
    )
    NotificationOfChange.objects.filter(pk=overdue.pk).update(
        deadline=datetime(2026, 11, 24, 23, 0, tzinfo=UTC)
    )
    assert nocs_due_count(now=now) == {"due_soon": 1, "overdue": 1, "open": 3}


def test_a_backend_s_own_raw_is_kept_with_its_bank_numbers_masked_too():
    # A backend that maps another processor's body onto the contract may keep that body.
    event = processor_event_parse(
        _fields(), raw={"transfer": {"account": "77668056869313516", "fee_cents": 125}}
    )
    assert event.raw == {"transfer": {"account": "****3516", "fee_cents": 125}}


# --- a prenote's NOC (no payment: the account's validation) --------------------------------------


def _prenote_noc(code: str, *, event_id: str = "ach.021000020000009.X", data=None):
    from payments.services.nocs import noc_record_of_prenote

    validation, _ = AccountValidation.objects.get_or_create(
        account_token="vtok_prenote_noc_01", merchant_id="m-1"
    )
    return noc_record_of_prenote(
        validation=validation,
        processor_event_id=event_id,
        change_code=code,
        corrected_data=data or {},
        received_at=RECEIVED,
    )


def test_a_prenotes_noc_is_kept_for_its_validation_with_its_deadline_and_once_per_id():
    noc, created = _prenote_noc("C01", data={"account_number_last4": "6789"})
    again, created_again = _prenote_noc("C01", data={"account_number_last4": "6789"})

    assert (created, created_again) == (True, False) and again.pk == noc.pk
    assert NotificationOfChange.objects.count() == 1
    assert noc.payment is None and noc.account_validation.account_token == noc.source_token
    assert noc.deadline == noc_deadline(RECEIVED) and noc.status == NocStatus.OPEN
    assert "prenote of validation" in str(noc)


def test_a_refused_noc_of_a_prenote_is_recorded_with_nothing_to_apply():
    noc, _ = _prenote_noc("C61")

    assert (noc.status, noc.deadline) == (NocStatus.REFUSED, None)
    validation = AccountValidation.objects.get(account_token="vtok_prenote_noc_01")
    assert "nocs" not in validation.evidence


def test_an_unknown_change_code_of_a_prenote_is_recorded_open_flagged_and_alerted(
    django_capture_on_commit_callbacks,
):
    with django_capture_on_commit_callbacks(execute=True):
        noc, _ = _prenote_noc("C42", data={"account_number_last4": "1234"})

    assert noc.unknown_code and noc.status == NocStatus.OPEN
    alert = Alert.objects.get(
        key=f"payment.noc_unknown_code:validation-{noc.account_validation_id}"
    )
    assert "prenote of account vtok_prenote_noc_01" in alert.summary
    assert "C42" in alert.summary and "1234" not in alert.summary and alert.payment_id is None


def test_a_noc_names_a_payment_or_a_validation_never_both_nor_neither():
    from django.db import IntegrityError

    payment = PaymentFactory(state=PaymentState.CONFIRMED)
    validation = AccountValidation.objects.create(account_token="vtok_both_01", merchant_id="m-1")
    fields = {
        "merchant_id": "m-1",
        "source_token": "vtok_both_01",
        "change_code": "C01",
        "status": NocStatus.OPEN,
        "received_at": RECEIVED,
    }
    for n, owners in enumerate(
        [{"payment": payment, "account_validation": validation}, {}], start=1
    ):
        with pytest.raises(IntegrityError), transaction.atomic():
            NotificationOfChange.objects.create(processor_event_id=f"both-{n}", **fields, **owners)
