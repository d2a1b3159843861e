"""The demo's traffic generator and summary: payments through the real API, poison events
through the real callback endpoint, then checks of the invariants a payments team cares about.
"""

import json
import random
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor, as_completed
from datetime import UTC, datetime
from decimal import Decimal

import requests
from django.db.models import Count, Q, Sum

from callbacks import conf as callbacks_conf
from demo.cancels import run_cancels
from demo.lifecycle import run_lifecycle
from demo.recovery import drops_start, recovery_report
from demo.webhooks import flaky_recover, webhooks_checks, webhooks_start, webhooks_wait

# Source-token prefixes select the sandbox processor's deterministic behaviours
# (sandbox/faults.py); the sandbox adds seeded random faults on top.
TOKEN_MIX = [
    (0.65, "tok_demo"),  # normal
    (0.06, "tok_fail5xx_2"),  # two 503s, then accepted: retried with the same key
    (0.04, "tok_timeout_1"),  # first call times out, the charge still happens: one charge
    (0.03, "tok_429_1"),  # 429 with Retry-After
    (0.04, "tok_reject"),  # 400: failed at once, medium alert
    (0.07, "tok_return"),  # accepted, then returned (R01) before settlement
    (0.03, "tok_nsf"),  # settled, then returned R01 a few seconds later: reversed
    (0.02, "tok_unauth"),  # settled, then returned R10 (unauthorized): reversed
    (0.06, "tok_dupcb"),  # every callback delivered twice
]
MERCHANTS = [f"merchant-{n}" for n in range(1, 9)]
# A processor outage in the fault mix: every API call answers 503 for this long, started once a
# quarter of the payments are created. Longer than the workers' whole retry budget: without the
# circuit breaker every payment submitted meanwhile would end as a dead letter.
OUTAGE_SECONDS = 30


_last_drawn: dict[str, int] = {}


def progress(label: str, done: int, total: int, width: int = 40) -> None:
    filled = int(width * done / total) if total else width
    if _last_drawn.get(label) == filled and done < total:
        return  # redraw only when the bar moves
    _last_drawn[label] = filled
    bar = "#" * filled + "-" * (width - filled)
    sys.stdout.write(f"\r  {label:<28} [{bar}] {done}/{total}")
    sys.stdout.flush()
    if done >= total:
        sys.stdout.write("\n")


def create_demo_users(*, password: str) -> str:
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    from payments.models import MerchantAccess

    user_model = get_user_model()
    admin, _ = user_model.objects.get_or_create(
        username="admin", defaults={"is_staff": True, "is_superuser": True}
    )
    admin.set_password(password)
    admin.save()
    client, _ = user_model.objects.get_or_create(username="demo-api-client")
    # The API acts only for granted merchants: the demo client is granted the demo's merchants.
    for merchant_id in MERCHANTS:
        MerchantAccess.objects.get_or_create(user=client, merchant_id=merchant_id)
    token, _ = Token.objects.get_or_create(user=client)
    return token.key


def _pick_token(rng: random.Random, i: int) -> str:
    roll, acc = rng.random(), 0.0
    for share, prefix in TOKEN_MIX:
        acc += share
        if roll < acc:
            return f"{prefix}_{i:05d}x"
    return f"tok_demo_{i:05d}x"


