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
debit released, and one failed by the R03, once).

Micro-entries (``micro_entries_run``, ``micro_entries_checks``): the processor demo's section,
described where it starts below."""

from __future__ import annotations

import secrets
import string
import time
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal

import requests

from demo.validation_settings import ENVIRONMENT  # noqa: F401 - the runner's and tests' name
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


# --- micro-entries on the processor backend ----------------------------------------------------
#
# The processor demo holds a WEB debit from an account not validated yet
# (``UNVALIDATED_WEB_DEBITS=hold``) and validates two accounts by micro-entries at the sandbox
# processor, reading their amounts from the sandbox's statement of the account, as the holder
# reads them from theirs. One is verified after one wrong try: the debit held on it goes out,
# once. The other is left to expire: its ``expires_at`` is moved into the past (a demo script on
# the product's database) and the periodic round that ends validations
# (``payments.tasks.account_validations_advance``, beat's task) fails it and the debit held on
# it, once; a WEB debit from it afterwards is refused 409 ``account_not_validated``. Only the
# public API creates, verifies and reads; the database is read for what the API does not show
# (the held debit's failure events, counted).

# The processor demo's setting for it (demo/run.py): a WEB debit from an account not validated
# is created held, not refused (the bank demo keeps the default, and shows the refusal first).
MICRO_MERCHANT = "merchant-validation"
MICRO_ENTRY_DESCRIPTION = "ACCTVERIFY"
EXPIRED_REASON = "the micro-entries expired unverified"


@dataclass
class MicroStory:
    """What the section saw, by the API's answers: ``(status, code or state)`` pairs."""

    verified_token: str = ""
    expired_token: str = ""
    held: dict[str, dict] = field(default_factory=dict)  # token -> the held debit's answer
    started: dict[str, tuple[int, str]] = field(default_factory=dict)
    amounts: dict[str, list[str]] = field(default_factory=dict)
    wrong_try: tuple[int, str] = (0, "")
    attempts_left: int | None = None
    verified: tuple[int, str] = (0, "")
    released_state: str = ""
    round_ended: int = 0
    round_again: int = 0  # what a second round ended: nothing
    expired: tuple[str, str] = ("", "")  # (state, failure_reason) after the round
    expired_debit_state: str = ""
    expired_debit_failures: int = 0
    verify_after_expiry: tuple[int, str] = (0, "")
    refused: tuple[int, str] = (0, "")


def _letters(n: int = 8) -> str:
    # Letters only: a token with a long run of digits reads as a bank number, and is refused.
    return "".join(secrets.choice(string.ascii_lowercase) for _ in range(n))


