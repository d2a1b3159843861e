"""The demo's traffic and summary on the bank backend (``DEMO_BACKEND=nacha make demo``).

Each payment's bank account is stored in the vault through ``POST /api/vault/accounts/`` (with
an Idempotency-Key, every 10th store sent twice as a retrying client would), then debited
through ``POST /api/payments/`` on its vault token. The account holder's name picks what the
sandbox bank answers (``sandbox.bank``'s rules: ``NSF``, ``RETURN``, ``UNAUTH``, ``CLOSED``
return, ``NOC``, ``NOCSAVINGS`` a notification of change). ``nacha_send`` cuts and delivers
the files, ``demo/bank_day.py`` lets their banking day pass and has the sandbox bank answer,
``nacha_collect`` reads the answers onto the queue and the workers apply them. The summary then
checks that every payment reached the state its account's rule gives, each entry went out in
exactly one file, each return reversed its credit once, at least one NOC was recorded, and no
account number reached a log.
"""

import random
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

import requests
from django.db.models import Count, Sum

from demo.traffic import MERCHANTS, _create_payments, _wait_ready, progress


@dataclass(frozen=True)
class Rule:
    """What the sandbox bank does with an entry whose receiver name starts with ``word``."""

    share: float
    word: str
    state: str  # the payment's final state
    return_code: str = ""
    change_code: str = ""


RULES = [
    Rule(0.55, "Paying", "confirmed"),
    Rule(0.08, "NSF", "returned", return_code="R01"),
    Rule(0.06, "RETURN", "returned", return_code="R01"),
    Rule(0.05, "UNAUTH", "returned", return_code="R10"),
    Rule(0.05, "CLOSED", "returned", return_code="R02"),
    Rule(0.12, "NOC", "confirmed", change_code="C01"),
    Rule(0.09, "NOCSAVINGS", "confirmed", change_code="C05"),
]
# Receiving banks' routing prefixes; each number gets its check digit (bank.nacha.routing).
ROUTING_PREFIXES = ["02100002", "02600959", "12100035", "07100001", "06100015"]


@dataclass
class Account:
    body: dict
    rule: Rule
    token: str = ""


@dataclass
class Run:
    """What the traffic did, for the summary."""

    accounts: list[Account] = field(default_factory=list)
    payments: list[dict] = field(default_factory=list)
    vault_replays: int = 0
    vault_replays_same_token: bool = True
    # NACHA's WEB debit rule (demo/validation.py): the debit tried first was refused, and how
    # many WEB accounts were validated before their debits.
    web_refused_first: bool = True
    web_validated: int = 0
    # Prenotes (demo/validation.py): account token -> the state its validation must reach.
    prenotes: dict[str, str] = field(default_factory=dict)

    def expected(self) -> dict[str, Rule]:
        """Payment id -> the rule its account was given (the n-th payment debits the n-th)."""
        return {p["id"]: a.rule for a, p in zip(self.accounts, self.payments, strict=True)}

    def account_numbers(self) -> list[str]:
        return [a.body["account_number"] for a in self.accounts]


def _rule_for(rng: random.Random, i: int) -> Rule:
    """Every rule once first (a small run still shows each), then by their shares."""
    if i < len(RULES):
        return RULES[i]
    roll, acc = rng.random(), 0.0
    for rule in RULES:
        acc += rule.share
        if roll < acc:
            return rule
    return RULES[0]


def demo_accounts(count: int, seed: int = 30) -> list[Account]:
    """``count`` accounts for the vault, deterministic for the seed."""
    from bank.nacha.routing import check_digit

    rng = random.Random(seed)
    accounts = []
    for i in range(count):
        rule = _rule_for(rng, i)
        prefix = rng.choice(ROUTING_PREFIXES)
        body = {
            "merchant_id": rng.choice(MERCHANTS),
            "routing_number": f"{prefix}{check_digit(prefix)}",
            # Ten to twelve digits, no leading zero (a C01's corrected number is the reverse).
            "account_number": str(rng.randint(10**9, 10**12 - 1)),
            "account_type": rng.choice(["checking", "checking", "savings"]),
            "sec_code": rng.choice(["PPD", "PPD", "WEB", "CCD"]),
            "holder_name": f"{rule.word} Customer {i}",
        }
        accounts.append(Account(body, rule))
    return accounts


