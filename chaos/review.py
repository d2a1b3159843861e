"""The chaos run's risk controls: exposure limits on a share of its merchants that its load
reaches, a fraud rule that holds some of its debits, and a reviewer deciding the held ones while
the faults run and the creates race on.

- Limits (``risk_limits``): merchants 0 to ``LIMITED_MERCHANTS - 1`` get a debit single-entry
  cap some creates pass (amounts run from 1.00 to 500.00), a daily or a 5-banking-day cap at
  60 % of what the load brings each of them, and a credit daily cap that refunds and the
  payouts racing it (``risk_payouts``: in the fault window, or just after it when a small
  run's merchant had too little settled inside it) run into. Past one, the API answers 409
  ``exposure_limit_exceeded`` and the load records the key as refused.
- Holds: ``first_large_debit`` (``chaos.config.RUN_FRAUD_RULES``) holds the first debit from an
  account above ``chaos.config.FIRST_LARGE_DEBIT``; every load debit is its account's first.
  Above the single-entry cap too, so the holds fall on the merchants without one (a create
  past a limit is refused before any rule runs).
- The reviewer (``review_holds``, then ``review_remaining`` before the run settles) approves
  and rejects the held payments in turn, through the services the admin's review queue calls,
  every fourth approval racing the merchant's cancel through the API.

``limits_never_exceeded`` and ``held_payments_never_sent_unapproved`` then check the run, told
that it was configured with both (a run that reached no limit or held nothing fails them).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from decimal import ROUND_DOWN, Decimal

import requests

from chaos.config import MERCHANTS
from chaos.load import _json, post_through_faults, refusal

LIMITED_MERCHANTS = 3
# Load amounts run from 1.00 to 500.00: one debit in ten of a capped merchant is past this.
SINGLE_CAP = Decimal("450.00")
MEAN_AMOUNT = Decimal("250.50")
# The daily (or window) cap: this share of what the load brings a merchant, so creates past it
# are refused over the last 40 % of the load, at any CHAOS_PAYMENTS.
CAP_SHARE = Decimal("0.6")
CAP_FLOOR = Decimal("500.00")
CREDIT_DAILY_CAP = Decimal("150.00")
# The first capped merchant's, lower: the payouts raced across it need a few times it available,
# which a small run's merchant has only once its debits settle after the processor's outage.
RACED_CREDIT_DAILY_CAP = Decimal("60.00")
WINDOW_BANKING_DAYS = 5
# Payouts at once from the first capped merchant, each PAYOUT_SHARE of what is left of its
# credit cap today (refunds of its debits count too): exactly two fit.
PAYOUT_RACERS = 5
PAYOUT_SHARE = Decimal("0.4")
REVIEWER = "chaos-reviewer"


def daily_cap(payments: int) -> Decimal:
    """The debit cap of a capped merchant: ``CAP_SHARE`` of the load's expected debits of one
    merchant (``payments / MERCHANTS`` of ``MEAN_AMOUNT``), whole hundreds, at least
    ``CAP_FLOOR``."""
    expected = Decimal(payments) / MERCHANTS * MEAN_AMOUNT * CAP_SHARE
    return max(CAP_FLOOR, (expected / 100).quantize(Decimal("1")) * 100)


def risk_limits(payments: int) -> dict[str, dict[str, dict]]:
    """merchant id -> direction -> the caps the run sets (``payments.exposure_limits.Limits``
    keywords): the first capped merchant a single and a daily debit cap, the second a daily one
    only, the third a single and a 5-banking-day one; each a credit daily cap."""
    cap = daily_cap(payments)
    debit = [
        {"single": SINGLE_CAP, "daily": cap},
        {"daily": cap},
        {"single": SINGLE_CAP, "window": cap, "window_banking_days": WINDOW_BANKING_DAYS},
    ]
    return {
        f"merchant-{i}": {
            "debit": debit[i % len(debit)],
            "credit": {"daily": RACED_CREDIT_DAILY_CAP if i == 0 else CREDIT_DAILY_CAP},
        }
        for i in range(LIMITED_MERCHANTS)
    }


def decision(n: int) -> tuple[str, bool]:
    """The reviewer's ``n``-th decision: approve and reject in turn; every fourth decision (an
    approval) races the merchant's cancel."""
    return ("approve" if n % 2 == 0 else "reject"), n % 4 == 2


