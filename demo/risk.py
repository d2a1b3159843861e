"""The demo's risk controls, on either backend: exposure limits run past, fraud rules holding
payments for a person, an R17 ``QUESTIONABLE`` return blocking its account, and the review
queue worked in the admin as an operator does.

1. Two merchants of the section's own get limits, as an operator with
   ``payments.change_exposure_limits`` sets them (each change with its note and audit row):
   ``merchant-risk-1`` a single-entry and a daily debit cap, ``merchant-risk-2`` a daily debit
   cap and a daily credit cap.
2. ``merchant-risk-1`` debits past them: one within, one past the single-entry cap (409
   ``exposure_limit_exceeded``, ``param`` ``debit_single_limit``), a first large debit from a
   new account (held by ``first_large_debit``), then one past the daily cap with the held one
   counted (409, ``debit_daily_limit``).
3. ``merchant-risk-2`` collects, one debit from an account its bank returns R17
   ``QUESTIONABLE`` (the sandbox processor's ``tok_questionable`` rule, the sandbox bank's
   ``QUESTIONABLE`` receiver): the account is blocked for every merchant and its next debit
   answers 409 ``account_blocked``. Then a payout to an account freshly added (held by the
   watched merchants' new-destination rule, ``WatchedNewDestination``) and one past the credit
   cap with the held one counted (409, ``credit_daily_limit``).
4. An operator with ``payments.review_payment`` logs in to the admin and, on each held
   payment's review page, approves the first large debit and rejects the payout.

The summary checks each answer, and with the chaos run's own invariants that no limit was
exceeded and that nothing held was submitted before its approval.

The demo's other sections pay out to accounts made a minute before, so the built-in
``new_destination`` rule is off in the demo (``demo/run.py``); the section's merchants are
watched by ``WatchedNewDestination``, a host's own rule by dotted path that runs the built-in
rule's check for the merchants it names, as a host may watch the merchants it has doubts about.
"""

from __future__ import annotations

import re
import secrets
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import requests

from payments.fraud_rules import Entry, Flag, History, NewDestination

CAPPED = "merchant-risk-1"
WATCHED = "merchant-risk-2"
RISK_MERCHANTS = [CAPPED, WATCHED]
WATCH_RULE = "new_destination_watched"
# The demo's setting for the watched merchants' rule (demo/run.py adds it to FRAUD_RULES).
FRAUD_RULES = {WATCH_RULE: {"path": "demo.risk.WatchedNewDestination", "merchants": [WATCHED]}}
# merchant -> direction -> caps (payments.exposure_limits.Limits keywords).
LIMITS = {
    CAPPED: {"debit": {"single": Decimal("15000.00"), "daily": Decimal("25000.00")}},
    WATCHED: {"debit": {"daily": Decimal("6000.00")}, "credit": {"daily": Decimal("1000.00")}},
}
# (what it shows, amount, the answer expected): the capped merchant's debits, in order, each
# from a new account. 9,000 + 12,000 (held, counted) + 5,000 passes the daily cap of 25,000.
CAPPED_DEBITS = [
    ("within the limits", "9000.00", "sent"),
    ("past the single-entry cap", "16000.00", "exposure_limit_exceeded:debit_single_limit"),
    ("a first large debit", "12000.00", "held:first_large_debit"),
    ("past the daily cap", "5000.00", "exposure_limit_exceeded:debit_daily_limit"),
]
# The watched merchant collects this much (three debits), and this from the questionable one.
WATCHED_DEBITS = ["1500.00", "1500.00", "1500.00"]
QUESTIONABLE_DEBIT = "300.00"
# A payout to a fresh account (held), then one past the credit cap with it counted.
HELD_PAYOUT = "400.00"
REFUSED_PAYOUT = "700.00"
OPERATOR = "risk-operator"
FINAL = ("confirmed", "failed", "canceled", "returned")


class WatchedNewDestination(NewDestination):
    """``new_destination`` for the merchants named in ``merchants`` only: a payout (or refund)
    of one of them to an account first seen, or changed, within ``days`` days is held."""

    name = WATCH_RULE
    options = {**NewDestination.options, "merchants": []}

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        merchants = self.settings["merchants"]
        if not isinstance(merchants, list) or not all(isinstance(m, str) for m in merchants):
            raise ValueError("merchants: a list of merchant ids")
        self.merchants = frozenset(merchants)

    def check(self, entry: Entry, history: History) -> Flag | None:
        if entry.merchant_id not in self.merchants:
            return None
        return super().check(entry, history)


