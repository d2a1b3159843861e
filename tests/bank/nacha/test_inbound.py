"""What a NOC's corrected data becomes in its event: fields by name, and for an account or
routing number a vault token, never the number."""

import pytest

from bank.nacha.inbound import _corrected_data, event_type_of
from payments.change_codes import corrected_data_problems


@pytest.mark.parametrize(
    ("code", "event_type"),
    [
        ("R01", "returned"),
        ("R10", "returned"),
        ("R61", "return_dishonored"),
        ("R69", "return_dishonored"),
        ("R71", "dishonor_contested"),
        ("R77", "dishonor_contested"),
        ("R80", "returned"),
        ("C01", "notification_of_change"),
        ("C61", "notification_of_change"),
    ],
)
def test_each_code_maps_to_its_event_type(code, event_type):
    assert event_type_of(code) == event_type


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("code", "text", "expected"),
    [
        ("C01", "98765432100", {"account_number_last4": "2100"}),
        ("C02", "011000015", {"routing_number_last4": "0015"}),
        (
            "C03",
            "011000015   98765432100",
            {"routing_number_last4": "0015", "account_number_last4": "2100"},
        ),
        ("C05", "32", {"transaction_code": "32", "account_type": "savings"}),
        # A general-ledger transaction code: an account type the contract does not take is
        # left out, the code kept.
        ("C05", "42", {"transaction_code": "42"}),
        (
            "C06",
            "98765432100         37",
            {"account_number_last4": "2100", "transaction_code": "37", "account_type": "savings"},
        ),
        ("C09", "CUST-0009", {"individual_identification_number": "CUST-0009"}),
        # An identification number that reads as a bank number is never carried.
        ("C09", "123456789", {}),
        ("C13", "BAD ADDENDA", {"addenda_information": "BAD ADDENDA"}),
        # A refused or unknown code carries nothing: the NOC is recorded and flagged.
        ("C61", "12345678901234", {}),
        ("C99", "something else", {}),
    ],
    ids=[
        "C01",
        "C02",
        "C03",
        "C05",
        "C05-ledger",
        "C06",
        "C09",
        "C09-digits",
        "C13",
        "refused",
        "unknown",
    ],
)
def test_corrected_data_by_code_for_a_token_the_vault_does_not_hold(code, text, expected):
    data = _corrected_data(code, text.ljust(29), "tok_from_a_processor")
    assert data == expected
    # What the worker will accept: the callback contract's own check of a NOC's data.
    assert corrected_data_problems(code, data) == {}
    assert "98765432100" not in str(data) and "011000015" not in str(data)