def _store_accounts(web_url: str, token: str, run: Run) -> None:
    """Store each account in the vault with its own Idempotency-Key; every 10th store is sent
    twice, and its replay must answer the first token."""
    session = requests.Session()
    session.headers["Authorization"] = f"Token {token}"
    keys = [str(uuid.uuid4()) for _ in run.accounts]
    jobs = list(range(len(run.accounts))) + list(range(0, len(run.accounts), 10))

    def post(i: int):
        for _ in range(5):
            response = session.post(
                f"{web_url}/api/vault/accounts/",
                json=run.accounts[i].body,
                headers={"Idempotency-Key": keys[i]},
                timeout=30,
            )
            if response.status_code != 409:  # the first store is still in flight
                return i, response
            time.sleep(0.2)
        return i, response

    with ThreadPoolExecutor(max_workers=4) as pool:
        for n, (i, response) in enumerate(pool.map(post, jobs), 1):
            if response.status_code != 201:
                # The answer never quotes a number; it names the field at fault.
                sys.exit(
                    f"\nPOST /api/vault/accounts/ answered {response.status_code}: {response.text}"
                )
            minted = response.json()["token"]
            account = run.accounts[i]
            if account.token:
                run.vault_replays += 1
                replayed = response.headers.get("Idempotent-Replayed") == "true"
                run.vault_replays_same_token &= replayed and minted == account.token
            account.token = minted
            progress("storing accounts (vault API)", n, len(jobs))


def bank_unfinished(expected: dict[str, Rule]) -> int:
    """Payments still moving: not yet at the bank or settled, a promised return or NOC not yet
    applied, and outbox rows not yet published."""
    from payments.models import NotificationOfChange, OutboxMessage, Payment

    states = dict(Payment.objects.filter(pk__in=list(expected)).values_list("id", "state"))
    with_noc = {str(p) for p in NotificationOfChange.objects.values_list("payment_id", flat=True)}
    left = 0
    for payment_id, rule in expected.items():
        state = states.get(uuid.UUID(payment_id))
        if state in ("pending", "submitted"):
            left += 1
        elif rule.state == "returned" and state == "confirmed":
            left += 1
        elif rule.change_code and payment_id not in with_noc and state == "confirmed":
            left += 1
    return left + OutboxMessage.objects.filter(published_at__isnull=True).count()


def _wait_until_final(expected: dict[str, Rule], timeout: float = 300) -> bool:
    deadline = time.monotonic() + timeout
    total = len(expected)
    while time.monotonic() < deadline:
        left = bank_unfinished(expected)
        progress("files, bank, queue, workers", total - min(left, total), total)
        if left == 0:
            return True
        time.sleep(1)
    sys.stdout.write("\n")
    return False


def _counted(pairs) -> str:
    return ", ".join(f"{k}: {n}" for k, n in pairs) or "none"