def answer_of(status: int, body: dict, review_rule: str = "") -> str:
    """What a create answered, as the section's plan states it: ``sent`` (201, not held),
    ``held:<rule>`` (201, held by ``review_rule``), ``<code>:<param>`` for a refusal, else
    ``<status>``."""
    if status == 201:
        return f"held:{review_rule}" if review_rule else "sent"
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and error.get("code"):
        return f"{error['code']}:{error.get('param') or ''}"
    return str(status)


_CSRF = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')


def csrf_token(html: str) -> str:
    """The CSRF token of the admin page's form ("" when it has none)."""
    match = _CSRF.search(html)
    return match.group(1) if match else ""


@dataclass
class Story:
    """What the section did, for its summary."""

    answers: dict[str, str] = field(default_factory=dict)  # what it shows -> the answer
    ids: dict[str, str] = field(default_factory=dict)  # what it shows -> payment id
    questionable: str = ""  # the account token its bank returned R17 QUESTIONABLE
    blocked_answer: str = ""  # the next debit from it
    decisions: dict[str, int] = field(default_factory=dict)  # decision -> the admin's status


class RiskClient:
    """The section's calls to the API, as the demo's client."""

    def __init__(self, web_url: str, token: str) -> None:
        self.web_url = web_url
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Token {token}"

    def post(self, path: str, body: dict) -> tuple[int, dict]:
        for _ in range(5):
            response = self.session.post(
                f"{self.web_url}/api/{path}",
                json=body,
                headers={"Idempotency-Key": str(uuid.uuid4())},
                timeout=30,
            )
            if response.status_code not in (429, 503):
                return response.status_code, response.json()
            time.sleep(1)
        return response.status_code, response.json()

    def debit(self, merchant: str, amount: str, account: str) -> tuple[str, str]:
        status, body = self.post(
            "payments/",
            {
                "merchant_id": merchant,
                "amount": amount,
                "currency": "USD",
                "source_token": account,
                "description": "demo risk",
            },
        )
        return answer_of(status, body, _held_by(status, body)), body.get("id", "")

    def payout(self, merchant: str, amount: str, account: str) -> tuple[str, str]:
        status, body = self.post(
            "payouts/", {"merchant_id": merchant, "amount": amount, "destination_token": account}
        )
        return answer_of(status, body, _held_by(status, body)), body.get("id", "")


def _held_by(status: int, body: dict) -> str:
    """The rule that held the payment just created ("" when none): the operator's view, from
    the database the review queue lists."""
    from payments.models import Payment, ReviewStatus

    if status != 201:
        return ""
    payment = Payment.objects.filter(pk=body["id"]).only("review_status", "review_rule").first()
    if payment is None or payment.review_status != ReviewStatus.HELD:
        return ""
    return payment.review_rule or "exposure_limit"


def risk_setup(client_username: str) -> None:
    """Grant the demo's API client the section's merchants, and set their limits as an
    operator allowed to (the admin's limits form calls the same service)."""
    from django.contrib.auth import get_user_model

    from payments.exposure_limits import Limits
    from payments.models import MerchantAccess
    from payments.services.limits import exposure_limit_set

    users = get_user_model()
    client = users.objects.get(username=client_username)
    for merchant in RISK_MERCHANTS:
        MerchantAccess.objects.get_or_create(user=client, merchant_id=merchant)
    admin = users.objects.get(username="admin")
    for merchant, directions in LIMITS.items():
        for direction, caps in directions.items():
            exposure_limit_set(
                merchant_id=merchant,
                direction=direction,
                currency="USD",
                limits=Limits(**caps),
                user=admin,
                note="demo: the merchant's agreed exposure",
            )


