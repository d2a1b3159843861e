"""The demo's money out: refunds of settled debits through the API, full and partial, a race of
concurrent refunds for the same money, and a double loss caught.

- Full and partial refunds of a merchant's settled debits, two partial ones on one debit.
- ``RACERS`` requests refunding 40% of one debit at once: the debit's row lock lets exactly two
  through (80%), the rest answer ``409 refund_exceeds_refundable``.
- ``DOUBLE_LOSS_TRIES`` debits on ``tok_unauth`` tokens, which settle and come back R10 a few
  seconds later: each is refunded in full the moment it settles. A refund the worker sent before
  the return is a double loss (the customer has the money twice): recorded, booked and alerted;
  one it had not sent yet is canceled instead.

The proof is the checker's (``chaos.invariants.money_out``) against the sandbox's own count of
the credits it sent: each credit at most once per key, refunds within what was collected, every
double loss flagged, every balance equal to its ledger entries.
"""

import threading
import time
import uuid
from decimal import Decimal

import requests

from demo import token_suffix

RACERS = 8
DOUBLE_LOSS_TRIES = 3
PAYOUT_RACERS = 10
FINAL = ("confirmed", "failed", "canceled", "returned")


def _session(token: str) -> requests.Session:
    session = requests.Session()
    session.headers["Authorization"] = f"Token {token}"
    return session


def _refund(session, web_url: str, payment_id: str, amount: str) -> tuple[int, dict]:
    response = session.post(
        f"{web_url}/api/payments/{payment_id}/refunds/",
        json={"amount": amount, "reason": "demo refund"},
        headers={"Idempotency-Key": str(uuid.uuid4())},
        timeout=30,
    )
    return response.status_code, response.json()