class Review:
    """The run's risk steps, as methods of the run (``ChaosRun``), which holds the config, the
    ports, the API token, ``stopping``, ``log`` and ``review_counts``."""

    def risk_setup(self) -> None:
        """The reviewer (a user with the limits' and the review's permissions, as an operator
        has) and the limits of the capped merchants, each set with its note and audit row."""
        from django.contrib.auth import get_user_model
        from django.contrib.auth.models import Permission

        from payments.exposure_limits import Limits
        from payments.services.limits import exposure_limit_set

        reviewer = get_user_model().objects.create_user(REVIEWER, is_staff=True)
        reviewer.user_permissions.add(
            *Permission.objects.filter(
                content_type__app_label="payments",
                codename__in=("change_exposure_limits", "review_payment"),
            )
        )
        reviewer = get_user_model().objects.get(pk=reviewer.pk)  # a fresh permission cache
        self.reviewer = reviewer
        for merchant, directions in risk_limits(self.config.payments).items():
            for direction, caps in directions.items():
                exposure_limit_set(
                    merchant_id=merchant,
                    direction=direction,
                    currency="USD",
                    limits=Limits(**caps),
                    user=reviewer,
                    note="chaos run: limits its load reaches",
                )
        shown = {m: {d: {k: str(v) for k, v in c.items()} for d, c in ds.items()}
                 for m, ds in risk_limits(self.config.payments).items()}  # fmt: skip
        self.log(f"exposure limits set: {shown}")

    def risk_payouts_late(self, seconds: float = 60) -> None:
        """The payout race after the fault window, when it could not run inside it (a small
        run's capped merchant has settled too little by then): its payouts still race each
        other across the cap, and the run settles them before the checks."""
        if self.payouts_raced:
            return
        self.log("the payout race did not run in the fault window: racing after it")
        self.risk_payouts(time.monotonic(), time.monotonic() + seconds)

    def review_holds(self, at: float, until: float) -> None:
        """Decide the held payments every two seconds from ``at`` to ``until``, under the run's
        faults and while its creates go on."""
        if self.stopping.wait(max(0.0, at - time.monotonic())):
            return
        while time.monotonic() < until and not self.stopping.is_set():
            self.review_round(race=True)
            self.stopping.wait(2)

    def review_remaining(self, timeout: float = 120) -> None:
        """Decide every payment still held, before the run waits to settle: an approved one
        must still be sent, and the checks see each decided."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            left = self.review_round(race=False)
            if left == 0:
                return
            time.sleep(1)
        self.log(f"the reviewer left {left} payment(s) held")

    def review_round(self, *, race: bool) -> int:
        """One pass over the held payments, oldest first; how many were held at its start (-1
        when the database could not be read: the run's faults)."""
        from django.db import DatabaseError, connection

        from payments.models import Payment, PaymentState, ReviewStatus

        try:
            held = list(
                Payment.objects.filter(review_status=ReviewStatus.HELD, state=PaymentState.PENDING)
                .order_by("created_at")
                .values_list("id", flat=True)[:50]
            )
        except DatabaseError:
            connection.close()  # terminated or refused: the next round
            return -1
        for payment_id in held:
            self.review_one(payment_id, race=race)
        return len(held)

    def review_one(self, payment_id, *, race: bool) -> None:
        from django.db import DatabaseError, connection

        from payments.services.review import (
            ReviewRefused,
            payment_review_approve,
            payment_review_reject,
        )

        counts = self.review_counts
        kind, with_cancel = decision(counts["decisions"])
        decide = payment_review_approve if kind == "approve" else payment_review_reject
        cancel: list[int] = []
        racer = None
        if race and with_cancel:
            racer = threading.Thread(target=lambda: cancel.append(self.merchant_cancel(payment_id)))
            racer.start()
        try:
            decide(payment_id=payment_id, user=self.reviewer, note=f"chaos reviewer: {kind}")
        except ReviewRefused as exc:
            counts[f"refused ({exc.rule})"] += 1
        except DatabaseError:
            connection.close()  # decided or not: the next round sees which
            counts["decisions interrupted by the faults"] += 1
            return
        else:
            counts["approved" if kind == "approve" else "rejected"] += 1
        finally:
            if racer is not None:
                racer.join(60)
        counts["decisions"] += 1
        if cancel:
            counts[f"merchant's cancel racing an approval answered {cancel[0]}"] += 1

    def credit_room(self, merchant: str) -> Decimal:
        """What is left today of the merchant's credit daily cap, as the limits API answers it
        (0 when it does not)."""
        url = f"http://127.0.0.1:{self.ports['web']}/api/merchants/{merchant}/limits/"
        try:
            response = requests.get(
                url, headers={"Authorization": f"Token {self.token}"}, timeout=15
            )
            limits = response.json()["limits"] if response.status_code == 200 else []
        except (requests.RequestException, ValueError, KeyError):
            return Decimal("0.00")
        for row in limits:
            if (row["direction"], row["currency"]) == ("credit", "USD"):
                return Decimal(row["remaining_today"] or "0.00")
        return Decimal("0.00")

    def available(self, merchant: str) -> Decimal:
        """The merchant's available balance as the API answers it (0 when it does not)."""
        url = f"http://127.0.0.1:{self.ports['web']}/api/merchants/{merchant}/balance/"
        try:
            response = requests.get(
                url, headers={"Authorization": f"Token {self.token}"}, timeout=15
            )
            balances = response.json()["balances"] if response.status_code == 200 else []
        except (requests.RequestException, ValueError, KeyError):
            return Decimal("0.00")
        usd = [b for b in balances if b.get("currency") == "USD"]
        return Decimal(usd[0]["available"]) if usd else Decimal("0.00")

    def merchant_cancel(self, payment_id) -> int:
        """The merchant's cancel through the API, as its client sends it; the status (0 when
        no answer came through the run's faults)."""
        url = f"http://127.0.0.1:{self.ports['web']}/api/payments/{payment_id}/cancel/"
        return post_through_faults(url, {}, token=self.token, tries=5)

    def risk_payouts(self, at: float, until: float) -> None:
        """``PAYOUT_RACERS`` payouts at once from the first capped merchant, each
        ``PAYOUT_SHARE`` of what is left of its credit daily cap, or less so its available
        balance covers them all: the cap, not the balance, refuses those past it (409
        ``exposure_limit_exceeded``). From ``at``, once its available balance exceeds that room,
        or at ``until`` whatever it is."""
        if self.stopping.wait(max(0.0, at - time.monotonic())):
            return
        merchant = "merchant-0"
        amount = Decimal("0.00")
        while time.monotonic() < until and not self.stopping.is_set():
            room, available = self.credit_room(merchant), self.available(merchant)
            # Each a share of the room, and all of them together within the balance: the cap,
            # not the balance, stops the third (which needs more available than room).
            amount = min(room * PAYOUT_SHARE, available / PAYOUT_RACERS)
            amount = max(amount, Decimal("0.00")).quantize(Decimal("0.01"), ROUND_DOWN)
            if amount > 0 and available > room:
                break
            self.stopping.wait(2)
        if amount <= 0:
            self.log(
                f"fault: no payouts raced: {room} left under {merchant}'s credit cap, "
                f"{available} available"
            )
            return
        url = f"http://127.0.0.1:{self.ports['web']}/api/payouts/"
        answers: list = [None] * PAYOUT_RACERS
        barrier = threading.Barrier(PAYOUT_RACERS)

        def payout(i: int) -> None:
            barrier.wait()
            key = str(uuid.uuid4())
            for _ in range(10):  # through the run's web kills and database outages
                try:
                    response = requests.post(
                        url,
                        json={
                            "merchant_id": merchant,
                            "amount": f"{amount:.2f}",
                            "destination_token": f"tok_chaos_risk_payout_{i}",
                        },
                        headers={"Authorization": f"Token {self.token}", "Idempotency-Key": key},
                        timeout=15,
                    )
                except requests.RequestException:
                    time.sleep(1)
                    continue
                status = response.status_code
                refused = refusal(status, _json(response))
                if refused is not None:
                    answers[i] = f"409 {refused}"
                    return
                if status < 500 and status != 409:
                    answers[i] = str(status)
                    return
                time.sleep(1)

        threads = [threading.Thread(target=payout, args=(i,)) for i in range(PAYOUT_RACERS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        self.review_counts.update(f"payout across the credit cap: {a}" for a in answers)
        self.payouts_raced = True
        self.log(f"fault: {PAYOUT_RACERS} payouts of {amount} at once for {merchant}, across "
                 f"its credit cap: {Counter(answers)}")  # fmt: skip
