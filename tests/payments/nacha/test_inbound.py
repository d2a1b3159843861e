"""What a NOC's corrected data becomes in its event: fields by name, and for an account or
routing number a vault token, never the number."""

import pytest

from payments.nacha.inbound import _corrected_data, event_type_of


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
        ("C01", "98765432100", {"account_last4": "2100", "vaulted": False}),
        ("C02", "011000015", {"vaulted": False}),
        ("C03", "011000015   98765432100", {"account_last4": "2100", "vaulted": False}),
        ("C05", "32", {"transaction_code": "32", "account_type": "savings"}),
        (
            "C06",
            "98765432100         37",
            {
                "account_last4": "2100",
                "vaulted": False,
                "transaction_code": "37",
                "account_type": "savings",
            },
        ),
        ("C09", "CUST-0009", {"individual_identification_number": "CUST-0009"}),
        ("C99", "12345678901234", {"text": "****1234"}),
        ("C99", "something else", {"text": "something else"}),
    ],
    ids=["C01", "C02", "C03", "C05", "C06", "C09", "unknown-number", "unknown-text"],
)
def test_corrected_data_by_code_for_a_token_the_vault_does_not_hold(code, text, expected):
    data = _corrected_data(code, text.ljust(29), "tok_from_a_processor")
    assert data == expected
    assert "98765432100" not in str(data) and "011000015" not in str(data)