def bank_summary(run: Run, log_paths: list[Path]) -> bool:
    """Print the bank run's summary and checks; True when every check passes."""
    from bank.nacha.models import NachaEntry, NachaFile, NachaInboundFile, NachaPrenote
    from payments.models import LedgerEntry, NotificationOfChange, Payment, PaymentReturn
    from triage.models import DeadLetter

    expected = run.expected()
    ids = list(expected)
    payments = Payment.objects.filter(pk__in=ids)
    states = {str(k): v for k, v in payments.values_list("id", "state")}
    by_state = dict(payments.values_list("state").annotate(n=Count("id")))
    files = NachaFile.objects.all()
    delivered = files.filter(delivered_at__isnull=False)
    entries = NachaEntry.objects.filter(payment_id__in=ids)
    in_files = entries.filter(file__isnull=False)
    # The validation section's prenotes share the files: zero-dollar entries of no payment.
    prenotes_in_files = NachaPrenote.objects.filter(file__isnull=False).count()
    inbound = dict(NachaInboundFile.objects.values_list("status").annotate(n=Count("id")))
    returns = PaymentReturn.objects.filter(payment_id__in=ids)
    nocs = NotificationOfChange.objects.filter(payment_id__in=ids)
    rows = [
        ("payments by state", _counted(sorted(by_state.items()))),
        ("vault accounts stored (API)", len(run.accounts)),
        ("  client retries replayed (same token)", run.vault_replays),
        ("NACHA files cut / delivered", f"{files.count()} / {delivered.count()}"),
        ("  entries in files", in_files.count()),
        ("bank answer files collected", _counted(sorted(inbound.items()))),
        (
            "returns by code",
            _counted(
                returns.values_list("reason_code").annotate(n=Count("id")).order_by("reason_code")
            ),
        ),
        ("  returned after settlement", returns.filter(after_settlement=True).count()),
        ("  ledger reversals", LedgerEntry.objects.filter(kind="reversal").count()),
        (
            "notifications of change by code",
            _counted(
                nocs.values_list("change_code").annotate(n=Count("id")).order_by("change_code")
            ),
        ),
        ("dead letters open (in the admin)", DeadLetter.objects.filter(status="open").count()),
    ]
    print("\n  Summary (bank backend)")
    print("  " + "-" * 66)
    for label, value in rows:
        print(f"  {label:<42} {value}")

    wrong = {
        pid: (states.get(pid), rule.state)
        for pid, rule in expected.items()
        if states.get(pid) != rule.state
    }
    mismatched = []
    for merchant, confirmed in (
        payments.filter(state="confirmed").values_list("merchant_id").annotate(s=Sum("amount"))
    ):
        ledger = LedgerEntry.objects.filter(merchant_id=merchant).aggregate(s=Sum("amount"))["s"]
        if ledger != confirmed:
            mismatched.append((merchant, confirmed, ledger))
    credited_unconfirmed = (
        LedgerEntry.objects.filter(kind="credit")
        .exclude(payment__state__in=["confirmed", "returned"])
        .count()
    )
    returned_ids = sorted(payments.filter(state="returned").values_list("id", flat=True))
    reversed_ids = sorted(
        LedgerEntry.objects.filter(kind="reversal").values_list("payment_id", flat=True)
    )
    noc_payments = list(nocs.values_list("payment_id", flat=True))
    noc_credits_ok = all(
        LedgerEntry.objects.filter(payment_id=p).count() == 1 for p in noc_payments
    )
    expected_codes = sorted(
        (pid, rule.return_code) for pid, rule in expected.items() if rule.return_code
    )
    return_codes = sorted((str(p), c) for p, c in returns.values_list("payment_id", "reason_code"))
    leaked = _numbers_in_logs(run.account_numbers(), log_paths)
    stored = _numbers_in_database(run.account_numbers())
    checks = [
        (f"every payment reached the state its account's rule gives ({len(ids)})", not wrong),
        (
            f"every vault retry with its Idempotency-Key answered the first token "
            f"({run.vault_replays} retries)",
            run.vault_replays_same_token,
        ),
        (
            f"each entry went out in exactly one file ({in_files.count()} entries, "
            f"{prenotes_in_files} prenotes)",
            in_files.count() == len(ids)
            and sum(files.values_list("entry_count", flat=True))
            == in_files.count() + prenotes_in_files,
        ),
        ("each return carries the code the bank's rule gives", return_codes == expected_codes),
        ("each merchant's ledger net equals its confirmed total", not mismatched),
        ("no ledger credit without a confirmed payment", credited_unconfirmed == 0),
        (
            f"every returned payment reversed exactly once ({len(returned_ids)} returned)",
            bool(returned_ids) and reversed_ids == returned_ids,
        ),
        (
            f"at least one NOC recorded, none moving money ({len(noc_payments)} recorded)",
            bool(noc_payments) and noc_credits_ok,
        ),
        (
            "every bank file was imported whole, none refused, no dead letter",
            not inbound.get("refused") and not DeadLetter.objects.filter(status="open").exists(),
        ),
        (
            "a WEB debit from an account not validated was refused (account_not_validated)",
            run.web_refused_first,
        ),
        (
            f"every WEB account validated before its debit ({run.web_validated} by the service)",
            run.web_validated == sum(a.body["sec_code"] == "WEB" for a in run.accounts),
        ),
        _web_debits_validated_first(),
        *_prenotes_checks(run),
        *_books_checks(),
        ("no account number in any log", not leaked),
        ("no account number stored in the clear in any table", not stored),
    ]
    print("\n  Checks")
    for label, passed in checks:
        print(f"  [{'PASS' if passed else 'FAIL'}] {label}")
    if wrong:
        print(f"    payments not in their rule's state (actual, expected): {wrong}")
    if mismatched:
        print(f"    merchants whose ledger differs: {mismatched}")
    if leaked:
        print(f"    logs holding an account number: {', '.join(leaked)}")
    if stored:
        print(f"    tables holding an account number in the clear: {', '.join(stored)}")
    return all(passed for _, passed in checks)