def operator_create() -> tuple[str, str]:
    """A staff user with ``payments.review_payment`` only, as a risk team's operator; its
    username and a fresh password."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Permission

    password = secrets.token_urlsafe(12)
    operator, _ = get_user_model().objects.get_or_create(
        username=OPERATOR, defaults={"is_staff": True}
    )
    operator.set_password(password)
    operator.save()
    operator.user_permissions.add(
        Permission.objects.get(content_type__app_label="payments", codename="review_payment")
    )
    return OPERATOR, password


def admin_decide(
    web_url: str, username: str, password: str, payment_id: str, decision: str, note: str
) -> int:
    """Log in to the admin and decide one held payment on its review page, as an operator
    does: the status of the decision's answer (302, back to the payment, when it was taken)."""
    session = requests.Session()
    login = f"{web_url}/admin/login/"
    page = session.get(login, params={"next": "/admin/"}, timeout=30)
    answer = session.post(
        login,
        data={
            "csrfmiddlewaretoken": csrf_token(page.text),
            "username": username,
            "password": password,
            "next": "/admin/",
        },
        headers={"Referer": login},
        timeout=30,
        allow_redirects=False,
    )
    if answer.status_code != 302:
        return answer.status_code
    review = f"{web_url}/admin/payments/payment/{payment_id}/review/"
    page = session.get(review, timeout=30)
    if page.status_code != 200:
        return page.status_code
    answer = session.post(
        review,
        data={
            "csrfmiddlewaretoken": csrf_token(page.text),
            "decision": decision,
            "note": note,
        },
        headers={"Referer": review},
        timeout=30,
        allow_redirects=False,
    )
    return answer.status_code


