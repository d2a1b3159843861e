"""The sandbox's token rules for notifications of change and a return on the first debit only."""

import pytest

from payments.processor.contract import processor_event_parse
from sandbox.faults import FaultConfig, FaultPlan
from sandbox.server import noc_corrected_data


@pytest.mark.parametrize(
    ("token", "code"),
    [
        ("tok_noc_abc_0001", "C01"),
        ("tok_noc_C05_0001", "C05"),
        ("tok_noc_C61_0001", "C61"),
        ("tok_noc_C42_0001", "C42"),
        ("tok_ok_000000001", None),
    ],
)
def test_a_noc_token_names_the_change_code_sent_after_settlement(token, code):
    assert FaultPlan(FaultConfig()).settled_change_code(token) == code


@pytest.mark.parametrize("code", ["C01", "C03", "C07", "C13", "C14", "C61", "C69", "C42"])
def test_the_corrected_data_the_sandbox_sends_passes_the_contract(code):
    event = processor_event_parse(
        {
            "payment_id": "7b0a4c7e-1d4f-4f8e-9d1a-0c2f3e4d5a6b",
            "event_type": "notification_of_change",
            "processor_event_id": "evt_1",
            "amount": "1.00",
            "timestamp": "2026-11-02T12:00:00+00:00",
            "change_code": code,
            "corrected_data": noc_corrected_data(code),
        }
    )
    assert event.change_code == code


def test_nsfonce_returns_the_tokens_first_debit_only():
    plan = FaultPlan(FaultConfig())
    assert plan.settled_return_code("tok_nsfonce_0001", first_debit=True) == "R01"
    assert plan.settled_return_code("tok_nsfonce_0001", first_debit=False) is None
    assert plan.settled_return_code("tok_nsf_00000001", first_debit=False) == "R01"