def _books_checks() -> list[tuple[str, bool]]:
    """The books of the run's banking days (``demo.books_check``); nothing when the demo has no
    statement directory set."""
    from bank import conf
    from bank.books.conf import statement_transport_options
    from bank.nacha.transport_options import parse_transport
    from demo.books_check import books_check

    statements = statement_transport_options()
    nacha = parse_transport(conf.NACHA_TRANSPORT)
    if statements is None or nacha is None:
        return []
    return books_check(
        outbound=nacha["outbound"], inbound=nacha["inbound"], statements=statements["inbound"]
    )


def _prenotes_checks(run: Run) -> list[tuple[str, bool]]:
    from demo.validation import prenotes_check

    # A run that tried no prenote (a test of the other checks) has none to check.
    return prenotes_check(run.prenotes) if run.prenotes else []


def _web_debits_validated_first() -> tuple[str, bool]:
    from demo.validation import web_debits_validated_first

    return web_debits_validated_first()


def _numbers_in_logs(numbers: list[str], log_paths: list[Path]) -> list[str]:
    """The logs in which any of ``numbers`` appears (the names only, never the number)."""
    found = []
    for path in log_paths:
        if path.exists():
            text = path.read_text(errors="replace")
            if any(number in text for number in numbers):
                found.append(str(path))
    return found


def _numbers_in_database(numbers: list[str]) -> list[str]:
    """The tables in which any of ``numbers`` is stored as it is, in any column of any row of
    any installed model (the names only, never the number): the vault's accounts and the NACHA
    files must hold them sealed."""
    from django.apps import apps

    wanted = [number.encode() for number in numbers]
    found = []
    for model in apps.get_models():
        columns = [field.attname for field in model._meta.concrete_fields]
        values = model._default_manager.values_list(*columns).iterator(chunk_size=2000)
        text = b"\n".join(
            bytes(value) if isinstance(value, bytes | memoryview) else str(value).encode()
            for row in values
            for value in row
        )
        if any(number in text for number in wanted):
            found.append(model._meta.db_table)
    return found


def run_bank_traffic(*, web_url, token, payments, honcho, log_path) -> bool:
    _wait_ready(web_url, honcho, log_path)
    run = Run(accounts=demo_accounts(payments))
    print(f"  storing {payments} bank accounts in the vault, then debiting each", flush=True)
    _store_accounts(web_url, token, run)
    from demo.validation import prenotes_start, web_accounts_validate

    run.web_refused_first, run.web_validated = web_accounts_validate(web_url, token, run.accounts)
    run.prenotes = prenotes_start(web_url, token, MERCHANTS[0])
    rng = random.Random(42)
    bodies = [
        {
            "merchant_id": account.body["merchant_id"],
            "amount": f"{Decimal(rng.randint(500, 250_000)) / 100:.2f}",
            "currency": "USD",
            "source_token": account.token,
            "description": f"demo invoice {i}",
        }
        for i, account in enumerate(run.accounts)
    ]
    run.payments = _create_payments(web_url, token, payments, bodies=bodies)
    final = _wait_until_final(run.expected())
    if not final:
        print("  some payments were still moving after the time limit")
    logs = [log_path, log_path.with_name("demo-traffic.log")]
    ok = bank_summary(run, logs) and final
    # Money out, after the summary, whose checks hold each debit to its file and its answer.
    from demo.bank_money_out import run_bank_money_out
    from demo.traffic import section_print

    rows, checks = run_bank_money_out(web_url=web_url, token=token, run=run)
    return section_print("Money out", rows, checks) and ok
