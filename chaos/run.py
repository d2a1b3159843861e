"""The chaos run from start to end: set up the database and the stack, drive the load while the
fault schedule runs, wait until nothing moves, then check the invariants and the API's answers."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from collections import Counter

from chaos.config import (
    DATABASE_OUTAGE_SECONDS,
    MERCHANTS,
    PROCESSOR_FLAP_SECONDS,
    PROCESSOR_OUTAGE_SECONDS,
    PULL_EVERY_SECONDS,
    PYTHON,
    QUEUE_OUTAGE_SECONDS,
    VAR,
    VISIBILITY_TIMEOUT,
    WEBHOOK_RECEIVER_FAILS_FIRST,
    Config,
    SetupError,
    environment,
)
from chaos.faults import Faults
from chaos.load import LoadStats, create_payments
from chaos.processes import Child, TcpProxy, wait_tcp
from chaos.review import Review
from chaos.settling import Settling
from chaos.summary import check_api, recheck_command, summary, write_report
from chaos.validation import Validation, validation_debits
from devstack.processes import (
    ROOT,
    database_create,
    database_url,
    fauxqs_command,
    free_port,
    gunicorn_command,
    worker_command,
)


class ChaosRun(Faults, Settling, Review, Validation):
    """One run: the processes it started, the faults it injected and what they did."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.events: list[str] = []  # what was injected, when
        self.t0 = time.monotonic()
        names = ("fauxqs", "proxy", "web", "sandbox", "validation")
        self.ports = {name: free_port() for name in names}
        self.database_url = database_url(config.database)
        self.record_path = VAR / "sandbox-record.json"
        self.env = environment(self.ports, self.database_url)
        self.children: dict[str, Child] = {}
        self.proxy: TcpProxy | None = None
        self.workers: list[Child] = []
        self.webhooks = None  # the run's WebhookReceiver, started with the run's database
        self.supervisor: threading.Thread | None = None
        self.stopping = threading.Event()
        self.pg_terminated = 0
        self.database_outages = 0
        self.web_kills = 0
        self.harness_errors: list[str] = []
        self.injected: list[dict] = []  # callbacks this run sent as a faulty processor would
        # Of those, the events the processor really made (a debit's return after its refund):
        # its own list of events holds them, for the final states.
        self.injected_made: list[dict] = []
        self.token = ""
        self.reviewer = None  # the user deciding held payments (chaos/review.py)
        self.review_counts: Counter = Counter()
        self.payouts_raced = False
        # The validation share (chaos/validation.py): its double, the creates it had refused,
        # the answers its clients got to their micro-entry amounts, what it did.
        self.load_stats = LoadStats()
        self.validation_double = None
        self.validation_thread: threading.Thread | None = None
        self.validation_lock = threading.Lock()
        self.refused_creates: list[dict] = []
        self.verify_answers: list[dict] = []
        self.validation_counts: Counter = Counter()

    def log(self, message: str) -> None:
        line = f"[{time.monotonic() - self.t0:7.1f}s] {message}"
        self.events.append(line)
        print(line, flush=True)

    # --- set-up
    def database_create(self) -> None:
        database_create(self.config.database)
        self.manage("migrate", "--no-input", "-v", "0")
        self.log(f"database {self.config.database} created and migrated")

    def manage(self, *args: str, timeout: float = 120) -> str:
        result = subprocess.run(
            [PYTHON, "manage.py", *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if result.returncode != 0:
            raise SetupError(
                f"manage.py {' '.join(args)} failed ({result.returncode}): "
                f"{(result.stderr or result.stdout)[-2000:]}"
            )
        return result.stdout

    def django_setup(self) -> str:
        """Set up Django in this process against the run's database; return an API token."""
        os.environ.clear()
        os.environ.update(self.env)
        import django

        django.setup()
        from django.contrib.auth import get_user_model
        from rest_framework.authtoken.models import Token

        from payments.models import MerchantAccess

        user = get_user_model().objects.create_user("chaos")
        # The API acts only for granted merchants: the load's merchants are granted.
        MerchantAccess.objects.bulk_create(
            MerchantAccess(user=user, merchant_id=f"merchant-{i}") for i in range(MERCHANTS)
        )
        self.risk_setup()
        self.webhooks_endpoints()
        self.validation_service_start()
        return Token.objects.create(user=user).key

    def webhooks_endpoints(self) -> None:
        """A verifying receiver in this process, failing for a while first, and an endpoint
        per merchant: every other one thin and ordered, the others alternating between the
        API's versions."""
        from payments.api_versions import VERSIONS
        from payments.webhooks.services import webhook_endpoint_create
        from sandbox.webhook_receiver import WebhookReceiver

        self.webhooks = WebhookReceiver().start()
        self.webhooks.fail_first = WEBHOOK_RECEIVER_FAILS_FIRST
        for i in range(MERCHANTS):
            endpoint = webhook_endpoint_create(
                merchant_id=f"merchant-{i}",
                url=f"{self.webhooks.url}/{i}",
                event_types=[],
                thin=i % 2 == 1,
                ordered=i % 2 == 1,
                # Every version's shapes at size: the full endpoints alternate between them.
                api_version=VERSIONS[i // 2 % len(VERSIONS)],
            )
            self.webhooks.secrets.append(endpoint.secret)

    def start_stack(self) -> None:
        ports = self.ports
        fauxqs = Child("fauxqs", fauxqs_command(ports["fauxqs"]), self.env).start()
        self.children["fauxqs"] = fauxqs
        wait_tcp(ports["fauxqs"], 15, fauxqs)
        self.proxy = TcpProxy(ports["proxy"], ports["fauxqs"]).start()
        self.log(f"fauxqs on :{ports['fauxqs']}, reached through the proxy on :{ports['proxy']}")
        print(self.manage("setup_queues", "--visibility-timeout", str(VISIBILITY_TIMEOUT)))
        # Bound, worker and thread counts from the environment's GUNICORN_*.
        web = Child("web", gunicorn_command(), self.env).start()
        self.children["web"] = web
        wait_tcp(ports["web"], 30, web)
        callback_url = f"http://127.0.0.1:{ports['web']}/callbacks/processor/"
        sandbox = Child(
            "sandbox",
            [
                PYTHON, "-m", "chaos.recorded_sandbox",
                "--port", str(ports["sandbox"]),
                "--callback-url", callback_url,
                "--seed", str(self.config.seed),
                "--record", str(self.record_path),
            ],
            self.env,
        ).start()  # fmt: skip
        self.children["sandbox"] = sandbox
        wait_tcp(ports["sandbox"], 30, sandbox)
        # The pull of the processor's events, which recovers the callbacks the sandbox drops.
        pull = Child(
            "pull",
            [PYTHON, "manage.py", "processor_events_pull", "--every", str(PULL_EVERY_SECONDS)],
            self.env,
        ).start()
        self.children["pull"] = pull
        command = worker_command(wait_time=1, visibility_timeout=VISIBILITY_TIMEOUT)
        for n in (1, 2):
            worker = Child(f"worker{n}", command, self.env).start()
            self.children[worker.name] = worker
            self.workers.append(worker)
        # The webhook sender, SIGKILLed with the workers: what it held is sent again.
        sender = Child(
            "webhooks", [PYTHON, "manage.py", "webhooks_deliver", "--interval", "0.5"], self.env
        ).start()
        self.children[sender.name] = sender
        self.workers.append(sender)
        self.log(
            f"web :{ports['web']}, sandbox :{ports['sandbox']}, 2 workers "
            f"(visibility {VISIBILITY_TIMEOUT} s), the events pull every {PULL_EVERY_SECONDS} s"
        )

    # --- the whole run
    def run(self) -> int:
        VAR.mkdir(parents=True, exist_ok=True)
        for old in VAR.glob("*"):
            old.unlink()
        config = self.config
        self.log(
            f"chaos: {config.payments} payments, {config.seconds} s of faults, seed "
            f"{config.seed}, database {config.database}"
        )
        self.database_create()
        token = self.token = self.django_setup()
        self.start_stack()
        load = self.drive(token)
        self.risk_payouts_late()
        self.review_remaining()
        self.validation_remaining()
        settled, backlog = self.wait_quiet()
        self.log(f"{'settled' if settled else 'DID NOT SETTLE'}: {backlog}")
        self.stopping.set()
        assert self.supervisor is not None
        self.supervisor.join(timeout=5)
        try:
            dead_letters = self.ingest_dead_letters()
            self.log(f"ingest_dlq stored {dead_letters} dead letter(s)")
        except (SetupError, subprocess.TimeoutExpired) as exc:
            dead_letters = -1
            self.log(f"FAILED: ingest_dlq: {exc}")
        for worker in self.workers:
            worker.stop()
        self.children["pull"].stop()
        self.children["sandbox"].stop(timeout=30)
        record = json.loads(self.record_path.read_text())
        return self.verdict(load, record, settled, backlog, dead_letters)

    def drive(self, token: str) -> LoadStats:
        """The fault window: the schedule's threads start, the load runs over its first 70 %,
        and the window ends when both have."""
        config = self.config
        start = time.monotonic()
        end = start + config.seconds
        load = self.load_stats
        self.supervisor = self.thread(self.supervise)
        fault_threads = self.fault_schedule(start, end)
        # The validation share's accounts: over the load's window, each waiting for its end.
        self.validation_thread = self.thread(
            self.validation_drive, start + config.seconds * 0.05, start + config.seconds * 0.55
        )
        # The periodic round's service retries, until the run stops (not joined with the faults).
        beat = self.thread(self.validation_beat, start)
        # Beat's fold of the available totals, beside the payouts and the faults.
        fold = self.thread(self.totals_fold_beat)
        for thread in [self.supervisor, *fault_threads, self.validation_thread, beat, fold]:
            thread.start()
        create_payments(
            base_url=f"http://127.0.0.1:{self.ports['web']}",
            token=token,
            config=config,
            spread_seconds=config.seconds * 0.7,
            stats=load,
            count=config.payments - validation_debits(config.payments),
        )
        self.log(
            f"load done: {len(load.created)} payments created, {load.retries} retries, "
            f"answers {dict(load.statuses)}"
        )
        remaining = end - time.monotonic()
        if remaining > 0:
            self.stopping.wait(remaining)
        for thread in fault_threads:
            thread.join(timeout=15)
        self.log("fault window over; waiting for the system to settle")
        return load

    def totals_fold_beat(self) -> None:
        """Beat's ``payments.tasks.available_totals_fold``, every three seconds until the run
        stops (every minute in production): the fold of the ledger's changes into the totals
        payouts read runs beside the payouts, the refunds and the database's faults, and the
        checker's ``balances_match_entries`` holds the totals to the ledger at the end."""
        from django.db import DatabaseError, connection

        from payments.tasks import available_totals_fold

        rounds = folded = failed = 0
        while not self.stopping.wait(3):
            try:
                folded += available_totals_fold()
                rounds += 1
            except DatabaseError:
                failed += 1
                connection.close()  # the run's database faults: the next round
        connection.close()
        self.log(
            f"available totals folded by the beat: {rounds} rounds, {folded} merchant "
            f"currencies, {failed} rounds the database failed"
        )

    def fault_schedule(self, start: float, end: float) -> list[threading.Thread]:
        """Every fault's thread, each at its share of the window: the processor's outage late
        enough to leave room for its flap before the window ends."""
        seconds = self.config.seconds
        outage_at = start + max(seconds - PROCESSOR_OUTAGE_SECONDS - 10, 0) * 0.6
        return [
            self.thread(self.kill_workers, end),
            self.thread(self.queue_outage, start + seconds * 0.35, QUEUE_OUTAGE_SECONDS),
            self.thread(self.processor_outage, outage_at, float(PROCESSOR_OUTAGE_SECONDS)),
            self.thread(
                self.processor_flap,
                outage_at + PROCESSOR_OUTAGE_SECONDS + 2,
                float(PROCESSOR_FLAP_SECONDS),
            ),
            self.thread(
                self.database_outage, start + seconds * 0.1, float(DATABASE_OUTAGE_SECONDS)
            ),
            self.thread(self.kill_web_workers, [start + seconds * f for f in (0.3, 0.55)]),
            self.thread(self.inject_processor_bugs, start + seconds * 0.6),
            self.thread(self.inject_dishonor_answers, start + seconds * 0.75, end),
            self.thread(self.money_out, start + seconds * 0.25, end),
            self.thread(self.review_holds, start + seconds * 0.15, end),
            self.thread(self.risk_payouts, start + seconds * 0.4, end),
            self.thread(self.terminate_backends, [start + seconds * f for f in (0.2, 0.5, 0.8)]),
            self.thread(self.service_flap, start + seconds * 0.2, seconds * 0.2),
        ]

    def verdict(
        self, load: LoadStats, record: dict, settled: bool, backlog: dict, dead_letters: int
    ) -> int:
        """Check the invariants and the API's answers, print and keep the report; the exit
        status the module docstring lists."""
        from django.db import connection

        from chaos.invariants import check_invariants

        connection.close()
        sent = record["delivered"] + self.injected
        # What the checker reads, kept so it can be re-run on this database by hand.
        (VAR / "sandbox-stats.json").write_text(json.dumps(record["stats"]))
        (VAR / "callbacks-sent.json").write_text(json.dumps(sent))
        (VAR / "callbacks-dropped.json").write_text(json.dumps(record.get("dropped", [])))
        # The processor's own list of the events it made (delivered, dropped, or given up
        # after its retries), not the injected, with the ones the run made on its behalf.
        made = record["events"] + self.injected_made
        (VAR / "processor-events.json").write_text(json.dumps(made))
        receipts = list(self.webhooks.receipts)
        (VAR / "webhook-receipts.json").write_text(json.dumps(receipts))
        (VAR / "processor-debits.json").write_text(json.dumps(record.get("debits", [])))
        (VAR / "refused-creates.json").write_text(json.dumps(self.refused_creates))
        (VAR / "verify-answers.json").write_text(json.dumps(self.verify_answers))
        report = check_invariants(
            sandbox_stats=record["stats"],
            callbacks_sent=sent,
            callbacks_dropped=record.get("dropped", []),
            processor_events=made,
            webhook_receipts=receipts,
            # The run set limits its load reaches and a rule that holds (chaos/review.py).
            expect_limits=True,
            expect_holds=True,
            # Its validation share (chaos/validation.py): held, refused and verified some.
            processor_debits=record.get("debits"),
            refused_creates=self.refused_creates,
            verify_answers=self.verify_answers,
            expect_validation=True,
        )
        api_problems = check_api(load)
        print(summary(self, load, record["stats"], settled, backlog, dead_letters))
        print(report.render())
        for problem in api_problems:
            print(f"  FAIL api: {problem}")
        write_report(
            self,
            load=load,
            record=record,
            report=report,
            settled=settled,
            backlog=backlog,
            api_problems=api_problems,
        )
        print(recheck_command(self.database_url, PYTHON, ROOT))
        if not report.ok or api_problems:
            return 1
        if self.harness_errors:
            print(f"chaos: the fault schedule did not run fully: {self.harness_errors}")
            return 2
        return 0 if settled else 3

    def shutdown(self) -> None:
        self.stopping.set()
        for child in reversed(list(self.children.values())):
            try:
                child.stop(timeout=10)
            except Exception as exc:  # noqa: BLE001 - stop the others whatever happens
                print(f"stopping {child.name}: {exc}", file=sys.stderr)
        if self.proxy is not None:
            self.proxy.close()
        if self.webhooks is not None:
            self.webhooks.stop()
        if self.validation_double is not None:
            self.validation_double.stop()


def main() -> int:
    try:
        config = Config.from_env()
    except SetupError as exc:
        print(f"chaos: {exc}", file=sys.stderr)
        return 2
    run = ChaosRun(config)
    try:
        return run.run()
    except SetupError as exc:
        print(f"chaos: cannot run: {exc}", file=sys.stderr)
        return 2
    finally:
        run.shutdown()
