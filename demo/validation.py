"""The bank demo's account validation (NACHA's rule: a WEB debit's account is validated first).

The demo stands a validation service in for a host's bank-data API (``DemoValidationService``,
named by ``ACCOUNT_VALIDATION_SERVICE``): it answers every account open, with the check's id
as evidence. Before the debits, one WEB debit is tried on an account not validated yet (refused
409 ``account_not_validated``), then every WEB account is validated through
``POST /api/accounts/<token>/validation/``; the summary checks that no WEB debit left before
its account was validated (the chaos invariant's own check).

Prenotes (``prenotes_start``, ``prenotes_check``): two more WEB accounts are validated by a
prenote, a zero-dollar entry of the bank's next file. The sandbox bank answers the one whose
holder is ``NOACCOUNT ...`` with an R03, which fails its validation (a WEB debit from it is then
refused); the other comes back with nothing, and once the demo's calendar is moved past its
``live_from`` (as ``demo/bank_day.py`` moves it past an effective date) it is validated. The
demo refuses unvalidated WEB debits, so no debit is held on them here (the tests show a held
debit released, and one failed by the R03, once)."""

from __future__ import annotations

import time
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


# Holder names the sandbox bank answers by (sandbox/bank.py): nothing, and R03.
PRENOTES = {"Paying Prenote": "validated", "NOACCOUNT Prenote": "failed"}
NOT_STARTED = "not started"


def prenotes_start(web_url: str, token: str, merchant_id: str) -> dict[str, str]:
    """Vault one account per ``PRENOTES`` holder and start its prenote; token -> the state its
    validation must reach (``NOT_STARTED`` for one the API did not start)."""
    session = requests.Session()
    session.headers["Authorization"] = f"Token {token}"
    expected = {}
    for n, (holder, state) in enumerate(PRENOTES.items()):
        stored = session.post(
            f"{web_url}/api/vault/accounts/",
            json={
                "merchant_id": merchant_id,
                "routing_number": "021000021",
                "account_number": f"7700{n}{uuid.uuid4().int % 10**7:07d}",
                "account_type": "checking",
                "sec_code": "WEB",
                "holder_name": holder,
            },
            headers={"Idempotency-Key": str(uuid.uuid4())},
            timeout=30,
        )
        stored.raise_for_status()
        account_token = stored.json()["token"]
        started = session.post(
            f"{web_url}/api/accounts/{account_token}/validation/",
            json={"merchant_id": merchant_id, "method": "prenote"},
            timeout=30,
        )
        pending = started.status_code == 201 and started.json()["state"] == "pending"
        expected[account_token] = state if pending else NOT_STARTED
    return expected


def prenotes_check(expected: dict[str, str], timeout: float = 120) -> list[tuple[str, bool]]:
    """Wait for the prenotes' files to be answered and collected (the R03's validation failed),
    move the calendar past the other's ``live_from``, and check each validation's end."""
    from payments.models import AccountValidation
    from payments.services.validation import prenotes_mature

    rows = AccountValidation.objects.filter(account_token__in=list(expected))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        waiting = rows.filter(state="pending")
        returned = [t for t, s in expected.items() if s == "failed"]
        sent = waiting.filter(live_from__isnull=False).count() == waiting.count()
        if sent and not waiting.filter(account_token__in=returned).exists():
            break
        time.sleep(1)
    live_from = [v for v in rows.values_list("live_from", flat=True) if v is not None]
    if live_from:
        prenotes_mature(now=max(live_from))
    ended = dict(rows.values_list("account_token", "state"))
    reasons = dict(rows.values_list("account_token", "failure_reason"))
    returned_ok = all(
        ended.get(t) == "failed" and reasons.get(t) == "prenote returned R03"
        for t, s in expected.items()
        if s == "failed"
    )
    matured_ok = all(ended.get(t) == "validated" for t, s in expected.items() if s == "validated")
    started = sum(state != NOT_STARTED for state in expected.values())
    return [
        (
            f"prenotes started on the bank backend ({started} of {len(PRENOTES)})",
            started == len(PRENOTES),
        ),
        ("a prenote returned R03 failed its validation", returned_ok),
        ("a prenote with no answer validated its account from live_from", matured_ok),
    ]
