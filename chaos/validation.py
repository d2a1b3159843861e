"""The chaos run's account validation: a share of its debits are WEB debits from new accounts,
held until each account is validated, under the run's faults.

``UNVALIDATED_WEB_DEBITS`` is one setting for the whole deployment, so the run picks ``"hold"``:
it exercises both answers the rule has. A WEB debit from an account not validated yet is
created held and must be submitted once its account is validated, or failed once when the
validation fails; a WEB debit from an account whose validation failed is refused 409
``account_not_validated`` and must leave nothing. ("refuse" would refuse them all, and leave
the held debits, the harder guarantee, unchecked.)

Each account (``VALIDATION_SHARE`` of ``CHAOS_PAYMENTS``, ``DEBITS_PER_ACCOUNT`` debits each, on
the merchants without exposure limits) follows one of ``PLANS`` in turn, through the public API
only:

1. a WEB debit is created (held), its validation started (``POST .../validation/``), a second
   WEB debit created (held while the validation is pending);
2. ``service``: the run's validation service (``ValidationDouble``, an HTTP double in this
   process that ``ChaosValidationService`` asks) answers the account open, or closed for the
   ``closed`` plan; it flaps in a window of the run (503s and answers slower than the
   service's timeout), which leaves the validation pending: the run's beat
   (``validation_beat``: the periodic ``account_validations_advance``'s service retries, its
   clock moved to the next retry's time, as ``demo/bank_day.py`` moves the calendar) asks it
   again;
3. ``micro_entries``: the holder reads the two credits off the processor's statement
   (``GET /_sandbox/statement``), sends one wrong try, then several clients verify at once (the
   right amounts, in either order, one wrong and one malformed); for the ``micro_wrong`` plan
   ``WRONG_RACERS`` clients send wrong amounts at once, and the validation fails with its tries
   spent; when the processor's faults kept the credits from going out (the validation
   failed), the merchant starts it again after a pause, up to ``MICRO_ROUNDS`` rounds, with a
   debit held on each; a round whose start a fault cut after its commit stays pending with
   nothing sent, and the periodic round fails it at its expiry (``validation_remaining``:
   the clock moved there);
4. once the validation ended (``GET .../validation/``), a third WEB debit: sent at once when
   validated, refused 409 ``account_not_validated`` when failed.

The invariants ``web_debits_validated_first`` (against the processor's own record of its
debits), ``held_debits_decided_once``, ``refused_web_debits_left_nothing`` and
``micro_entry_attempts_bounded`` then check the run, told that it was configured with this
share: a run that held, refused or verified nothing fails them.
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import requests

from chaos.config import MERCHANTS
from chaos.load import _Client
from chaos.review import LIMITED_MERCHANTS

# The share of CHAOS_PAYMENTS that are WEB debits from new accounts, and their accounts' floor.
VALIDATION_SHARE = Decimal("0.12")
DEBITS_PER_ACCOUNT = 3
MIN_ACCOUNTS = 8
# Each account's plan, in turn: its method and the answer it is driven to.
PLANS = ("service_open", "micro_right", "service_closed", "micro_wrong")
# Clients verifying one account at once: the right plan's (two right, one reordered right, one
# wrong, one malformed), and the wrong plan's, all wrong: at most MICRO_ENTRY_MAX_ATTEMPTS count.
WRONG_RACERS = 6
# The service's timeout, and how long the double's slow answers take (past it).
SERVICE_TIMEOUT_SECONDS = 2.0
SERVICE_SLOW_SECONDS = 3.0
SERVICE_URL_VARIABLE = "CHAOS_VALIDATION_SERVICE_URL"
# Imported by the run's Django processes only (chaos/validation_service.py).
SERVICE = "chaos.validation_service.ChaosValidationService"
# Outside its flap the service answers 503 this often; inside, 503 and slow answers each this.
SERVICE_P_5XX = 0.05
FLAP_P_5XX = 0.35
FLAP_P_SLOW = 0.25
# How long an account waits for its credits to show, and for its validation to end.
CREDITS_WAIT_SECONDS = 60
END_WAIT_SECONDS = 150
ACCOUNT_WORKERS = 4
# Micro-entries rounds an account starts at most, when the processor's faults failed the send.
MICRO_ROUNDS = 3
ROUND_PAUSE_SECONDS = 10


def validation_accounts(payments: int) -> int:
    """How many new accounts the run validates: ``VALIDATION_SHARE`` of its payments, at
    ``DEBITS_PER_ACCOUNT`` debits each, at least ``MIN_ACCOUNTS``."""
    return max(MIN_ACCOUNTS, round(payments * VALIDATION_SHARE / DEBITS_PER_ACCOUNT))


def validation_debits(payments: int) -> int:
    """The WEB debits the run's validation share creates (taken from the load's count)."""
    return validation_accounts(payments) * DEBITS_PER_ACCOUNT


def account_plan(index: int) -> tuple[str, str, str]:
    """(plan, token, merchant) of the run's ``index``-th new account: the plans in turn, on the
    merchants without exposure limits (chaos/review.py)."""
    plan = PLANS[index % len(PLANS)]
    merchant = LIMITED_MERCHANTS + index % (MERCHANTS - LIMITED_MERCHANTS)
    return plan, f"tok_chaosval_{plan}_a{index:04d}", f"merchant-{merchant}"


class ValidationDouble:
    """The validation service on loopback: ``open`` for every account, ``closed`` for a token
    with ``_closed_`` in it; 503 now and then, and while ``flapping`` 503s and answers slower
    than the service's timeout. ``answers`` counts what it answered."""

    def __init__(self, port: int, seed: int) -> None:
        self.flapping = False
        self.answers: Counter = Counter()
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        double = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                length = int(self.headers.get("Content-Length", "0"))
                try:
                    token = json.loads(self.rfile.read(length))["account_token"]
                except (ValueError, KeyError, TypeError):
                    self._answer(400, {"error": "account_token is required"})
                    return
                with double.lock:
                    draw = double.rng.random()
                    flapping = double.flapping
                if draw < (FLAP_P_5XX if flapping else SERVICE_P_5XX):
                    double.count("503")
                    self._answer(503, {"error": "unavailable (injected)"})
                    return
                if flapping and draw < FLAP_P_5XX + FLAP_P_SLOW:
                    double.count("slow")
                    time.sleep(SERVICE_SLOW_SECONDS)
                status = "closed" if "_closed_" in token else "open"
                double.count(status)
                self._answer(200, {"status": status, "check_id": f"chk_{uuid.uuid4().hex[:12]}"})

            def _answer(self, status: int, body: dict) -> None:
                payload = json.dumps(body).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except OSError:
                    pass  # the service gave up waiting (a slow answer)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def count(self, kind: str) -> None:
        with self.lock:
            self.answers[kind] += 1

    def start(self) -> ValidationDouble:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _code(response: requests.Response) -> str:
    try:
        return str(response.json()["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return ""


class Validation:
    """The run's validation steps, as methods of the run (``ChaosRun``), which holds the config,
    the ports, the API token, ``stopping``, ``log`` and the validation's records."""

    def validation_service_start(self) -> None:
        self.validation_double = ValidationDouble(self.ports["validation"], self.config.seed)
        self.validation_double.start()

    def service_flap(self, at: float, seconds: float) -> None:
        """The validation service flaps for ``seconds`` from ``at``."""
        if self.stopping.wait(max(0.0, at - time.monotonic())):
            return
        self.validation_double.flapping = True
        self.log(f"fault: the validation service flaps for {seconds:.0f} s (503s, slow answers)")
        self.stopping.wait(seconds)
        self.validation_double.flapping = False
        self.log("fault: the validation service answers again")

    def validation_beat(self, at: float) -> None:
        """The periodic round's service retries, every two seconds until the run stops, each
        with its clock at the earliest retry due (the production waits are minutes)."""
        from django.db import DatabaseError, connection

        from payments.models import AccountValidation, ValidationMethod, ValidationState
        from payments.services.validation import service_validations_retry

        if self.stopping.wait(max(0.0, at - time.monotonic())):
            return
        while not self.stopping.wait(2):
            try:
                due = (
                    AccountValidation.objects.filter(
                        method=ValidationMethod.SERVICE,
                        state=ValidationState.PENDING,
                        retry_at__isnull=False,
                    )
                    .order_by("retry_at")
                    .values_list("retry_at", flat=True)
                    .first()
                )
                if due is None:
                    continue
                now = max(datetime.now(UTC), due) + timedelta(seconds=1)
                self.validation_counts["beat rounds"] += 1
                self.validation_counts["service validations ended by the beat"] += (
                    service_validations_retry(now=now)
                )
            except DatabaseError:
                connection.close()  # the run's database faults: the next round

    def validation_drive(self, at: float, until: float) -> None:
        """Every new account's plan, started evenly from ``at`` to ``until``,
        ``ACCOUNT_WORKERS`` at a time."""
        if self.stopping.wait(max(0.0, at - time.monotonic())):
            return
        count = validation_accounts(self.config.payments)
        interval = max(until - at, 0) / count
        queue = list(reversed(range(count)))
        lock = threading.Lock()

        def work() -> None:
            while not self.stopping.is_set():
                with lock:
                    if not queue:
                        return
                    index = queue.pop()
                delay = at + index * interval - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                self.validation_account(index)

        workers = [threading.Thread(target=work, daemon=True) for _ in range(ACCOUNT_WORKERS)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        self.log(f"validation: {count} accounts driven: {dict(self.validation_counts)}")

    def validation_remaining(self, timeout: float = 300) -> None:
        """Wait for the accounts still being driven (their validations ending), before the run
        waits to settle: the checks see each held debit decided."""
        if self.validation_thread is not None:
            self.validation_thread.join(timeout)
            if self.validation_thread.is_alive():
                self.log(f"the validation share was still running after {timeout:.0f} s")
        self.micro_entries_expire_remaining()

    def micro_entries_expire_remaining(self) -> None:
        """The periodic round at the expiry of the micro-entries still pending (a start whose
        send a fault cut: nothing more comes for it), its clock moved there as the service
        retries' is: each fails, and its held debits with it, once."""
        from django.db import DatabaseError, connection
        from django.db.models import Max

        from payments.models import AccountValidation, ValidationMethod, ValidationState
        from payments.services.validation import micro_entries_expire

        for _ in range(5):  # through the run's database faults
            try:
                pending = AccountValidation.objects.filter(
                    method=ValidationMethod.MICRO_ENTRIES, state=ValidationState.PENDING
                )
                last = pending.aggregate(last=Max("expires_at"))["last"]
                if last is None:
                    return
                ended = micro_entries_expire(now=last + timedelta(seconds=1))
            except DatabaseError:
                connection.close()
                time.sleep(1)
                continue
            self.validation_counts["micro-entries left pending, failed at their expiry"] += ended
            self.log(f"validation: {ended} micro-entries validation(s) left pending, expired")
            return

    def validation_account(self, index: int) -> None:
        plan, token, merchant = account_plan(index)
        rng = random.Random(self.config.seed * 7919 + index)
        counts = self.validation_counts
        self.web_debit(index, 0, token, merchant, rng)
        method = "service" if plan.startswith("service") else "micro_entries"
        body = {"merchant_id": merchant, "method": method}
        started = self.account_post(token, "validation/", body)
        counts[f"validation start answered {started}"] += 1
        self.web_debit(index, 1, token, merchant, rng)
        if method == "micro_entries":
            for round_number in range(MICRO_ROUNDS):
                if self.micro_entries_verify(token, wrong=plan == "micro_wrong"):
                    break
                if round_number == MICRO_ROUNDS - 1:
                    break
                # The processor's faults kept the credits from going out, which failed the
                # validation (and its held debits): the merchant starts it again, a debit is
                # held on the new round.
                counts["micro-entries not sent: validation started again"] += 1
                self.stopping.wait(ROUND_PAUSE_SECONDS)  # not again inside the same outage
                self.account_post(token, "validation/", body)
                self.web_debit(index, 3 + round_number, token, merchant, rng)
        state = self.validation_end(token)
        counts[f"{plan}: {state}"] += 1
        self.web_debit(index, 2, token, merchant, rng)

    def web_debit(self, index: int, n: int, token: str, merchant: str, rng: random.Random):
        """One WEB debit through the load's client (retried with its key, recorded with the
        load's); a refusal ``account_not_validated`` is kept with when it was sent and
        answered."""
        key = str(uuid.uuid4())
        body = {
            "merchant_id": merchant,
            "amount": f"{Decimal(rng.randint(100, 40_000)) / 100:.2f}",
            "currency": "USD",
            "source_token": token,
            "sec_code": "WEB",
        }
        client = _Client(f"http://127.0.0.1:{self.ports['web']}", self.token, self.load_stats)
        sent = _now()
        client.create(requests.Session(), index * DEBITS_PER_ACCOUNT + n + 1, key, body)
        answered = _now()
        refused = self.load_stats.refused.get(key, "")
        if refused.startswith("account_not_validated:"):
            self.refused_creates.append(
                {**body, "key": key, "sent_at": sent, "answered_at": answered}
            )
            self.validation_counts["WEB debits refused"] += 1
        elif key in self.load_stats.created:
            self.validation_counts["WEB debits created"] += 1

    def account_post(self, token: str, path: str, body: dict, tries: int = 30):
        """POST to ``/api/accounts/<token>/<path>`` through the run's faults: again after a
        connection error or a 5xx, for longer than the database's outage; the answer's status
        and error code, ``"0"`` when none came."""
        url = f"http://127.0.0.1:{self.ports['web']}/api/accounts/{token}/{path}"
        for _ in range(tries):
            try:
                response = requests.post(
                    url, json=body, headers={"Authorization": f"Token {self.token}"}, timeout=15
                )
            except requests.RequestException:
                time.sleep(1)
                continue
            if response.status_code < 500:
                code = _code(response)
                return f"{response.status_code} {code}".strip()
            time.sleep(1)
        return "0"

    def validation_get(self, token: str) -> dict | None:
        url = f"http://127.0.0.1:{self.ports['web']}/api/accounts/{token}/validation/"
        try:
            response = requests.get(
                url, headers={"Authorization": f"Token {self.token}"}, timeout=15
            )
        except requests.RequestException:
            return None
        return response.json() if response.status_code == 200 else None

    def validation_end(self, token: str) -> str:
        """Wait (bounded) until the account's validation ended; its state then."""
        deadline = time.monotonic() + END_WAIT_SECONDS
        state = "unknown"
        while time.monotonic() < deadline:
            found = self.validation_get(token)
            state = found["state"] if found else state
            if state in ("validated", "failed"):
                return state
            time.sleep(1)
        return state

    def statement_credits(self, token: str) -> list[str]:
        """The micro-entry credits of the account's current round that its holder reads on
        the statement (the processor's ``GET /_sandbox/statement``: its credits to the account
        since the round started), or [] when none came in time."""
        url = f"http://127.0.0.1:{self.ports['sandbox']}/_sandbox/statement"
        deadline = time.monotonic() + CREDITS_WAIT_SECONDS
        while time.monotonic() < deadline:
            found = self.validation_get(token)
            if found is not None and found["state"] != "pending":
                return []  # the credits could not be sent: the validation failed
            since = datetime.fromisoformat(found["started_at"]) if found else None
            try:
                entries = requests.get(url, params={"token": token}, timeout=10).json()["entries"]
                amounts = [
                    entry["amount"]
                    for entry in entries
                    if entry.get("direction") == "credit"
                    and entry.get("company_entry_description") == "ACCTVERIFY"
                    and since is not None
                    and datetime.fromisoformat(entry["created_at"]) >= since
                ]
            except (requests.RequestException, ValueError, KeyError, TypeError):
                amounts = []
            if len(amounts) >= 2:
                return amounts[:2]
            time.sleep(1)
        return []

    def micro_entries_verify(self, token: str, *, wrong: bool) -> bool:
        """One wrong try, then clients at once: the right amounts (twice, once reordered), a
        wrong and a malformed one; or, ``wrong``, ``WRONG_RACERS`` wrong ones at once. False
        when the round's credits never showed (its send failed)."""
        amounts = self.statement_credits(token)
        if not amounts:
            self.validation_counts["micro-entries never on the statement"] += 1
            return False
        bad = [f"0.{(int(Decimal(a) * 100) % 99) + 1:02d}" for a in amounts]
        if bad == amounts or sorted(bad) == sorted(amounts):
            bad = ["0.99", "0.98"] if sorted(amounts) != ["0.98", "0.99"] else ["0.01", "0.02"]
        if wrong:
            tries = [bad] * WRONG_RACERS
        else:
            self.verify(token, bad)
            tries = [amounts, list(reversed(amounts)), bad, ["0.070", amounts[1]]]
        barrier = threading.Barrier(len(tries))

        def racer(body: list[str]) -> None:
            barrier.wait()
            self.verify(token, body)

        threads = [threading.Thread(target=racer, args=(body,)) for body in tries]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        return True

    def verify(self, token: str, amounts: list[str]) -> None:
        answer = self.account_post(token, "verify/", {"amounts": amounts})
        status, _, code = answer.partition(" ")
        with self.validation_lock:
            self.verify_answers.append(
                {"account_token": token, "status": int(status), "code": code, "at": _now()}
            )
