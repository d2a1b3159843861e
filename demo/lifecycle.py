"""The demo's ACH lifecycle after settlement: one notification of change and one reinitiation,
through the real API, the sandbox's token rules and the workers.

- ``tok_noc…``: the debit settles, then the processor sends a C01 NOC; it is recorded against
  the payment and its token, with its deadline in banking days, and moves no money.
- ``tok_nsfonce…``: the debit settles and comes back R01; ``POST /api/payments/<id>/reinitiate/``
  sends it again, and the reinitiation settles, linked to its original.
"""

import sys
import time
import uuid

import requests

from demo import token_suffix


def _wait(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.5)
    return False


def _create(session: requests.Session, web_url: str, merchant: str, token: str) -> dict:
    response = session.post(
        f"{web_url}/api/payments/",
        json={
            "merchant_id": merchant,
            "amount": "64.00",
            "source_token": token,
            "description": "demo lifecycle",
        },
        headers={"Idempotency-Key": str(uuid.uuid4())},
        timeout=30,
    )
    if response.status_code != 201:
        sys.exit(f"\nPOST /api/payments/ answered {response.status_code}: {response.text}")
    return response.json()


def _noc_scenario(session, web_url: str, merchant: str, timeout: float):
    """A tok_noc debit and the NOC it brings, or None when the fault mix took the debit
    another way (rejected, or returned before it settled)."""
    from payments.models import NotificationOfChange, Payment

    payment = _create(session, web_url, merchant, f"tok_noc_demo_{token_suffix()}")
    nocs = NotificationOfChange.objects.filter(payment_id=payment["id"])
    state = Payment.objects.filter(pk=payment["id"]).values_list("state", flat=True)
    _wait(lambda: nocs.exists() or state.first() in ("failed", "returned"), timeout)
    return (payment, list(nocs)) if nocs.exists() else None


def _reinitiation_scenario(session, web_url: str, merchant: str, timeout: float) -> list:
    """A tok_nsfonce debit returned R01, reinitiated through the API: the chain, or [] when
    the fault mix took either entry another way."""
    from payments.models import Payment

    returned = _create(session, web_url, merchant, f"tok_nsfonce_demo_{token_suffix()}")

    def state(payment_id):
        return Payment.objects.filter(pk=payment_id).values_list("state", flat=True).first()

    if not _wait(lambda: state(returned["id"]) in ("returned", "failed"), timeout):
        return []
    if state(returned["id"]) != "returned":
        return []
    response = session.post(
        f"{web_url}/api/payments/{returned['id']}/reinitiate/",
        json={},
        headers={"Idempotency-Key": str(uuid.uuid4())},
        timeout=30,
    )
    if response.status_code != 201:
        print(f"  reinitiate answered {response.status_code}: {response.text}")
        return []
    again = response.json()["id"]
    _wait(lambda: state(again) in ("confirmed", "failed", "returned"), timeout)
    detail = session.get(f"{web_url}/api/payments/{returned['id']}/", timeout=30).json()
    return (detail.get("reinitiation") or {}).get("chain", [])


def run_lifecycle(*, web_url: str, token: str, merchant: str, timeout: float = 120):
    """Drive one NOC and one reinitiation (each tried again, up to three times, when the
    sandbox's random faults take its debit another way); return summary rows and checks."""
    from payments.models import LedgerEntry

    session = requests.Session()
    session.headers["Authorization"] = f"Token {token}"
    print("  ACH lifecycle: one notification of change, one reinitiation ...", flush=True)
    noc_run = None
    for _ in range(3):
        noc_run = _noc_scenario(session, web_url, merchant, timeout)
        if noc_run is not None:
            break
    chain: list = []
    expected = [("returned", "R01"), ("confirmed", "")]
    for _ in range(3):
        chain = _reinitiation_scenario(session, web_url, merchant, timeout)
        if [(e["state"], e["return_code"]) for e in chain] == expected:
            break

    noc_ok, noc_line = False, "none recorded"
    if noc_run is not None:
        payment, nocs = noc_run
        noc = nocs[0]
        noc_line = (
            f"{noc.change_code} {noc.change_title}, {noc.status}, apply by {noc.deadline:%Y-%m-%d}"
        )
        credits = LedgerEntry.objects.filter(payment_id=payment["id"]).count()
        noc_ok = len(nocs) == 1 and noc.status == "open" and noc.deadline and credits == 1
    chain_line = " -> ".join(
        f"{entry['state']}{' ' + entry['return_code'] if entry['return_code'] else ''}"
        for entry in chain
    )
    rows = [
        ("notification of change (tok_noc)", noc_line),
        ("reinitiation chain (tok_nsfonce)", chain_line or "none"),
    ]
    checks = [
        ("the NOC was recorded once, open with its deadline, and moved no money", bool(noc_ok)),
        (
            "the R01 return was reinitiated once and the reinitiation settled",
            [(e["state"], e["return_code"]) for e in chain] == expected,
        ),
    ]
    if chain:
        checks.append(_dishonor_after_reinitiation_check(chain[0]["id"]))
    return rows, checks


def _dishonor_after_reinitiation_check(original_id: str) -> tuple[str, bool]:
    """The operator's dishonor of the reinitiated return is refused before any call: a dishonor
    that stood would re-credit the original while the reinitiation charged again."""
    from payments.exceptions import DishonorRefused
    from payments.models import ProcessorAttempt
    from payments.services.dishonors import return_dishonor_request

    try:
        return_dishonor_request(
            payment_id=original_id,
            reason_code="R61",
            note="demo: after the reinitiation",
            user=None,
        )
        refused = False
    except DishonorRefused as exc:
        refused = "reinitiated" in str(exc)
        print(f"  dishonor after the reinitiation refused: {exc}", flush=True)
    calls = ProcessorAttempt.objects.filter(payment_id=original_id, operation="dishonor").count()
    return (
        "a dishonor of the reinitiated return is refused, with no call: the customer pays once",
        refused and calls == 0,
    )
