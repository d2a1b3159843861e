"""The demo's cancels before origination: a handful of payments created through the API and
canceled at once, racing the workers that submit them.

Each cancel has one winner: ``200`` (the payment is canceled and never reaches the processor)
or ``409 already_submitted`` (a worker's submission got there first, and the payment goes on).
The sandbox processor's own count of what it charged is the proof that a canceled payment was
never sent.
"""

import sys
import time
import uuid

import requests

from demo import token_suffix

CANCELS = 8


def _create(session: requests.Session, web_url: str, merchant: str, n: int) -> dict:
    response = session.post(
        f"{web_url}/api/payments/",
        json={
            "merchant_id": merchant,
            "amount": f"{20 + n}.00",
            "source_token": f"tok_demo_cancel_{token_suffix()}",
            "description": "demo cancel before origination",
        },
        headers={"Idempotency-Key": str(uuid.uuid4())},
        timeout=30,
    )
    if response.status_code != 201:
        sys.exit(f"\nPOST /api/payments/ answered {response.status_code}: {response.text}")
    return response.json()


def _cancel(session: requests.Session, web_url: str, payment_id: str) -> tuple[int, str]:
    """The cancel's status and what it says: the payment's state, or the refusal's code."""
    response = session.post(f"{web_url}/api/payments/{payment_id}/cancel/", timeout=30)
    body = response.json()
    return response.status_code, body.get("state") or body.get("error", {}).get("code", "")


def _settled(answers: dict[str, tuple[int, str]]) -> bool:
    """Every canceled payment's submit message done, every refused payment past pending."""
    from callbacks.models import QueueMessage
    from payments.models import Payment

    canceled = [pid for pid, (status, _) in answers.items() if status == 200]
    refused = [pid for pid, (status, _) in answers.items() if status != 200]
    done = QueueMessage.objects.filter(
        kind="submit_payment", payment_id__in=canceled, status="done"
    ).count()
    moving = Payment.objects.filter(pk__in=refused, state="pending").count()
    return done >= len(canceled) and moving == 0


def cancels_checks(
    answers: dict[str, tuple[int, str]], again: tuple[int, str] | None, stats: dict
) -> list[tuple[str, bool]]:
    """The summary's checks of the cancels: each answered by one of its two outcomes, none of
    the canceled payments charged at the processor or attempted by us, a repeat answered the
    same, and every payment in the state its answer said."""
    from payments.models import Payment, ProcessorAttempt

    canceled = sorted(pid for pid, (status, _) in answers.items() if status == 200)
    charged = {pid for pid, n in (stats.get("charges_by_payment") or {}).items() if int(n) > 0}
    states = dict(Payment.objects.filter(pk__in=list(answers)).values_list("id", "state"))
    states = {str(pid): state for pid, state in states.items()}
    return [
        (
            f"each cancel answered 200 canceled or 409 already_submitted ({len(answers)} sent)",
            all(a in {(200, "canceled"), (409, "already_submitted")} for a in answers.values()),
        ),
        (
            f"no canceled payment reached the processor ({len(canceled)} canceled, counted at "
            "the sandbox)",
            not charged & set(canceled)
            and not ProcessorAttempt.objects.filter(payment_id__in=canceled).exists(),
        ),
        (
            "each payment is in the state its cancel's answer said",
            all(
                (states.get(pid) == "canceled") == (status == 200)
                for pid, (status, _) in answers.items()
            ),
        ),
        (
            "a second cancel of a canceled payment answered 200 again",
            again in (None, (200, "canceled")),
        ),
    ]


def run_cancels(
    *, web_url: str, token: str, merchant: str, sandbox_url: str, timeout: float = 60
) -> tuple[list, list]:
    """Create and at once cancel ``CANCELS`` payments; the summary's rows and checks."""
    session = requests.Session()
    session.headers["Authorization"] = f"Token {token}"
    answers: dict[str, tuple[int, str]] = {}
    for n in range(CANCELS):
        payment = _create(session, web_url, merchant, n)
        answers[payment["id"]] = _cancel(session, web_url, payment["id"])
    canceled = [pid for pid, (status, _) in answers.items() if status == 200]
    again = _cancel(session, web_url, canceled[0]) if canceled else None
    deadline = time.monotonic() + timeout
    while not _settled(answers) and time.monotonic() < deadline:
        time.sleep(0.5)
    stats = requests.get(f"{sandbox_url}/_sandbox/stats", timeout=5).json()
    rows = [
        (
            "canceled before origination (API)",
            f"{len(canceled)} of {len(answers)}; {len(answers) - len(canceled)} already "
            "submitted by a worker",
        )
    ]
    return rows, cancels_checks(answers, again, stats)