def _wait_ready(web_url: str, honcho, log_path, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    print("  waiting for the web server, queues and workers ...", flush=True)
    while time.monotonic() < deadline:
        if honcho.poll() is not None:
            sys.exit(f"a process failed to start; see {log_path}")
        try:
            if requests.get(f"{web_url}/readyz", timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.5)
    sys.exit(f"the system was not ready after {timeout:.0f} s; see {log_path}")


def _outage_start(sandbox_url: str) -> None:
    response = requests.post(
        f"{sandbox_url}/_sandbox/outage", json={"mode": "503", "seconds": OUTAGE_SECONDS}, timeout=5
    )
    response.raise_for_status()
    sys.stdout.write(f"\n  processor outage: every call answers 503 for {OUTAGE_SECONDS} s\n")


def _create_payments(
    web_url: str, token: str, count: int, *, on_quarter=None, bodies: list[dict] | None = None
) -> list[dict]:
    """Create ``count`` payments (of ``bodies`` when given) as a retrying client does."""
    rng = random.Random(42)
    session = requests.Session()
    session.headers["Authorization"] = f"Token {token}"
    if bodies is None:
        bodies = [
            {
                "merchant_id": rng.choice(MERCHANTS),
                "amount": f"{Decimal(rng.randint(500, 250_000)) / 100:.2f}",
                "currency": "USD",
                "source_token": _pick_token(rng, i),
                "description": f"demo invoice {i}",
            }
            for i in range(count)
        ]
    keys = [str(uuid.uuid4()) for _ in bodies]
    # A client that retries: every 10th request is sent twice with the same Idempotency-Key.
    jobs = [(i, b, k) for i, (b, k) in enumerate(zip(bodies, keys, strict=True))]
    jobs += [(i, bodies[i], keys[i]) for i in range(0, count, 10)]
    results: dict[int, dict] = {}
    replays = 0

    def post(job):
        i, body, key = job
        for _ in range(5):
            response = session.post(
                f"{web_url}/api/payments/", json=body, headers={"Idempotency-Key": key}, timeout=30
            )
            if response.status_code != 409:  # 409: the first request is still in flight
                return i, response
            time.sleep(0.2)
        return i, response

    with ThreadPoolExecutor(max_workers=8) as pool:
        futures = [pool.submit(post, job) for job in jobs]
        for n, future in enumerate(as_completed(futures), 1):
            i, response = future.result()
            if response.status_code != 201:
                sys.exit(f"\nPOST /api/payments/ answered {response.status_code}: {response.text}")
            data = response.json()
            if i in results:
                replays += 1
                if results[i]["id"] != data["id"]:
                    sys.exit("\nan idempotent replay returned a different payment")
            results[i] = data
            progress("creating payments (API)", n, len(jobs))
            if on_quarter is not None and n == len(jobs) // 4:
                on_quarter()
    print(f"  {replays} client retries with the same Idempotency-Key replayed the first answer")
    return [results[i] for i in range(count)]


def _signed_post(web_url: str, body: dict) -> int:
    from payments.signing import HEADER, sign

    raw = json.dumps(body).encode()
    headers = {
        "Content-Type": "application/json",
        HEADER: sign(raw, callbacks_conf.CALLBACK_SIGNING_SECRETS[:1]),
    }
    return requests.post(f"{web_url}/callbacks/processor/", data=raw, headers=headers).status_code


def _poison(web_url: str, payments: list[dict]) -> int:
    """Events no automation may apply: they must reach a human, with their history."""
    now = datetime.now(UTC).isoformat()
    sent = 0
    # Events for payments that do not exist: retried with backoff, then dead-lettered.
    for _ in range(2):
        body = {
            "payment_id": str(uuid.uuid4()),
            "event_type": "settled",
            "processor_event_id": f"poison_unknown_{uuid.uuid4().hex[:10]}",
            "amount": "10.00",
            "timestamp": now,
        }
        sent += _signed_post(web_url, body) == 202
    # A settlement for a payment the processor rejected (failed -> confirmed has no transition).
    from payments.models import Payment

    rejected = Payment.objects.filter(state="failed", source_token__startswith="tok_reject")[:2]
    for payment in rejected:
        body = {
            "payment_id": str(payment.id),
            "event_type": "settled",
            "processor_event_id": f"poison_settle_rejected_{payment.id.hex[:10]}",
            "amount": f"{payment.amount:.2f}",
            "timestamp": now,
        }
        sent += _signed_post(web_url, body) == 202
    # A settlement reporting another amount than the payment's: never applied automatically.
    submitted = Payment.objects.filter(state="confirmed").order_by("created_at")[:1]
    for payment in submitted:
        body = {
            "payment_id": str(payment.id),
            "event_type": "settled",
            "processor_event_id": f"poison_amount_{payment.id.hex[:10]}",
            "amount": f"{payment.amount + 1:.2f}",
            "timestamp": now,
        }
        sent += _signed_post(web_url, body) == 202
    return sent


def _unfinished() -> int:
    from callbacks.models import PaymentHold
    from payments.models import OutboxMessage, Payment

    # Hold rows keep the payment id as text: compared in Python, not as a uuid = varchar join.
    # Only holds for a person stop a payment; an outage hold is released by the workers.
    held = list(
        PaymentHold.objects.filter(released_at__isnull=True, kind="triage").values_list(
            "payment_id", flat=True
        )
    )
    moving = Payment.objects.filter(state__in=["pending", "submitted"]).exclude(id__in=held)
    # Settled debits whose token rule promises a return a few seconds later.
    returning = (
        Payment.objects.filter(state="confirmed")
        .filter(Q(source_token__startswith="tok_nsf") | Q(source_token__startswith="tok_unauth"))
        .exclude(id__in=held)
    )
    return (
        moving.count()
        + returning.count()
        + OutboxMessage.objects.filter(published_at__isnull=True).count()
    )


def _wait_until_settled(total: int, timeout: float = 300) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = _unfinished()
        progress("processing (queue + workers)", total - min(left, total), total)
        if left == 0:
            return True
        time.sleep(1)
    sys.stdout.write("\n")
    return False


def section_print(title: str, rows: list, checks: list) -> bool:
    """A section of the summary printed after it: its rows, then its checks; whether all pass."""
    print(f"\n  {title}")
    for label, value in rows:
        print(f"  {label}: {value}")
    for label, passed in checks:
        print(f"  [{'PASS' if passed else 'FAIL'}] {label}")
    return all(passed for _, passed in checks)


def _summary(sandbox_url: str, expected_dead_letters: int, lifecycle=((), ())) -> bool:
    from callbacks.models import PaymentHold, QueueMessage
    from payments.models import LedgerEntry, Payment, PaymentEvent, PaymentReturn, ProcessorAttempt
    from triage.ingestion import dead_letters_ingest
    from triage.models import DeadLetter

    # Beat ingests the DLQ every few seconds; wait for the poison messages to arrive there.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        dead_letters_ingest()
        if DeadLetter.objects.count() >= expected_dead_letters:
            break
        time.sleep(2)

    _wait_for_incident_end()
    stats = requests.get(f"{sandbox_url}/_sandbox/stats", timeout=5).json()
    by_state = dict(Payment.objects.values_list("state").annotate(n=Count("id")))
    retried = ProcessorAttempt.objects.filter(outcome="retryable").count()
    outcomes = dict(
        PaymentEvent.objects.filter(kind="processor_event")
        .values_list("outcome")
        .annotate(n=Count("id"))
    )
    # A copy the worker sent behind its payment's submission is one delivery, not two.
    delivered = (
        QueueMessage.objects.filter(kind="processor_event").exclude(outcome="moved_behind").count()
    )
    callbacks_sent = stats.get("callbacks_sent", 0)
    breaker = _breaker_story()
    rows = [
        ("payments by state", ", ".join(f"{k}: {v}" for k, v in sorted(by_state.items()))),
        (f"processor outage ({OUTAGE_SECONDS} s of 503s)", breaker["line"]),
        ("processor calls retried (same key)", retried),
        ("callbacks sent by the processor", callbacks_sent),
        ("  dropped by SQS dedup (5-min window)", max(callbacks_sent - delivered, 0)),
        ("  dropped by the app's dedup record", outcomes.get("duplicate", 0)),
        ("  stale (e.g. `submitted` after our 201)", outcomes.get("stale", 0)),
        ("  applied", outcomes.get("applied", 0)),
        (
            "returned after settlement (reversed)",
            PaymentReturn.objects.filter(after_settlement=True).count(),
        ),
        ("  ledger reversals", LedgerEntry.objects.filter(kind="reversal").count()),
        (
            "  returns by code",
            ", ".join(
                f"{code}: {n}"
                for code, n in PaymentReturn.objects.values_list("reason_code")
                .annotate(n=Count("id"))
                .order_by("reason_code")
            )
            or "none",
        ),
        ("messages that needed >1 attempt", QueueMessage.objects.filter(attempts__gt=1).count()),
        ("dead letters open (in the admin)", DeadLetter.objects.filter(status="open").count()),
        (
            "payments on hold for a person",
            PaymentHold.objects.filter(released_at__isnull=True, kind="triage").count(),
        ),
        (
            "submissions parked through the outage (released)",
            PaymentHold.objects.filter(kind="outage").count(),
        ),
        *lifecycle[0],
    ]
    print("\n  Summary")
    print("  " + "-" * 66)
    for label, value in rows:
        print(f"  {label:<42} {value}")

    charges = stats.get("charges", {})
    over = {k: n for k, n in charges.items() if n > 1}
    mismatched = []
    for merchant, confirmed in (
        Payment.objects.filter(state="confirmed")
        .values_list("merchant_id")
        .annotate(s=Sum("amount"))
    ):
        ledger = LedgerEntry.objects.filter(merchant_id=merchant).aggregate(s=Sum("amount"))["s"]
        if ledger != confirmed:
            mismatched.append((merchant, confirmed, ledger))
    credited_unconfirmed = (
        LedgerEntry.objects.filter(kind="credit")
        .exclude(payment__state__in=["confirmed", "returned"])
        .count()
    )
    returned_ids = set(Payment.objects.filter(state="returned").values_list("id", flat=True))
    reversed_ids = list(
        LedgerEntry.objects.filter(kind="reversal").values_list("payment_id", flat=True)
    )
    checks = [
        (f"every idempotency key charged at most once ({len(charges)} keys)", not over),
        ("each merchant's ledger net equals its confirmed total", not mismatched),
        ("no ledger credit without a confirmed payment", credited_unconfirmed == 0),
        (
            f"every returned payment reversed exactly once ({len(returned_ids)} returned)",
            sorted(reversed_ids) == sorted(returned_ids),
        ),
        (
            f"every poison event reached the admin ({expected_dead_letters} expected)",
            DeadLetter.objects.count() >= expected_dead_letters,
        ),
        (
            "the processor's circuit breaker opened for the outage and closed after it",
            breaker["opened"] >= 1 and breaker["closed"] >= 1 and breaker["state"] == "closed",
        ),
        (
            "no payment was dead-lettered for the outage (submissions dead-lettered: "
            f"{breaker['dead_submissions']})",
            breaker["dead_submissions"] == 0,
        ),
        (
            f"one 'processor unavailable' alert per breaker incident, each resolved "
            f"({breaker['alerts']} alert(s), {breaker['opened']} incident(s))",
            breaker["alert_resolved"],
        ),
        *lifecycle[1],
    ]
    print("\n  Checks")
    for label, passed in checks:
        print(f"  [{'PASS' if passed else 'FAIL'}] {label}")
    if over:
        print(f"    keys charged more than once: {over}")
    if mismatched:
        print(f"    merchants whose ledger differs: {mismatched}")
    return all(passed for _, passed in checks)


def _wait_for_incident_end(timeout: float = 120) -> None:
    """The breaker's incident (and its alert) ends once it has stayed closed for its cool-down;
    the workers notice within a second."""
    from payments.processor.breaker import processor_breaker_get

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and processor_breaker_get().opened_at is not None:
        time.sleep(1)


def _breaker_story() -> dict:
    """What the processor's circuit breaker did during the run, from its history."""
    from callbacks.models import QueueMessage
    from payments.models import CircuitBreakerTransition
    from payments.processor.breaker import ALERT_KEY, processor_breaker_get
    from triage.models import Alert

    history = list(CircuitBreakerTransition.objects.order_by("id"))
    opened = [t for t in history if t.kind == "opened"]
    closed = [t for t in history if t.kind == "closed"]
    reopened = sum(1 for t in history if t.kind == "reopened")
    if opened and closed:
        # The first incident is the demo's outage; the fault mix's injected 5xx may open the
        # breaker again for a moment, each such incident with its own alert.
        first_close = next((t for t in closed if t.created_at >= opened[0].created_at), closed[-1])
        lasted = (first_close.created_at - opened[0].created_at).total_seconds()
        line = (
            f"breaker opened {opened[0].created_at:%H:%M:%S}, closed "
            f"{first_close.created_at:%H:%M:%S} ({lasted:.0f} s, {reopened} reopening(s) in "
            f"all)"
        )
        if len(opened) > 1:
            line += f"; {len(opened) - 1} more short incident(s) from injected 5xx"
    elif opened:
        line = f"breaker opened {opened[0].created_at:%H:%M:%S}, NOT closed"
    else:
        line = "breaker never opened"
    alerts = list(Alert.objects.filter(key=ALERT_KEY))
    return {
        "line": line,
        "opened": len(opened),
        "closed": len(closed),
        "state": processor_breaker_get().state,
        "dead_submissions": QueueMessage.objects.filter(
            kind="submit_payment", status="dead_lettered"
        ).count(),
        # One alert per incident, each resolved when its incident ended.
        "alerts": len(alerts),
        "alert_resolved": len(alerts) == len(opened) >= 1
        and all(a.status == "resolved" for a in alerts),
    }


def run_traffic(*, web_url, sandbox_url, token, payments, honcho, log_path) -> bool:
    _wait_ready(web_url, honcho, log_path)
    webhooks = webhooks_start(MERCHANTS)
    print(f"  driving {payments} payments through {web_url}/api/payments/", flush=True)
    drops_start(sandbox_url)
    _create_payments(web_url, token, payments, on_quarter=lambda: _outage_start(sandbox_url))
    settled = _wait_until_settled(payments)
    recovered = flaky_recover(webhooks, web_url=web_url, token=token)
    poison = _poison(web_url, [])
    print(f"  sent {poison} poison events that only a human may resolve", flush=True)
    if not settled:
        print("  some payments were still moving after the time limit")
    recovery = recovery_report(sandbox_url)
    lifecycle = run_lifecycle(web_url=web_url, token=token, merchant=MERCHANTS[0])
    cancels = run_cancels(
        web_url=web_url, token=token, merchant=MERCHANTS[1], sandbox_url=sandbox_url
    )
    rows = [*lifecycle[0], *cancels[0], *recovery[0]]
    checks = [*lifecycle[1], *cancels[1], *recovery[1]]
    ok = _summary(sandbox_url, poison, (rows, checks))
    ok = ok and settled
    # After the summary, whose ledger checks hold a merchant's net to its confirmed total: a
    # dishonored return adds its re-credit on top.
    from demo.dishonors import run_dishonors

    checks = run_dishonors(web_url=web_url, token=token, merchant=MERCHANTS[0])
    print("\n  Dishonors")
    for label, passed in checks:
        print(f"  [{'PASS' if passed else 'FAIL'}] {label}")
    ok = ok and all(passed for _, passed in checks)
    # Money out, after the summary too: its refunds are payments of their own.
    from demo.refunds import run_refunds

    rows, checks = run_refunds(
        web_url=web_url,
        token=token,
        merchant=MERCHANTS[2],
        payout_merchants=MERCHANTS[3:],
        sandbox_url=sandbox_url,
    )
    ok = section_print("Money out", rows, checks) and ok
    delivered = webhooks_wait()
    rows, checks = webhooks_checks(webhooks, recovered=recovered)
    checks.append(("every delivery made within the time limit", delivered))
    return section_print("Webhooks", rows, checks) and ok
