"""The bank demo's money out (``DEMO_BACKEND=nacha make demo``): refunds and payouts sent as
credit entries in the bank's files, exactly once, and settled by the bank's day like the debits.

- Refunds of four settled debits (two full, two half), each a credit to the account its debit
  came from: a vault token, revealed only for the file.
- Debits made and canceled at once, racing the worker that queues them for the next file: a
  canceled one is never cut into a file.
- A payout of 30% of a merchant's available balance to one of its own vault tokens, then six
  at once of 20% each: the merchant's lock lets exactly three through (the 70% left).

The proof: each credit is one entry in exactly one file (the writer gives it code 22 or 32),
refunds never exceed what was collected, no payout overdrew, and every balance equals its
entries.
"""

import threading
import time
import uuid
from decimal import ROUND_DOWN, Decimal

import requests

from payments.return_codes import UNAUTHORIZED_CODES

PAYOUT_RACERS = 6
CANCELS = 6
FINAL = ("confirmed", "failed", "canceled", "returned")


def _post(web_url: str, token: str, path: str, body: dict) -> tuple[int, dict]:
    response = requests.post(
        f"{web_url}/api/{path}",
        json=body,
        headers={"Authorization": f"Token {token}", "Idempotency-Key": str(uuid.uuid4())},
        timeout=30,
    )
    return response.status_code, response.json()


def _available(web_url: str, token: str, merchant: str) -> Decimal:
    response = requests.get(
        f"{web_url}/api/merchants/{merchant}/balance/",
        headers={"Authorization": f"Token {token}"},
        timeout=30,
    )
    balances = response.json()["balances"]
    return Decimal(balances[0]["available"]) if balances else Decimal("0.00")


def _wait(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(1)
    return predicate()


def _cancels(web_url: str, token: str, run) -> dict[str, tuple[int, str]]:
    """Debits made and canceled at once, racing the worker that queues each for the next file:
    payment id -> (the cancel's status, the state or refusal it answered)."""
    answers = {}
    # Not an account an unauthorized return blocked (its next debit answers 409 account_blocked,
    # as it should): a cancel needs a debit to cancel.
    debitable = [a for a in run.accounts if a.rule.return_code not in UNAUTHORIZED_CODES]
    for n, account in enumerate(debitable[:CANCELS]):
        status, body = _post(
            web_url,
            token,
            "payments/",
            {
                "merchant_id": account.body["merchant_id"],
                "amount": f"{30 + n}.00",
                "source_token": account.token,
                "description": "demo cancel before the file",
            },
        )
        if status != 201:
            answers[f"create-{n}"] = (status, body.get("error", {}).get("code", ""))
            continue
        cancel = requests.post(
            f"{web_url}/api/payments/{body['id']}/cancel/",
            headers={"Authorization": f"Token {token}"},
            timeout=30,
        )
        answer = cancel.json()
        answers[body["id"]] = (
            cancel.status_code,
            answer.get("state") or answer.get("error", {}).get("code", ""),
        )
    return answers


def run_bank_money_out(*, web_url: str, token: str, run, timeout: float = 300):
    """Refund and pay out through the bank's files; the summary's rows and checks."""
    from bank.nacha.models import NachaEntry
    from chaos.invariants.money_out import (
        check_balances,
        check_payouts,
        check_refunds_within_collected,
    )
    from chaos.invariants.report import Report
    from payments.models import Payment

    canceled_answers = _cancels(web_url, token, run)
    debits = list(
        Payment.objects.filter(purpose="collection", state="confirmed").order_by("created_at")[:4]
    )
    refunds = []
    for n, debit in enumerate(debits):
        amount = debit.amount if n < 2 else (debit.amount / 2).quantize(Decimal("0.01"))
        refunds.append(
            _post(web_url, token, f"payments/{debit.id}/refunds/", {"amount": f"{amount}"})
        )
    # The merchant with the most to pay out (one whose returns outran its debits has a negative
    # balance, rightly refused).
    merchants = sorted({a.body["merchant_id"] for a in run.accounts})
    available, merchant = max((_available(web_url, token, m), m) for m in merchants)
    destination = next(a.token for a in run.accounts if a.body["merchant_id"] == merchant)

    def payout(share: Decimal) -> tuple[int, dict]:
        amount = (available * share).quantize(Decimal("0.01"), ROUND_DOWN)
        return _post(
            web_url,
            token,
            "payouts/",
            {"merchant_id": merchant, "amount": f"{amount}", "destination_token": destination},
        )

    first = payout(Decimal("0.3"))
    raced: list = [None] * PAYOUT_RACERS
    barrier = threading.Barrier(PAYOUT_RACERS)

    def racer(i: int) -> None:
        barrier.wait()
        raced[i] = payout(Decimal("0.2"))

    threads = [threading.Thread(target=racer, args=(i,)) for i in range(PAYOUT_RACERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    credits = Payment.objects.filter(direction="credit")
    settled = _wait(lambda: not credits.exclude(state__in=FINAL).exists(), timeout)
    canceled = [pid for pid, (status, _) in canceled_answers.items() if status == 200]
    refused = [pid for pid, (status, _) in canceled_answers.items() if status != 200]
    # The debits whose cancel lost go out in a file and settle like the others.
    _wait(
        lambda: (
            not Payment.objects.filter(pk__in=refused, state__in=("pending", "submitted")).exists()
        ),
        timeout,
    )
    entries = NachaEntry.objects.filter(payment__direction="credit")
    in_files = entries.filter(file__isnull=False)
    report = Report()
    check_refunds_within_collected(report)
    check_payouts(report)
    check_balances(report)
    won = sum(1 for status, _ in raced if status == 201)
    lost = {body.get("error", {}).get("code") for status, body in raced if status != 201}
    states = {s: credits.filter(state=s).count() for s in FINAL}
    rows = [
        (
            "refunds and payouts (bank files)",
            f"{len(refunds)} refunds, {1 + won} payouts; in files {in_files.count()} credit "
            f"entries; settled {states['confirmed']}, returned {states['returned']}, failed "
            f"{states['failed']}",
        ),
        (
            "canceled before the file (API)",
            f"{len(canceled)} of {len(canceled_answers)}; {len(refused)} queued for a file first",
        ),
        (
            f"{PAYOUT_RACERS} concurrent payouts of 20%",
            f"{won} made after one of 30% of {available}",
        ),
    ]
    in_a_file = NachaEntry.objects.filter(payment_id__in=canceled, file__isnull=False)
    checks = [
        (
            f"each cancel answered 200 canceled or 409 already_submitted ({len(canceled)} "
            f"canceled, {len(refused)} already in hand)",
            all(
                a in {(200, "canceled"), (409, "already_submitted")}
                for a in canceled_answers.values()
            ),
        ),
        ("no canceled debit was cut into a bank file", not in_a_file.exists()),
        ("every refund answered 201", all(status == 201 for status, _ in refunds)),
        (
            f"a payout of 30% made, then exactly 3 of {PAYOUT_RACERS} concurrent ones of 20%; "
            "the rest answered 409 insufficient_available_balance",
            first[0] == 201 and won == 3 and lost == {"insufficient_available_balance"},
        ),
        ("every refund and payout reached a final state through the bank's files", settled),
        (
            "each credit is one entry in exactly one file",
            entries.count() == credits.count() == in_files.count(),
        ),
    ]
    for name in ("refunds_within_collected", "payouts_never_overdraw", "balances_match_entries"):
        found = report.violations_of(name)
        label = f"{name} ({report.checked.get(name, {})})"
        checks.append((label + (f": {found[0]}" if found else ""), not found))
    return rows, checks
