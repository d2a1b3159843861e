"""The demo's dishonors: two settled debits come back, an operator asks to dishonor each
return, and the sandbox answers one with ``return_dishonored`` (re-credited) and the other with
``return_dishonored`` then ``dishonor_contested`` (the return stands), by token rule."""

import sys
import time
import uuid
from decimal import Decimal

import requests

# ``_contest`` in a returning token: the sandbox contests the dishonor (sandbox/faults.py).
DISHONORED_TOKEN = "tok_nsf_demo_dishonor"
CONTESTED_TOKEN = "tok_nsf_demo_contest"


def _create(web_url: str, token: str, merchant: str, source_token: str) -> str:
    response = requests.post(
        f"{web_url}/api/payments/",
        json={
            "merchant_id": merchant,
            "amount": "42.00",
            "currency": "USD",
            "source_token": source_token,
            "description": "demo dishonor",
        },
        headers={"Authorization": f"Token {token}", "Idempotency-Key": str(uuid.uuid4())},
        timeout=30,
    )
    if response.status_code != 201:
        sys.exit(f"\nPOST /api/payments/ answered {response.status_code}: {response.text}")
    return response.json()["id"]


def _wait(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(1)
    return False


def dishonor_story(dishonored_id: str, contested_id: str) -> list[tuple[str, bool]]:
    """The checks of the two payments' dishonors: each answer moved money once."""
    from payments.models import LedgerEntry, ReturnDishonor

    def entries(pid) -> dict:
        return dict(LedgerEntry.objects.filter(payment_id=pid).values_list("kind", "amount"))

    def answers(pid) -> str:
        dishonor = ReturnDishonor.objects.filter(payment_id=pid).first()
        return dishonor.outcome if dishonor else "no dishonor"

    one, two = entries(dishonored_id), entries(contested_id)
    return [
        (
            f"a dishonored return is re-credited once (payment {dishonored_id}: "
            f"{answers(dishonored_id)}, net {sum(one.values(), Decimal(0)):.2f})",
            set(one) == {"credit", "reversal", "recredit"},
        ),
        (
            f"a contested dishonor is reversed once and the return stands (payment "
            f"{contested_id}: {answers(contested_id)}, net {sum(two.values(), Decimal(0)):.2f})",
            set(two) == {"credit", "reversal", "recredit", "recredit_reversal"},
        ),
    ]


def run_dishonors(*, web_url: str, token: str, merchant: str) -> list[tuple[str, bool]]:
    """Create the two payments, wait for their returns, ask for the dishonors as the admin's
    operator does, and wait for the sandbox's answers."""
    from django.contrib.auth import get_user_model

    from payments.models import Payment, ReturnDishonor
    from payments.services.dishonors import return_dishonor_request

    print("  dishonors: two settled debits that will come back (R01)", flush=True)
    ids = []
    for source_token in (DISHONORED_TOKEN, CONTESTED_TOKEN):
        # The sandbox's random faults may fail a debit before it settles: take another.
        for attempt in range(3):
            pid = _create(web_url, token, merchant, f"{source_token}{attempt}")
            _wait(
                lambda pid=pid: Payment.objects.filter(
                    id=pid, state__in=("returned", "failed")
                ).exists(),
                120,
            )
            if Payment.objects.filter(id=pid, state="returned").exists():
                ids.append(pid)
                break
    if len(ids) < 2:
        return [("both dishonor demo payments were returned", False)]
    operator = get_user_model().objects.get(username="admin")
    for pid in ids:
        result = return_dishonor_request(
            payment_id=pid,
            reason_code="R61",
            note="demo: the return was misrouted",
            user=operator,
        )
        print(
            f"  dishonor R61 asked for payment {pid}: "
            f"{'sent' if result.sent else 'failed: ' + result.error}",
            flush=True,
        )

    def answered() -> bool:
        first = ReturnDishonor.objects.filter(payment_id=ids[0]).first()
        second = ReturnDishonor.objects.filter(payment_id=ids[1]).first()
        return bool(
            first
            and first.dishonored_event_id
            and second
            and second.contested_event_id
            and second.dishonored_event_id
        )

    _wait(answered, 120)
    return dishonor_story(*ids)