def _wait(condition: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(1)
    return condition()


def _states(ids: list[str]) -> dict[str, str]:
    from payments.models import Payment

    return {str(k): v for k, v in Payment.objects.filter(pk__in=ids).values_list("id", "state")}


def run_risk(
    *,
    web_url: str,
    token: str,
    client_username: str,
    account: Callable[[str, str], str],
    sandbox_url: str = "",
    timeout: float = 240,
) -> tuple[list, list]:
    """The section: limits, debits and payouts past them, the R17 return, the admin's decisions;
    its rows and checks. ``account(merchant, kind)`` gives a new account's token for the
    merchant: ``paying`` (it settles) or ``questionable`` (its bank returns it R17
    QUESTIONABLE) on the demo's backend."""
    print("\n  risk controls: limits, holds, an R17 QUESTIONABLE return, the review queue")
    risk_setup(client_username)
    client = RiskClient(web_url, token)
    story = Story()
    for shows, amount, _ in CAPPED_DEBITS:
        story.answers[shows], story.ids[shows] = client.debit(
            CAPPED, amount, account(CAPPED, "paying")
        )
    collected = [client.debit(WATCHED, a, account(WATCHED, "paying"))[1] for a in WATCHED_DEBITS]
    story.questionable = account(WATCHED, "questionable")
    _, questionable_id = client.debit(WATCHED, QUESTIONABLE_DEBIT, story.questionable)
    # Settled (a sandbox's random fault may fail or return one: the balance is what it is),
    # and the questionable debit returned.
    _wait(
        lambda: (
            set(_states(collected).values()) <= set(FINAL)
            and _states([questionable_id]).get(questionable_id) == "returned"
        ),
        timeout,
    )
    story.blocked_answer, _ = client.debit(WATCHED, "10.00", story.questionable)
    story.answers["payout to a fresh account"], story.ids["payout to a fresh account"] = (
        client.payout(WATCHED, HELD_PAYOUT, account(WATCHED, "paying"))
    )
    story.answers["payout past the credit cap"], _ = client.payout(
        WATCHED, REFUSED_PAYOUT, account(WATCHED, "paying")
    )
    username, password = operator_create()
    for shows, decision in (
        ("a first large debit", "approve"),
        ("payout to a fresh account", "reject"),
    ):
        payment_id = story.ids.get(shows)
        if payment_id:
            story.decisions[decision] = admin_decide(
                web_url, username, password, payment_id, decision, f"demo: {decision} ({shows})"
            )
    approved = story.ids.get("a first large debit", "")
    _wait(lambda: _states([approved]).get(approved) in FINAL, timeout)
    return risk_checks(story, sandbox_stats=_sandbox_stats(sandbox_url))


def processor_accounts() -> Callable[[str, str], str]:
    """New accounts on the processor backend: source tokens the sandbox processor settles
    (``tok_demo_``) or returns R17 QUESTIONABLE after settling (``tok_questionable``)."""
    made = iter(range(1, 1000))

    def account(merchant: str, kind: str) -> str:
        prefix = "tok_questionable" if kind == "questionable" else "tok_demo"
        return f"{prefix}_risk{next(made):03d}x"

    return account


def bank_accounts(web_url: str, token: str) -> Callable[[str, str], str]:
    """New accounts on the bank backend, stored in the vault through the API as the other
    sections' are: a receiver the sandbox bank lets settle (``Paying ...``) or returns R17
    QUESTIONABLE (``QUESTIONABLE ...``); PPD, so no validation is due first."""
    from bank.nacha.routing import check_digit
    from demo.bank_traffic import ROUTING_PREFIXES

    made = iter(range(1, 1000))
    session = requests.Session()
    session.headers["Authorization"] = f"Token {token}"

    def account(merchant: str, kind: str) -> str:
        n = next(made)
        prefix = ROUTING_PREFIXES[n % len(ROUTING_PREFIXES)]
        word = "QUESTIONABLE" if kind == "questionable" else "Paying"
        response = session.post(
            f"{web_url}/api/vault/accounts/",
            json={
                "merchant_id": merchant,
                "routing_number": f"{prefix}{check_digit(prefix)}",
                "account_number": str(secrets.randbelow(9 * 10**10) + 10**10),
                "account_type": "checking",
                "sec_code": "PPD",
                "holder_name": f"{word} Risk {n}",
            },
            headers={"Idempotency-Key": str(uuid.uuid4())},
            timeout=30,
        )
        if response.status_code != 201:
            # The answer names the field at fault and never quotes a number.
            raise RuntimeError(f"POST /api/vault/accounts/ answered {response.status_code}: "
                               f"{response.text[:300]}")  # fmt: skip
        return response.json()["token"]

    return account


def _sandbox_stats(sandbox_url: str) -> dict:
    if not sandbox_url:
        return {}
    return requests.get(f"{sandbox_url}/_sandbox/stats", timeout=10).json()


def risk_checks(story: Story, *, sandbox_stats: dict) -> tuple[list, list]:
    """The section's rows and checks, from its answers and the database (and the sandbox
    processor's record of what it charged and credited, when the demo has one)."""
    from chaos.invariants.report import Report
    from chaos.invariants.risk import check_held_never_sent, check_limits
    from payments.models import AccountBlock, Payment

    report = Report()
    check_limits(report, expected=True)
    check_held_never_sent(report, sandbox_stats, expected=True)
    approved_id = story.ids.get("a first large debit", "")
    rejected_id = story.ids.get("payout to a fresh account", "")
    approved = Payment.objects.filter(pk=approved_id or None).first()
    rejected = Payment.objects.filter(pk=rejected_id or None).first()
    block = AccountBlock.objects.filter(
        account_token=story.questionable, cleared_at__isnull=True
    ).first()
    expected = {shows: want for shows, _, want in CAPPED_DEBITS}
    expected["payout to a fresh account"] = f"held:{WATCH_RULE}"
    expected["payout past the credit cap"] = "exposure_limit_exceeded:credit_daily_limit"
    rows = list(story.answers.items())
    rows += [
        ("account returned R17 QUESTIONABLE", block.reason if block else "not blocked"),
        ("  its next debit", story.blocked_answer),
        ("operator's decisions in the admin (HTTP status)", story.decisions),
    ]
    checks = [
        (f"{shows}: {want}", story.answers.get(shows) == want) for shows, want in expected.items()
    ]
    checks += [
        (
            "an R17 QUESTIONABLE return blocked its account for every merchant, and its next "
            "debit answered 409 account_blocked",
            block is not None
            and block.scope == "all"
            and story.blocked_answer.startswith("account_blocked:"),
        ),
        (
            "the operator approved the held debit in the admin's review queue; it was sent after",
            story.decisions.get("approve") == 302
            and approved is not None
            and approved.review_status == "approved"
            and approved.state != "pending",
        ),
        (
            "the operator rejected the held payout in the admin: canceled, never sent",
            story.decisions.get("reject") == 302
            and rejected is not None
            and (rejected.review_status, rejected.state) == ("rejected", "canceled"),
        ),
    ]
    for name, label in (
        ("limits_never_exceeded", "no merchant exceeded an exposure limit"),
        ("held_payments_never_sent_unapproved", "nothing held was submitted before its approval"),
    ):
        found = report.violations_of(name)
        counts = ", ".join(f"{k} {v}" for k, v in report.checked.get(name, {}).items())
        checks.append((f"{label} ({counts})" + (f": {found[0]}" if found else ""), not found))
    return rows, checks