class _Api:
    def __init__(self, web_url: str, token: str) -> None:
        self.web_url = web_url
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Token {token}"

    def call(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        headers = {"Idempotency-Key": str(uuid.uuid4())} if method == "POST" else {}
        for _ in range(5):
            response = self.session.request(
                method, f"{self.web_url}/api/{path}", json=body, headers=headers, timeout=30
            )
            if response.status_code not in (429, 503):
                break
            time.sleep(1)
        return response.status_code, response.json()

    def web_debit(self, merchant_id: str, account_token: str) -> tuple[int, dict]:
        return self.call(
            "POST",
            "payments/",
            {
                "merchant_id": merchant_id,
                "amount": "20.00",
                "currency": "USD",
                "source_token": account_token,
                "sec_code": "WEB",
                "description": "demo micro",
            },
        )


def _code(status: int, body: dict) -> str:
    error = body.get("error")
    return error.get("code", "") if isinstance(error, dict) else body.get("state", "")


def statement_micro_credits(sandbox_url: str, account_token: str, timeout: float) -> list[str]:
    """The micro-entry credits (``ACCTVERIFY``, under $1.00) the account's statement at the
    sandbox shows, waiting up to ``timeout`` for two: sent at the start, or by the queue."""
    deadline = time.monotonic() + timeout
    while True:
        answer = requests.get(
            f"{sandbox_url}/_sandbox/statement", params={"token": account_token}, timeout=10
        )
        answer.raise_for_status()
        credits = [
            e["amount"]
            for e in answer.json()["entries"]
            if e["direction"] == "credit"
            and e["company_entry_description"] == MICRO_ENTRY_DESCRIPTION
            and Decimal(e["amount"]) < 1
        ]
        if len(credits) >= 2 or time.monotonic() > deadline:
            return credits
        time.sleep(0.5)


def wrong_amounts(amounts: list[str]) -> list[str]:
    """The amounts with the first one a cent off (0.99 becomes 0.02): a try that must fail."""
    first = Decimal(amounts[0])
    return [f"{(first % Decimal('0.98')) + Decimal('0.01'):.2f}", *amounts[1:]]


def micro_entries_setup(client_username: str, merchant_id: str = MICRO_MERCHANT) -> None:
    """Grant the demo's API client the section's merchant."""
    from django.contrib.auth import get_user_model

    from payments.models import MerchantAccess

    client = get_user_model().objects.get(username=client_username)
    MerchantAccess.objects.get_or_create(user=client, merchant_id=merchant_id)


def micro_entries_run(
    *,
    web_url: str,
    token: str,
    sandbox_url: str,
    merchant_id: str = MICRO_MERCHANT,
    timeout: float = 60,
) -> MicroStory:
    """The section's story (see above): two accounts, a WEB debit held on each, micro-entries
    started on both; one verified after a wrong try, the other expired by the periodic round."""
    from django.utils import timezone

    from payments.models import AccountValidation
    from payments.tasks import account_validations_advance

    api = _Api(web_url, token)
    suffix = _letters()
    # Steady tokens: the sandbox's random faults never refuse their sends (a refused
    # micro-entry credit fails its validation) nor return the released debit
    # (sandbox/faults.py).
    story = MicroStory(
        verified_token=f"tok_steady_microok_{suffix}",
        expired_token=f"tok_steady_microexp_{suffix}",
    )
    tokens = (story.verified_token, story.expired_token)
    for account in tokens:
        _, story.held[account] = api.web_debit(merchant_id, account)
        status, body = api.call(
            "POST",
            f"accounts/{account}/validation/",
            {"merchant_id": merchant_id, "method": "micro_entries"},
        )
        story.started[account] = (status, _code(status, body))
        story.amounts[account] = statement_micro_credits(sandbox_url, account, timeout)

    verified, amounts = story.verified_token, story.amounts[story.verified_token]
    if len(amounts) == 2:
        status, body = api.call(
            "POST", f"accounts/{verified}/verify/", {"amounts": wrong_amounts(amounts)}
        )
        story.wrong_try = (status, _code(status, body))
        story.attempts_left = api.call("GET", f"accounts/{verified}/validation/")[1].get(
            "attempts_left"
        )
        status, body = api.call("POST", f"accounts/{verified}/verify/", {"amounts": amounts})
        story.verified = (status, _code(status, body))
    story.released_state = _state_after(api, story.held[verified].get("id"), timeout)

    expired = story.expired_token
    AccountValidation.objects.filter(account_token=expired, state="pending").update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    # The round beat runs (its task, called here): twice, the second ending nothing again.
    story.round_ended = account_validations_advance()
    story.round_again = account_validations_advance()
    shown = api.call("GET", f"accounts/{expired}/validation/")[1]
    story.expired = (shown.get("state", ""), shown.get("failure_reason", ""))
    held_id = story.held[expired].get("id")
    story.expired_debit_state = api.call("GET", f"payments/{held_id}/")[1].get("state", "")
    story.expired_debit_failures = _failures(held_id)
    if story.amounts[expired]:
        status, body = api.call(
            "POST", f"accounts/{expired}/verify/", {"amounts": story.amounts[expired]}
        )
        story.verify_after_expiry = (status, _code(status, body))
    status, body = api.web_debit(merchant_id, expired)
    story.refused = (status, _code(status, body))
    return story


def _state_after(api: _Api, payment_id: str | None, timeout: float) -> str:
    """The payment's state once it left ``pending`` (released and submitted), or ``pending``."""
    if not payment_id:
        return ""
    deadline = time.monotonic() + timeout
    while True:
        state = api.call("GET", f"payments/{payment_id}/")[1].get("state", "")
        if state != "pending" or time.monotonic() > deadline:
            return state
        time.sleep(0.5)


def _failures(payment_id: str | None) -> int:
    from payments.models import PaymentEvent

    return PaymentEvent.objects.filter(
        payment_id=payment_id, event_type="account_validation_failed"
    ).count()


def micro_entries_checks(story: MicroStory, *, sandbox_stats: dict) -> tuple[list, list]:
    """The section's rows and checks, from what the API answered and the sandbox charged (a
    held debit's answer warns ``held_for_validation``)."""
    ok, expired = story.verified_token, story.expired_token
    held_first = all(
        story.held[t].get("state") == "pending"
        and "held_for_validation" in {w.get("code") for w in story.held[t].get("warnings", [])}
        for t in (ok, expired)
    )
    released_key = story.held[ok].get("idempotency_key", "")
    charges = sandbox_stats.get("charges", {})
    rows = [
        ("accounts validated by micro-entries", f"{ok} (verified), {expired} (left to expire)"),
        ("  micro-entry credits read from the statements", sum(map(len, story.amounts.values()))),
        ("  the wrong try", f"{story.wrong_try[0]} {story.wrong_try[1]}"),
        ("  the right amounts", f"{story.verified[0]} {story.verified[1]}"),
        ("  the debit held on the verified account", story.released_state),
        (
            "  validations ended by the periodic round",
            f"{story.round_ended}, then {story.round_again}",
        ),
        ("  the expired one", f"{story.expired[0]}: {story.expired[1]}"),
        ("  the debit held on the expired one", story.expired_debit_state),
        ("  a WEB debit from it afterwards", f"{story.refused[0]} {story.refused[1]}"),
    ]
    checks = [
        (
            "micro-entries started at the processor: two ACCTVERIFY credits under $1.00 on each "
            "account's statement",
            all(s == (201, "pending") for s in story.started.values())
            and all(len(a) == 2 for a in story.amounts.values()),
        ),
        ("a WEB debit from an account not validated yet was created held", held_first),
        (
            "a wrong try was refused (409 micro_entries_mismatch, 2 tries left), then the right "
            "amounts validated the account",
            story.wrong_try == (409, "micro_entries_mismatch")
            and story.attempts_left == 2
            and story.verified == (200, "validated"),
        ),
        (
            "the debit held on it was released once validated and charged exactly once",
            story.released_state in ("submitted", "confirmed") and charges.get(released_key) == 1,
        ),
        (
            "unverified micro-entries expired in the periodic round, and the debit held on them "
            "failed once",
            story.round_ended >= 1
            and story.round_again == 0
            and story.expired == ("failed", EXPIRED_REASON)
            and story.expired_debit_state == "failed"
            and story.expired_debit_failures == 1
            and story.held[expired].get("idempotency_key", "") not in charges,
        ),
        (
            "the right amounts after the expiry were refused (409 validation_not_verifiable)",
            story.verify_after_expiry == (409, "validation_not_verifiable"),
        ),
        (
            "a WEB debit from the account whose validation failed was refused "
            "(409 account_not_validated)",
            story.refused == (409, "account_not_validated"),
        ),
    ]
    label, held = web_debits_validated_first()
    checks.append((f"no WEB debit left before its account was validated ({label})", held))
    return rows, checks
