"""The chaos run's fault schedule: each fault a method run in its own thread at its time, all
bounded in count and length, each logged as it is injected."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid
from pathlib import Path

import requests

from chaos.config import PROCESSOR_OUTAGE_MODE, RETRY_BUDGET_SECONDS
from chaos.load import post_through_faults


class Faults:
    """The faults, as methods of the run (``ChaosRun``), which holds what they read: its
    children and workers, the proxy, the ports, the environment, ``stopping`` and ``log``."""

    def thread(self, target, *args) -> threading.Thread:
        """A daemon thread whose failure is reported: a fault that was not injected would make
        a passing run mean less than it says."""

        def run() -> None:
            try:
                target(*args)
            except Exception as exc:  # noqa: BLE001 - reported and fails the run
                self.harness_errors.append(f"{target.__name__}: {type(exc).__name__}: {exc}")
                self.log(f"HARNESS ERROR in {target.__name__}: {type(exc).__name__}: {exc}")

        return threading.Thread(target=run, name=target.__name__, daemon=True)

    def supervise(self) -> None:
        """Restart a worker that exited on its own (and say so: that is worth a look)."""
        while not self.stopping.wait(0.5):
            for worker in self.workers:
                code = worker.check_exit()
                if code is not None:
                    self.log(f"UNEXPECTED: {worker.name} exited by itself with status {code}")
                    worker.start()
            pull = self.children.get("pull")
            if pull is not None and (code := pull.check_exit()) is not None:
                self.log(f"UNEXPECTED: pull exited by itself with status {code}")
                pull.start()
            for name in ("web", "sandbox", "fauxqs"):
                code = self.children[name].check_exit()
                if code is not None:
                    self.log(f"UNEXPECTED: {name} exited with status {code}; not restarted")

    def kill_workers(self, until: float) -> None:
        n = 0
        while not self.stopping.wait(self.rng.uniform(3, 6)):
            if time.monotonic() > until:
                return
            worker = self.workers[n % len(self.workers)]
            n += 1
            if worker.sigkill():
                self.log(f"fault: SIGKILL {worker.name}")
                time.sleep(0.5)
                worker.start()

    def kill_web_workers(self, times: list[float]) -> None:
        """SIGKILL one gunicorn worker (the master starts another): requests in flight die,
        so the API's clients retry with their Idempotency-Key and the processor its callbacks."""
        for at in times:
            if self.stopping.wait(max(0.0, at - time.monotonic())):
                return
            master = self.children["web"].process
            if master is None:
                continue
            try:
                children = Path(f"/proc/{master.pid}/task/{master.pid}/children").read_text()
            except OSError:
                continue
            pids = [int(p) for p in children.split()]
            if pids:
                os.kill(pids[0], signal.SIGKILL)
                self.web_kills += 1
                self.log(f"fault: SIGKILL gunicorn worker {pids[0]}")

    def queue_outage(self, at: float, seconds: float) -> None:
        if self.stopping.wait(max(0.0, at - time.monotonic())):
            return
        assert self.proxy is not None
        self.proxy.cut()
        self.log(f"fault: queue endpoint down for {seconds:.0f} s (proxy cut)")
        self.stopping.wait(seconds)
        self.proxy.restore()
        self.log("fault: queue endpoint back")

    def processor_outage(self, at: float, seconds: float) -> None:
        """The processor goes down as a whole (the sandbox's outage mode, over HTTP)."""
        if self.stopping.wait(max(0.0, at - time.monotonic())):
            return
        url = f"http://127.0.0.1:{self.ports['sandbox']}/_sandbox/outage"
        response = requests.post(
            url, json={"mode": PROCESSOR_OUTAGE_MODE, "seconds": seconds}, timeout=10
        )
        response.raise_for_status()
        self.log(
            f"fault: processor down ({PROCESSOR_OUTAGE_MODE}) for {seconds:.0f} s, "
            f"{seconds / RETRY_BUDGET_SECONDS:.1f}x the retry budget"
        )
        self.stopping.wait(seconds)
        self.log("fault: processor back")

    def processor_flap(self, at: float, seconds: float) -> None:
        """The processor flaps: every other debit fails (the sandbox's "flap" outage mode)."""
        if self.stopping.wait(max(0.0, at - time.monotonic())):
            return
        url = f"http://127.0.0.1:{self.ports['sandbox']}/_sandbox/outage"
        requests.post(url, json={"mode": "flap", "seconds": seconds}, timeout=10).raise_for_status()
        self.log(f"fault: processor flapping (every other debit 503) for {seconds:.0f} s")
        self.stopping.wait(seconds)
        self.log("fault: processor flap over")

    def database_outage(self, at: float, seconds: float) -> None:
        """The run's database refuses new connections and loses its open ones for ``seconds``
        (the shared server stays up for everyone else)."""
        import psycopg
        from psycopg import sql

        if self.stopping.wait(max(0.0, at - time.monotonic())):
            return
        name = sql.Identifier(self.config.database)
        admin = "postgresql://postgres@127.0.0.1:5432/postgres"
        try:
            with psycopg.connect(admin, autocommit=True) as c:
                c.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false").format(name))
                rows = c.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = %s AND pid <> pg_backend_pid()",
                    (self.config.database,),
                ).fetchall()
            self.database_outages += 1
            self.log(f"fault: database down for {seconds:.0f} s ({len(rows)} connection(s) cut)")
            self.stopping.wait(seconds)
        finally:
            with psycopg.connect(admin, autocommit=True) as c:
                c.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS true").format(name))
            self.log("fault: database back")

    def terminate_backends(self, times: list[float]) -> None:
        import psycopg

        for at in times:
            if self.stopping.wait(max(0.0, at - time.monotonic())):
                return
            try:
                with psycopg.connect(
                    "postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True
                ) as c:
                    rows = c.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE datname = %s AND pid <> pg_backend_pid()",
                        (self.config.database,),
                    ).fetchall()
            except psycopg.Error as exc:
                self.log(f"could not terminate backends: {exc}")
                continue
            self.pg_terminated += len(rows)
            self.log(f"fault: pg_terminate_backend on {len(rows)} connection(s)")

    def post_callback(self, body: dict) -> bool:
        """Deliver one signed callback as the processor does, retrying 5xx and connection errors
        for up to 30 s; True once it is accepted (202)."""
        from payments import signing

        raw = json.dumps(body, separators=(",", ":")).encode()
        url = f"http://127.0.0.1:{self.ports['web']}/callbacks/processor/"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not self.stopping.is_set():
            headers = {
                "Content-Type": "application/json",
                signing.HEADER: signing.sign(raw, [self.env["CALLBACK_SIGNING_SECRETS"]]),
            }
            try:
                response = requests.post(url, data=raw, headers=headers, timeout=10)
            except requests.RequestException:
                time.sleep(1)
                continue
            if response.status_code == 202:
                self.injected.append(body)
                return True
            if response.status_code < 500:
                self.log(f"injected callback refused ({response.status_code}): {response.text}")
                return False
            time.sleep(1)
        return False

    def inject_processor_bugs(self, at: float) -> None:
        """Callbacks a faulty processor sends, which must end in front of a human, not vanish:
        ``settled`` for a payment it rejected (then ``failed`` for it, which must wait behind the
        hold), an event for a payment that does not exist, and a reused processor_event_id with
        another amount (a conflict)."""
        if self.stopping.wait(max(0.0, at - time.monotonic())):
            return
        from django.db import connection
        from django.utils import timezone

        from payments.models import EventOutcome, PaymentEvent, PaymentState
        from payments.models import Payment as PaymentModel

        connection.close()  # it may have been terminated
        now = timezone.now().isoformat()

        def event(payment_id: str, event_type: str, amount: str, event_id: str = "") -> dict:
            return {
                "payment_id": payment_id,
                "event_type": event_type,
                "processor_event_id": event_id or f"evt_chaos_{uuid.uuid4().hex}",
                "amount": amount,
                "timestamp": now,
            }

        rejected = list(
            PaymentModel.objects.filter(
                state=PaymentState.FAILED, source_token__startswith="tok_reject"
            ).values_list("id", "amount")[:2]
        )
        for payment_id, amount in rejected:
            if self.post_callback(event(str(payment_id), "settled", f"{amount:.2f}")):
                self.log(f"fault: processor sent settled for rejected payment {payment_id}")
            time.sleep(1)
            self.post_callback(event(str(payment_id), "failed", f"{amount:.2f}"))
        if self.post_callback(event(str(uuid.uuid4()), "settled", "10.00")):
            self.log("fault: processor sent an event for a payment that does not exist")
        settled = list(
            PaymentEvent.objects.filter(
                event_type="settled", outcome=EventOutcome.APPLIED
            ).values_list("payment_id", "processor_event_id", "payment__amount")[:2]
        )
        for payment_id, event_id, amount in settled:
            body = event(str(payment_id), "settled", f"{amount + 1:.2f}", event_id)
            if self.post_callback(body):
                self.log(
                    f"fault: processor reused event id {event_id} with amount {body['amount']}"
                )

    def inject_dishonor_answers(self, at: float, until: float) -> None:
        """The processor's answers to dishonors of returned payments, out of order and
        redelivered, which must move money exactly once each: a dishonor delivered twice and
        resent under a new id; a contest that overtakes its dishonor, both delivered twice; a
        dishonor then its contest, the contest delivered twice. ``dishonors_booked`` checks the
        ledger against each payment's history afterwards. Returns come some seconds after
        settlement, so it waits (until ``until``) for returned payments to answer for."""
        if self.stopping.wait(max(0.0, at - time.monotonic())):
            return
        from django.db import DatabaseError, connection
        from django.utils import timezone

        from payments.models import Payment as PaymentModel
        from payments.models import PaymentState

        returned: list = []
        while not self.stopping.is_set():
            connection.close()  # it may have been terminated
            try:
                returned = list(
                    PaymentModel.objects.filter(state=PaymentState.RETURNED, dishonor__isnull=True)
                    .order_by("id")
                    .values_list("id", "amount")[:6]
                )
            except DatabaseError:
                returned = []
            if len(returned) >= 3 or time.monotonic() >= until:
                break
            self.stopping.wait(2)
        if not returned:
            self.log("fault: no returned payment yet: no dishonor answers injected")
            return

        def answer(payment_id, amount, event_type: str, code: str) -> dict:
            return {
                "payment_id": str(payment_id),
                "event_type": event_type,
                "processor_event_id": f"evt_chaos_{uuid.uuid4().hex}",
                "amount": f"{amount:.2f}",
                "timestamp": timezone.now().isoformat(),
                "reason_code": code,
            }

        for index, (payment_id, amount) in enumerate(returned):
            dishonored = answer(payment_id, amount, "return_dishonored", "R61")
            contested = answer(payment_id, amount, "dishonor_contested", "R76")
            resent = {**dishonored, "processor_event_id": f"evt_chaos_{uuid.uuid4().hex}"}
            sequence = (
                [dishonored, dishonored, resent],
                [contested, dishonored, contested, dishonored],
                [dishonored, contested, contested],
            )[index % 3]
            for body in sequence:
                self.post_callback(body)
            self.log(
                f"fault: dishonor answers for returned payment {payment_id}: "
                + ", ".join(b["event_type"] for b in sequence)
            )

    def money_out(self, at: float, until: float) -> None:
        """Money out under the same faults: refunds of settled debits (half of each, and five at
        once of 40% of two debits), payouts (five at once of 30% of a merchant's available
        balance), then the returns of debits whose refund was sent, as the processor sends
        them: each must be a double loss, booked and alerted, never silent. The checker holds
        the run to ``refunds_within_collected``, ``payouts_never_overdraw``,
        ``credits_sent_at_most_once``, ``double_losses_flagged`` and
        ``balances_match_entries``."""
        if self.stopping.wait(max(0.0, at - time.monotonic())):
            return
        from django.db import DatabaseError, connection
        from django.db.models import Q
        from django.utils import timezone

        from payments.models import Payment as PaymentModel

        debits: list = []
        while not self.stopping.is_set():
            connection.close()  # it may have been terminated
            try:
                debits = list(
                    PaymentModel.objects.filter(purpose="collection", state="confirmed")
                    .order_by("id")
                    .values_list("id", "amount", "merchant_id")[:10]
                )
            except DatabaseError:
                debits = []
            if len(debits) >= 10 or time.monotonic() >= until - 20:
                break
            self.stopping.wait(2)
        if len(debits) < 4:
            self.log("fault: too few settled debits yet: no money out")
            return
        base = f"http://127.0.0.1:{self.ports['web']}/api"

        def post(path: str, body: dict) -> int:
            # Through the run's web kills and database outages.
            return post_through_faults(f"{base}/{path}", body, token=self.token, tries=10)

        def at_once(calls) -> list[int]:
            results: list = [0] * len(calls)
            threads = [
                threading.Thread(target=lambda i=i, c=c: results.__setitem__(i, c()))
                for i, c in enumerate(calls)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            return results

        half = [
            post(f"payments/{pid}/refunds/", {"amount": f"{amount / 2:.2f}"})
            for pid, amount, _ in debits[:6]
        ]
        raced = []
        for pid, amount, _ in debits[6:8]:
            share = f"{amount * 2 / 5:.2f}"
            raced += at_once(
                [lambda p=pid, s=share: post(f"payments/{p}/refunds/", {"amount": s})] * 5
            )
        merchant = debits[8][2] if len(debits) > 8 else debits[0][2]
        payouts = at_once(
            [
                lambda: post(
                    "payouts/",
                    {
                        "merchant_id": merchant,
                        "amount": "30.00",
                        "destination_token": f"tok_chaos_payout_{merchant}",
                    },
                )
            ]
            * 5
        )
        self.log(
            f"fault: money out: refunds of half {half}, two races of five 40% refunds {raced}, "
            f"five payouts at once for {merchant} {payouts}"
        )
        # The returns of refunded debits once their refund is on its way: double losses.
        # Within the fault window: what is injected must be applied before the run settles.
        deadline = until
        returned = 0
        while returned < 3 and time.monotonic() < deadline and not self.stopping.is_set():
            connection.close()
            try:
                sent = list(
                    PaymentModel.objects.filter(purpose="refund")
                    .filter(
                        Q(state__in=("submitted", "confirmed"))
                        | Q(state="pending", submission_started_at__isnull=False)
                    )
                    .exclude(refund_of__state="returned")
                    .values_list("refund_of_id", "refund_of__amount")
                    .distinct()[:3]
                )
            except DatabaseError:
                sent = []
            for debit_id, amount in sent[: 3 - returned]:
                body = {
                    "payment_id": str(debit_id),
                    "event_type": "returned",
                    "processor_event_id": f"evt_chaos_{uuid.uuid4().hex}",
                    "amount": f"{amount:.2f}",
                    "timestamp": timezone.now().isoformat(),
                    "reason_code": "R10",
                }
                if self.post_callback(body):
                    self.injected_made.append(body)
                    returned += 1
                    self.log(f"fault: processor returned refunded debit {debit_id} (R10)")
            self.stopping.wait(2)
