"""The bank demo's account validation (NACHA's rule: a WEB debit's account is validated first).

The demo stands a validation service in for a host's bank-data API (``DemoValidationService``,
named by ``ACCOUNT_VALIDATION_SERVICE``): it answers every account open, with the check's id
as evidence. Before the debits, one WEB debit is tried on an account not validated yet (refused
409 ``account_not_validated``), then every WEB account is validated through
``POST /api/accounts/<token>/validation/``; the summary checks that no WEB debit left before
its account was validated (the chaos invariant's own check)."""

from __future__ import annotations

import uuid

import requests

from payments.validation_methods import Outcome, ValidationService

SERVICE = "demo.validation.DemoValidationService"


class DemoValidationService(ValidationService):
    def validate(self, *, account_token: str, merchant_id: str) -> Outcome:
        return Outcome(True, evidence={"check_id": f"demo_{uuid.uuid4().hex[:12]}"})


def web_accounts_validate(web_url: str, token: str, accounts: list) -> tuple[bool, int]:
    """Try one WEB debit before its account is validated (it must be refused), then validate
    every WEB account; (the refusal was 409 account_not_validated, accounts validated)."""
    session = requests.Session()
    session.headers["Authorization"] = f"Token {token}"
    web = [a for a in accounts if a.body["sec_code"] == "WEB"]
    refused = True
    if web:
        first = web[0]
        answer = session.post(
            f"{web_url}/api/payments/",
            json={
                "merchant_id": first.body["merchant_id"],
                "amount": "1.00",
                "source_token": first.token,
            },
            timeout=30,
        )
        refused = (
            answer.status_code == 409 and answer.json()["error"]["code"] == "account_not_validated"
        )
    validated = 0
    for account in web:
        answer = session.post(
            f"{web_url}/api/accounts/{account.token}/validation/",
            json={"merchant_id": account.body["merchant_id"], "method": "service"},
            timeout=30,
        )
        validated += answer.status_code == 201 and answer.json()["state"] == "validated"
    return refused, validated


def web_debits_validated_first() -> tuple[str, bool]:
    """The chaos invariant's check over the demo's database: its row and whether it held."""
    from chaos.invariants.report import Report
    from chaos.invariants.validation import check_web_debits_validated_first

    report = Report()
    check_web_debits_validated_first(report)
    left = report.checked["web_debits_validated_first"]["debits that left"]
    return f"WEB debits sent, each after its account's validation: {left}", report.ok
