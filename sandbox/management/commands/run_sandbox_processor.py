"""Run the sandbox processor until SIGINT/SIGTERM."""

import os
import signal
import threading

from django.core.management.base import BaseCommand, CommandError

from callbacks import conf as callbacks_conf
from payments import conf
from sandbox import FaultConfig, SandboxProcessor


def probability(value: str) -> float:
    number = float(value)
    if not 0 <= number <= 1:
        raise ValueError(value)
    return number


def non_negative(value: str) -> float:
    number = float(value)
    if number < 0:
        raise ValueError(value)
    return number


# option name -> (FaultConfig field, argparse type, help)
FAULT_OPTIONS = {
    "--p-5xx": ("p_5xx", probability, "probability of a 503 answer (no charge)"),
    "--p-4xx": ("p_4xx", probability, "probability of a 400 answer to a new key (no charge)"),
    "--p-timeout": (
        "p_timeout",
        probability,
        "probability of sleeping --timeout-seconds before answering; the charge is still made",
    ),
    "--timeout-seconds": ("timeout_seconds", non_negative, "sleep of an injected timeout"),
    "--latency-median-ms": (
        "latency_median_ms",
        non_negative,
        "median of the lognormal answer latency (0 = none)",
    ),
    "--latency-sigma": ("latency_sigma", non_negative, "lognormal shape (heavier tail above 1)"),
    "--latency-max-ms": ("latency_max_ms", non_negative, "cap on one latency sample"),
    "--p-duplicate-callback": (
        "p_duplicate_callback",
        probability,
        "probability that a callback is delivered twice (same processor_event_id)",
    ),
    "--p-delayed-callback": (
        "p_delayed_callback",
        probability,
        "probability that a callback waits --callback-delay-seconds more",
    ),
    "--callback-delay-seconds": ("callback_delay_seconds", non_negative, "delay of a late one"),
    "--p-return": ("p_return", probability, "probability of 'returned' instead of 'settled'"),
    "--p-dropped-callback": (
        "p_dropped_callback",
        probability,
        "probability that a callback is never delivered (GET /v1/events still lists it)",
    ),
    "--settle-after-seconds": (
        "settle_after_seconds",
        non_negative,
        "time between the 'submitted' and the final callback",
    ),
    "--retry-after-seconds": ("retry_after_seconds", int, "Retry-After sent with a 429"),
}


class Command(BaseCommand):
    help = (
        "Run the sandbox ACH processor (POST /v1/ach/debits, GET /v1/ach/debits/<key>, "
        "POST /v1/ach/credits, GET /v1/ach/credits/<key>, "
        "GET /_sandbox/stats, GET /_sandbox/statement?token=<token>, POST /_sandbox/reset) "
        "and send signed callbacks. Every fault "
        "option can also be set in the environment as SANDBOX_<NAME> (e.g. SANDBOX_P_5XX=0.1, "
        "SANDBOX_LATENCY_MEDIAN_MS=80, SANDBOX_SEED=7, SANDBOX_CALLBACK_URL=...); options win. "
        "Source-token rules for deterministic runs: tok_fail5xx_<N>, tok_timeout_<N>, "
        "tok_429_<N> (first N calls fail that way), tok_reject (always 400), tok_return "
        "(returned instead of settled), tok_nsf / tok_unauth (settled, then returned R01 / "
        "R10), tok_nsfonce (as tok_nsf for the token's first debit only), tok_noc and "
        "tok_noc_<Cnn> (settled, then a notification of change), tok_dupcb (every callback "
        "twice), tok_steady (settled, never a random fault or return); a credit's destination "
        "token naming R02, R03, R04 or R23 (tok_payout_R03): "
        "settled, then returned with that code."
    )

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1", help="default 127.0.0.1 (loopback)")
        parser.add_argument("--port", type=int, default=8700, help="0 picks a free port")
        parser.add_argument(
            "--callback-url",
            default=None,
            help="where to POST callbacks (env SANDBOX_CALLBACK_URL); none: callbacks are "
            "not sent, debits still reach their final status",
        )
        parser.add_argument("--seed", type=int, default=None, help="env SANDBOX_SEED")
        parser.add_argument(
            "--api-key", default=None, help="expected bearer key; default PROCESSOR_API_KEY"
        )
        parser.add_argument(
            "--signing-secret",
            default=None,
            help="callback signing secret; default the first of CALLBACK_SIGNING_SECRETS",
        )
        parser.add_argument("--callback-max-attempts", type=int, default=5)
        parser.add_argument("--callback-backoff-seconds", type=non_negative, default=0.5)
        for option, (field, kind, help_text) in FAULT_OPTIONS.items():
            parser.add_argument(option, dest=field, type=kind, default=None, help=help_text)

    def handle(self, *args, **options):
        try:
            faults = FaultConfig.from_env(
                **{field: options[field] for field, _, _ in FAULT_OPTIONS.values()}
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        seed = options["seed"]
        if seed is None and os.environ.get("SANDBOX_SEED"):
            try:
                seed = int(os.environ["SANDBOX_SEED"])
            except ValueError:
                raise CommandError(
                    f"SANDBOX_SEED={os.environ['SANDBOX_SEED']!r} is not an integer"
                ) from None
        callback_url = options["callback_url"] or os.environ.get("SANDBOX_CALLBACK_URL") or None
        sandbox = SandboxProcessor(
            host=options["host"],
            port=options["port"],
            api_key=options["api_key"] or conf.PROCESSOR_API_KEY,
            callback_url=callback_url,
            signing_secret=options["signing_secret"] or callbacks_conf.CALLBACK_SIGNING_SECRETS[0],
            faults=faults,
            seed=seed,
            callback_max_attempts=options["callback_max_attempts"],
            callback_backoff_seconds=options["callback_backoff_seconds"],
        )
        try:
            sandbox.start()
        except OSError as exc:
            raise CommandError(
                f"cannot listen on {options['host']}:{options['port']}: {exc}"
            ) from None
        stop = threading.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: stop.set())
        self.stdout.write(f"LISTENING {sandbox.port}")
        self.stdout.write(
            f"sandbox processor at {sandbox.base_url}; callbacks to {callback_url or '(none)'}; "
            f"seed {seed}; faults {faults}"
        )
        self.stdout.flush()
        while not stop.wait(0.5):
            pass
        sandbox.stop()
        stats = sandbox.stats()
        self.stdout.write(
            f"stopped: {stats['total_charges']} charges, {stats.get('callbacks_sent', 0)} "
            f"callbacks sent, {stats.get('callbacks_pending', 0)} undelivered"
        )