def _wait(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return predicate()


def _settled_debits(merchant: str | None, count: int) -> list:
    from payments.models import Payment

    debits = Payment.objects.filter(
        purpose="collection", state="confirmed", refunds__isnull=True
    ).order_by("created_at")
    if merchant is not None:
        debits = debits.filter(merchant_id=merchant)
    return list(debits[:count])


def _refunds(session, web_url: str, merchant: str) -> tuple[list[tuple[int, dict]], list]:
    """Full refunds of two debits, half of two more, two thirds of one in two parts."""
    debits = _settled_debits(merchant, 5)
    answers = []
    for n, debit in enumerate(debits):
        amount = debit.amount
        parts = [amount] if n < 2 else [(amount / 2).quantize(amount)]
        if n == 4:
            parts = [(amount / 3).quantize(amount)] * 2
        answers += [_refund(session, web_url, str(debit.id), f"{p:.2f}") for p in parts]
    return answers, debits


def _race(token: str, web_url: str, merchant: str) -> tuple[list[tuple[int, dict]], str]:
    """``RACERS`` concurrent refunds of 40% of one debit."""
    # Another merchant's debit when a small run's merchant has none left unrefunded.
    [debit] = _settled_debits(merchant, 1) or _settled_debits(None, 1)
    share = f"{(debit.amount * 2 / 5).quantize(debit.amount):.2f}"
    barrier = threading.Barrier(RACERS)
    answers: list = [None] * RACERS

    def racer(i: int) -> None:
        barrier.wait()
        answers[i] = _refund(_session(token), web_url, str(debit.id), share)

    threads = [threading.Thread(target=racer, args=(i,)) for i in range(RACERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return answers, str(debit.id)


def _double_losses(session, web_url: str, merchant: str) -> tuple[list[str], list[str]]:
    """Debits that settle and come back R10, each refunded in full as soon as it settles: the
    debits' ids, and those refunded (on a loaded machine the return can come before the
    demo's refund, which then has nothing to refund and is not asked for)."""
    from payments.models import Payment

    created = []
    for n in range(DOUBLE_LOSS_TRIES):
        response = session.post(
            f"{web_url}/api/payments/",
            json={
                "merchant_id": merchant,
                "amount": f"{40 + n}.00",
                "source_token": f"tok_unauth_demo_refund_{token_suffix()}",
                "description": "demo: refunded, then returned unauthorized",
            },
            headers={"Idempotency-Key": str(uuid.uuid4())},
            timeout=30,
        )
        created.append(response.json()["id"])
    refunded = []
    for payment_id in created:
        _wait(lambda pid=payment_id: Payment.objects.get(pk=pid).state != "pending", 60)
        _wait(lambda pid=payment_id: Payment.objects.get(pk=pid).state != "submitted", 60)
        if Payment.objects.get(pk=payment_id).state == "confirmed":
            status, _ = _refund(
                session, web_url, payment_id, f"{Payment.objects.get(pk=payment_id).amount:.2f}"
            )
            if status == 201:
                refunded.append(payment_id)
    return created, refunded


def _available(session, web_url: str, merchant: str) -> str:
    response = session.get(f"{web_url}/api/merchants/{merchant}/balance/", timeout=30)
    balances = response.json()["balances"]
    return balances[0]["available"] if balances else "0.00"


def _payout(session, web_url: str, merchant: str, amount: str) -> tuple[int, dict]:
    response = session.post(
        f"{web_url}/api/payouts/",
        json={
            "merchant_id": merchant,
            "amount": amount,
            "destination_token": f"tok_demo_payout_{merchant}",
        },
        headers={"Idempotency-Key": str(uuid.uuid4())},
        timeout=30,
    )
    return response.status_code, response.json()


def _payouts(token: str, web_url: str, merchant: str):
    """A payout of 40% of the available balance, then ``PAYOUT_RACERS`` at once of 15% each:
    the merchant's lock lets exactly four through (the 60% left)."""
    from decimal import ROUND_DOWN

    session = _session(token)
    available = Decimal(_available(session, web_url, merchant))
    first = _payout(
        session, web_url, merchant, f"{(available * 2 / 5).quantize(Decimal('0.01'), ROUND_DOWN)}"
    )
    share = f"{(available * 3 / 20).quantize(Decimal('0.01'), ROUND_DOWN)}"
    barrier = threading.Barrier(PAYOUT_RACERS)
    answers: list = [None] * PAYOUT_RACERS

    def racer(i: int) -> None:
        barrier.wait()
        answers[i] = _payout(_session(token), web_url, merchant, share)

    threads = [threading.Thread(target=racer, args=(i,)) for i in range(PAYOUT_RACERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return available, first, answers


def run_refunds(
    *,
    web_url: str,
    token: str,
    merchant: str,
    payout_merchants: list[str],
    sandbox_url: str,
    timeout: float = 90,
):
    """Refund, race and catch a double loss; pay out and race payouts; the summary's rows and
    checks."""
    from chaos.invariants.money_out import (
        check_balances,
        check_credits_sent,
        check_double_losses,
        check_payouts,
        check_refunds_within_collected,
    )
    from chaos.invariants.report import Report
    from payments.models import DoubleLoss, Payment

    session = _session(token)
    answers, _ = _refunds(session, web_url, merchant)
    raced, raced_debit = _race(token, web_url, merchant)
    returned, refunded = _double_losses(session, web_url, merchant)
    # The merchant with the most to pay out: one whose returns outran its debits is negative.
    session = _session(token)
    _, payout_merchant = max(
        (Decimal(_available(session, web_url, m)), m) for m in payout_merchants
    )
    available, first_payout, raced_payouts = _payouts(token, web_url, payout_merchant)
    _wait(
        lambda: all(Payment.objects.get(pk=pid).state == "returned" for pid in returned),
        timeout,
    )
    _wait(
        lambda: (
            not Payment.objects.filter(purpose="refund", merchant_id=merchant)
            .exclude(state__in=FINAL)
            .exists()
        ),
        timeout,
    )
    stats = requests.get(f"{sandbox_url}/_sandbox/stats", timeout=5).json()
    report = Report()
    check_credits_sent(report, stats)
    check_refunds_within_collected(report)
    check_double_losses(report)
    check_payouts(report)
    check_balances(report)
    won = sum(1 for status, _ in raced if status == 201)
    lost = [body.get("error", {}).get("code") for status, body in raced if status != 201]
    losses = DoubleLoss.objects.filter(payment_id__in=refunded).count()
    canceled = Payment.objects.filter(refund_of_id__in=refunded, state="canceled").count()
    states = dict(
        (state, Payment.objects.filter(purpose="refund", merchant_id=merchant, state=state).count())
        for state in FINAL
    )
    rows = [
        (
            "refunds (API)",
            f"{sum(1 for s, _ in answers if s == 201)} of {len(answers)} made (2 full, 4 partial); "
            f"settled {states['confirmed']}, returned {states['returned']}, failed "
            f"{states['failed']}, canceled {states['canceled']}",
        ),
        (f"{RACERS} concurrent refunds of 40% of one debit", f"{won} made, {len(lost)} refused"),
        (
            "refunded, then returned R10",
            f"{losses} double loss(es) caught, {canceled} refund(s) canceled before sending, "
            f"{len(returned) - len(refunded)} returned before the demo refunded it",
        ),
        (
            "payouts (API)",
            f"{first_payout[0]} for 40% of {available} available, then "
            f"{sum(1 for s, _ in raced_payouts if s == 201)} of {PAYOUT_RACERS} concurrent "
            "payouts of 15% made",
        ),
        ("credits sent (sandbox)", f"{stats.get('total_credits_sent', 0)}"),
    ]
    checks = [
        ("every refund of the demo answered 201", all(s == 201 for s, _ in answers)),
        (
            f"the race left exactly two refunds of debit {raced_debit[:8]}; the rest answered "
            "409 refund_exceeds_refundable",
            won == 2 and set(lost) == {"refund_exceeds_refundable"},
        ),
        (
            "each debit refunded before its return: a double loss or the refund canceled",
            losses + canceled == len(refunded) and losses >= 1,
        ),
    ]
    payout_won = sum(1 for status, _ in raced_payouts if status == 201)
    payout_lost = {b.get("error", {}).get("code") for st, b in raced_payouts if st != 201}
    checks.append(
        (
            f"a payout of 40% of the available balance made, then exactly 4 of {PAYOUT_RACERS} "
            "concurrent ones of 15%; the rest answered 409 insufficient_available_balance",
            first_payout[0] == 201
            and payout_won == 4
            and payout_lost == {"insufficient_available_balance"},
        )
    )
    for name in (
        "credits_sent_at_most_once",
        "payouts_never_overdraw",
        "refunds_within_collected",
        "double_losses_flagged",
        "balances_match_entries",
    ):
        found = report.violations_of(name)
        label = f"{name} ({report.checked.get(name, {})})"
        checks.append((label + (f": {found[0]}" if found else ""), not found))
    return rows, checks
