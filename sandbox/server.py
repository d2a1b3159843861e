"""The sandbox processor: a real HTTP server implementing the processor API our client calls
(``payments/processor/backends/http.py``).

- ``POST /v1/ach/debits`` (``Authorization: Bearer <key>``, ``Idempotency-Key: <uuid>``, JSON
  ``{payment_id, amount, currency, source_token}``, optionally ``sec_code`` (PPD, CCD, WEB) and
  ``company_entry_description`` (1-10 characters, echoed in the answer)): ``201`` and a new
  debit, or ``200`` with the
  ORIGINAL result for a known key (never a second charge); ``409`` while a request with the same
  key is still being processed; ``422`` for a known key with a different request; ``400`` for a
  malformed request, naming the problem; ``401`` without the right key.
- ``GET /v1/ach/debits/<idempotency_key>``: the debit's current status, ``404`` if unknown.
- ``POST /v1/ach/credits`` (money out, JSON ``{payment_id, amount, currency,
  destination_token}``, ``payment_id`` the refund's or payout's id) and
  ``GET /v1/ach/credits/<idempotency_key>``: as the debits, with their own keys (a credit
  and a debit never share one), the same faults by token, and the same callbacks stating
  ``direction: "credit"``: ``submitted``, then ``settled``; a destination token with a credit
  return code in it (``R02``, ``R03``, ``R04`` or ``R23``, e.g. ``tok_payout_R03``) is
  ``returned`` with that code ``return_after_seconds`` after its settlement (the receiving bank
  found no such account). A credit is never returned by chance (``p_return``) nor given a NOC.
- ``POST /v1/ach/debits/<idempotency_key>/dishonors`` (``Idempotency-Key``: the request's own
  UUID, JSON ``{reason_code, return_event_id, ...}``): ``202`` ``{dishonor_id, status}`` and,
  later, the answer as a callback (``return_dishonored``, and ``dishonor_contested`` for the
  tokens ``faults.py`` names); ``200`` with the original result for a known key, ``422`` for a
  known key with another request, ``404`` for an unknown debit, ``409`` for a debit that is not
  returned, ``400`` for a code outside R61-R69 or a malformed request.
- ``GET /_sandbox/stats``: charges per idempotency key and per payment, total charges, and the
  same of credits (``credits_sent``, ``credits_sent_by_payment``, ``total_credits_sent``: each
  credit must be sent at most once per key), answers by status, callbacks sent;
  ``GET /_sandbox/callbacks``: every callback delivered (payment id, event type, processor
  event id); ``POST /_sandbox/reset`` forgets everything (tests, demos).
- ``GET /_sandbox/statement?token=<token>``: the account's statement as its holder reads it,
  every credit to it and debit from it in the order they were made (direction, amount,
  company entry description, time): where a demo reads the micro-entries' amounts, as a
  receiver reads them from the bank statement. ``400`` without a well-formed token.
- ``GET /v1/events?after=<cursor>&limit=<n>`` (bearer auth): every event that happened (its
  callback came due), in that order, whether or not the callback was delivered:
  ``{"data": [<callback body>...], "next_cursor": ..., "has_more": ...}``; cursors are
  opaque, ``limit`` is 1-500 (default 100), an unknown cursor answers 400. Served during an
  outage as the other API calls are (503, timeout, reset).
- ``POST /_sandbox/drops`` with ``{"share": 0..1, "event_types": [...]}`` makes the sandbox drop
  that share of its callbacks (of those event types; all when omitted) on purpose: a dropped
  callback is never delivered, its debit's next event follows as if it had been given up; the
  events API still lists it. ``GET /_sandbox/drops`` tells the share and lists every callback
  dropped (payment id, event type, processor event id). ``SANDBOX_P_DROPPED_CALLBACK`` (or
  ``--p-dropped-callback``) sets the share at start.
- ``POST /_sandbox/outage`` with ``{"mode": "503" | "timeout" | "reset", "seconds": N}`` starts
  a processor outage (``seconds`` omitted: until ended); ``{"mode": "off"}`` ends it;
  ``GET /_sandbox/outage`` tells whether one is on. During an outage every API call answers
  503, or hangs for ``timeout_seconds`` then answers 503 (the client has timed out by then),
  or has its connection closed without an answer (the client sees a connection error). Nothing
  is charged during an outage; callbacks of earlier debits keep being sent. A flap fails only
  debits and credits: every other one (``"flap"``), or each with even odds from the seed
  (``"flap_random"``). Two backends behind a round-robin balancer, one dead, fail every other
  API call of any kind (``"round_robin"``), or every call on every other new connection, for
  as long as the client keeps it (``"flap_connection"``).

After accepting a debit it sends signed callbacks (``submitted``, then ``settled`` or
``returned``, and for some settled debits a ``returned`` some seconds later) to the callback
URL, from background threads. Faults: see ``faults.py``.

Over 500 lines because it is one HTTP server: the debit store, its idempotency rules and the
outage switch share one lock and one request handler; faults, callbacks and the latch, which
stand alone, are modules of their own.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import json
import logging
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

from sandbox.callbacks import CallbackSender, Delivery, DropPlan
from sandbox.faults import DebitFault, FaultConfig, FaultKind, FaultPlan
from sandbox.latch import DebitLatch

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024
_AMOUNT_RE = re.compile(r"^\d{1,12}\.\d{2}$")
_TOKEN_RE = re.compile(r"^[A-Za-z0-9_\-]{1,128}$")
# The entry fields a debit or credit may state (the module's payments.originator): the sandbox is
# not the module, so it keeps its own copy of their grammar.
ENTRY_FIELDS = ("sec_code", "company_entry_description")
SEC_CODES = ("PPD", "CCD", "WEB")
_ENTRY_DESCRIPTION_RE = re.compile(r"[\x20-\x60\x7b-\x7e]{1,10}", re.ASCII)
_DEBIT_PATH = re.compile(r"^/v1/ach/debits/([^/]+)$")
_CREDIT_PATH = re.compile(r"^/v1/ach/credits/([^/]+)$")
# A credit to a token naming one of these codes is returned with it after settlement.
_CREDIT_RETURN_RULE = re.compile(r"(R02|R03|R04|R23)")
_DISHONOR_PATH = re.compile(r"^/v1/ach/debits/([^/]+)/dishonors$")
EVENTS_LIMIT_DEFAULT = 100
EVENTS_LIMIT_MAX = 500
DISHONOR_CODES = ("R61", "R62", "R67", "R68", "R69")


class OutageMode(enum.StrEnum):
    NONE = ""  # no outage
    UNAVAILABLE = "503"  # every API call answers 503
    TIMEOUT = "timeout"  # every API call hangs past the client's timeout, then answers 503
    RESET = "reset"  # every API call has its connection closed without an answer
    FLAP = "flap"  # every other debit answers 503 (the rest, and every other call, work)
    # Each debit answers 503 with even odds, drawn from the fault plan's seeded random: a flap
    # with no period a retry's timing could fall into step with.
    FLAP_RANDOM = "flap_random"
    # Two backends behind a round-robin balancer, one of them down: every other API call,
    # whatever it asks (debits, credits, status reads, event lists), answers 503.
    ROUND_ROBIN = "round_robin"
    # The same balancer pinning each connection to a backend: every other new connection goes to
    # the dead one, and every call on it answers 503 for as long as the client keeps it.
    FLAP_CONNECTION = "flap_connection"


OUTAGE_MODES = (
    OutageMode.UNAVAILABLE,
    OutageMode.TIMEOUT,
    OutageMode.RESET,
    OutageMode.FLAP,
    OutageMode.FLAP_RANDOM,
    OutageMode.ROUND_ROBIN,
    OutageMode.FLAP_CONNECTION,
)


class OutageReset(Exception):
    """The outage mode says: close the connection without answering."""


@dataclass
class Debit:
    idempotency_key: str
    processor_id: str
    payment_id: str
    amount: str
    currency: str
    source_token: str
    status: str
    created_at: str
    request_fingerprint: str
    # "credit": money out, and ``source_token`` is the account the credit goes to.
    direction: str = "debit"
    # The entry's standard entry class and company entry description as submitted ("": the
    # request named none, the processor's default).
    sec_code: str = ""
    company_entry_description: str = ""
    # When the call that made it arrived (``created_at`` follows an injected timeout's sleep):
    # the moment the entry reached the processor, which the chaos run's checks compare.
    received_at: str = ""

    def answer(self) -> dict:
        answer = {
            "processor_id": self.processor_id,
            "status": self.status,
            "idempotency_key": self.idempotency_key,
            "payment_id": self.payment_id,
            "amount": self.amount,
            "currency": self.currency,
            "created_at": self.created_at,
        }
        for name in ENTRY_FIELDS:
            if getattr(self, name):
                answer[name] = getattr(self, name)
        return answer


@dataclass
class Dishonor:
    idempotency_key: str
    dishonor_id: str
    debit_key: str
    reason_code: str
    status: str
    request_fingerprint: str

    def answer(self) -> dict:
        return {
            "dishonor_id": self.dishonor_id,
            "status": self.status,
            "reason_code": self.reason_code,
            "idempotency_key": self.idempotency_key,
        }


class RequestError(Exception):
    def __init__(self, status: int, error: str, errors: dict | None = None) -> None:
        super().__init__(error)
        self.status = status
        self.error = error
        self.errors = errors


@dataclass(frozen=True)
class Answer:
    status: int
    body: dict
    headers: tuple[tuple[str, str], ...] = ()


class SandboxProcessor:
    """Start with ``SandboxProcessor(...).start()``; ``base_url`` then points at it; ``stop()``."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        api_key: str | None = None,
        callback_url: str | None = None,
        signing_secret: str | None = None,
        faults: FaultConfig | None = None,
        seed: int | None = None,
        callback_threads: int = 4,
        callback_max_attempts: int = 5,
        callback_backoff_seconds: float = 0.2,
    ) -> None:
        if api_key is None or signing_secret is None:
            from callbacks import conf as callbacks_conf
            from payments import conf

            api_key = api_key if api_key is not None else conf.PROCESSOR_API_KEY
            if signing_secret is None:
                signing_secret = callbacks_conf.CALLBACK_SIGNING_SECRETS[0]
        if not api_key:
            raise ValueError("the sandbox needs an API key to check the Authorization header")
        if not signing_secret:
            raise ValueError("the sandbox needs a secret to sign callbacks with")
        self.host = host
        self.requested_port = port
        self.api_key = api_key
        self.callback_url = callback_url
        self.signing_secret = signing_secret
        self.plan = FaultPlan(faults or FaultConfig(), seed)
        self._callback_options = {
            "threads": callback_threads,
            "max_attempts": callback_max_attempts,
            "backoff_seconds": callback_backoff_seconds,
        }
        self._lock = threading.Lock()
        self._debits: dict[str, Debit] = {}
        self._credits: dict[str, Debit] = {}  # money out, by its own idempotency keys
        self._credits_sent: Counter[str] = Counter()
        self._credits_sent_by_payment: Counter[str] = Counter()
        self._dishonors: dict[str, Dishonor] = {}
        self._in_flight: set[str] = set()
        # The keys a call was refused for (400, account closed), by direction and key, with
        # that call's fingerprint: the refusal is the key's result, as a charge is.
        self._rejected: dict[tuple[str, str], str] = {}
        self._charges: Counter[str] = Counter()
        self._charges_by_payment: Counter[str] = Counter()
        self._responses: Counter[str] = Counter()
        self._requests: Counter[str] = Counter()
        self._replays = 0
        self._events = 0
        # Every event made, in order (the events API's record), and this record's epoch: a
        # cursor of another sandbox, or from before a reset, is refused instead of misread.
        self._event_log: list[dict] = []
        self._event_logged: set[str] = set()
        self._event_epoch = uuid.uuid4().hex[:8]
        self.events_requests: list[dict] = []  # every GET /v1/events: its after and limit
        self.drops = DropPlan(self.plan.config.p_dropped_callback, seed)
        self._outage_mode = OutageMode.NONE
        self._outage_until: float | None = None  # time.monotonic(); None: until ended
        self._outage_calls = 0
        self._flap_debits = 0
        self._flap_calls = 0
        self._flap_connections = 0
        self.latch: DebitLatch | None = None  # tests: hold debit requests open mid-call
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.callbacks: CallbackSender | None = None

    # --- lifecycle
    def start(self) -> SandboxProcessor:
        self._server = _Server((self.host, self.requested_port), _Handler)
        self.callbacks = CallbackSender(
            url=self.callback_url,
            secret=self.signing_secret,
            drops=self.drops,
            on_due=self._event_happened,
            **self._callback_options,
        )
        self._server.sandbox = self
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            # stop() waits for the serving loop to see its request, up to one interval: the test
            # suite starts and stops a sandbox for hundreds of its tests (0.1 s cost 0.1 s each).
            kwargs={"poll_interval": 0.01},
            name="sandbox-processor",
            daemon=True,
        )
        self._thread.start()
        logger.info("sandbox processor listening on %s", self.base_url)
        return self

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the sandbox is not started")
        return self._server.server_address[1]

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self.callbacks is not None:
            self.callbacks.stop()

    def __enter__(self) -> SandboxProcessor:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # --- state for tests and demos
    def stats(self) -> dict:
        with self._lock:
            stats: dict[str, Any] = {
                "total_charges": sum(self._charges.values()),
                "charges": dict(self._charges),
                "charges_by_payment": dict(self._charges_by_payment),
                "debits": len(self._debits),
                "total_credits_sent": sum(self._credits_sent.values()),
                "credits_sent": dict(self._credits_sent),
                "credits_sent_by_payment": dict(self._credits_sent_by_payment),
                "credits": len(self._credits),
                "dishonors": len(self._dishonors),
                "replays": self._replays,
                "events": self._events,
                "events_requests": len(self.events_requests),
                "callbacks_dropped": len(self.drops.dropped()),
                "outage_calls_failed": self._outage_calls,
                "requests": dict(self._requests),
                "responses": dict(self._responses),
                "seed": self.plan.seed,
                "faults": asdict(self.plan.config),
            }
        sender = self.callbacks
        if sender is not None:
            stats.update(
                {
                    "callbacks_sent": sender.stats["sent"],
                    "callback_attempts": sender.stats["attempts"],
                    "callback_failed_attempts": sender.stats["failed_attempts"],
                    "callbacks_given_up": sender.stats["given_up"],
                    "callbacks_pending": sender.pending,
                }
            )
        return stats

    def reset(self) -> None:
        with self._lock:
            self._debits.clear()
            self._credits.clear()
            self._credits_sent.clear()
            self._credits_sent_by_payment.clear()
            self._dishonors.clear()
            self._in_flight.clear()
            self._rejected.clear()
            self._charges.clear()
            self._charges_by_payment.clear()
            self._responses.clear()
            self._requests.clear()
            self._replays = 0
            self._events = 0
            self._event_log.clear()
            self._event_logged.clear()
            self._event_epoch = uuid.uuid4().hex[:8]
            self.events_requests.clear()
            self._outage_mode, self._outage_until, self._outage_calls = OutageMode.NONE, None, 0
            self._flap_debits = 0
            self._flap_calls = 0
            self._flap_connections = 0
        self.plan.reset()
        self.drops.reset()

    # --- outages
    def outage_start(self, mode: str, seconds: float | None = None) -> None:
        """Every API call fails in ``mode`` for ``seconds`` (None: until ``outage_stop``)."""
        if mode not in OUTAGE_MODES:
            raise ValueError(f"outage mode must be one of {', '.join(OUTAGE_MODES)}, got {mode!r}")
        if seconds is not None and not (0 < seconds <= 86400):
            raise ValueError(f"outage seconds must be within 0..86400, got {seconds}")
        with self._lock:
            self._outage_mode = OutageMode(mode)
            self._outage_until = None if seconds is None else time.monotonic() + seconds
        logger.warning("sandbox outage started: %s for %s s", mode, seconds or "ever")

    def outage_stop(self) -> None:
        with self._lock:
            self._outage_mode = OutageMode.NONE
            self._outage_until = None
        logger.warning("sandbox outage ended")

    def outage(self) -> dict:
        """The outage in force: ``{"mode": ..., "remaining_seconds": ...}``, mode "" if none."""
        with self._lock:
            if self._outage_mode and self._outage_until is not None:
                if time.monotonic() >= self._outage_until:
                    self._outage_mode, self._outage_until = OutageMode.NONE, None
            remaining = (
                None
                if self._outage_until is None
                else round(max(0.0, self._outage_until - time.monotonic()), 3)
            )
            return {
                "mode": self._outage_mode,
                "remaining_seconds": remaining if self._outage_mode else 0,
                "calls_failed": self._outage_calls,
            }

    def connection_pinned_down(self) -> bool:
        """Whether a new connection goes to the dead backend of a ``flap_connection`` outage:
        every other one does (the first, the third, ...)."""
        with self._lock:
            self._flap_connections += 1
            return bool(self._flap_connections % 2)

    def outage_answer(self, *, debit: bool = False, connection_down: bool = False) -> Answer | None:
        """The answer an outage gives an API call, or None when there is no outage. Raises
        ``OutageReset`` when the connection must be dropped instead. ``debit``: the call is a
        debit (a flapping processor fails only those); ``connection_down``: its connection is
        pinned to the dead backend (``flap_connection``)."""
        mode = self.outage()["mode"]
        if not mode:
            return None
        if mode in (OutageMode.ROUND_ROBIN, OutageMode.FLAP_CONNECTION):
            with self._lock:
                self._flap_calls += 1
                if mode == OutageMode.ROUND_ROBIN:
                    fails = not self._flap_calls % 2
                else:
                    fails = connection_down
                if not fails:
                    return None
                self._outage_calls += 1
            return Answer(503, {"error": f"processor unavailable (sandbox outage: {mode})"})
        if mode in (OutageMode.FLAP, OutageMode.FLAP_RANDOM):
            if not debit:
                return None
            fails = mode == OutageMode.FLAP_RANDOM and self.plan.chance(0.5)
            with self._lock:
                self._flap_debits += 1
                if mode == OutageMode.FLAP:
                    fails = not self._flap_debits % 2
                if not fails:
                    return None
                self._outage_calls += 1
            return Answer(503, {"error": f"processor unavailable (sandbox outage: {mode})"})
        with self._lock:
            self._outage_calls += 1
        if mode == OutageMode.RESET:
            raise OutageReset()
        if mode == OutageMode.TIMEOUT:
            time.sleep(self.plan.config.timeout_seconds)
        return Answer(503, {"error": f"processor unavailable (sandbox outage: {mode})"})

    def callbacks_delivered(self) -> list[dict]:
        """Every successful callback delivery, in order (a duplicate delivery appears twice)."""
        if self.callbacks is None:
            return []
        return [
            {
                "payment_id": item["body"].get("payment_id"),
                "event_type": item["body"].get("event_type"),
                "processor_event_id": item["body"].get("processor_event_id"),
            }
            for item in list(self.callbacks.delivered)
        ]

    def debit(self, idempotency_key: str) -> Debit | None:
        with self._lock:
            return self._debits.get(idempotency_key)

    def credit(self, idempotency_key: str) -> Debit | None:
        with self._lock:
            return self._credits.get(idempotency_key)

    def statement(self, token: str) -> list[dict]:
        """Every credit to and debit from ``token``, oldest first, as a statement shows them."""
        with self._lock:
            moved = [
                t
                for t in (*self._credits.values(), *self._debits.values())
                if t.source_token == token
            ]
        moved.sort(key=lambda t: t.created_at)
        return [
            {
                "direction": t.direction,
                "amount": t.amount,
                "currency": t.currency,
                "company_entry_description": t.company_entry_description,
                "created_at": t.created_at,
            }
            for t in moved
        ]

    # --- API
    def authorized(self, header: str | None) -> bool:
        scheme, _, token = (header or "").partition(" ")
        return scheme == "Bearer" and hmac.compare_digest(token.encode(), self.api_key.encode())

    def debit_create(self, idempotency_key: str | None, raw: bytes) -> Answer:
        """``POST /v1/ach/debits``: charge once per Idempotency-Key, with the plan's faults."""
        return self._transfer_create("debit", _parse_debit_request(idempotency_key, raw))

    def credit_create(self, idempotency_key: str | None, raw: bytes) -> Answer:
        """``POST /v1/ach/credits``: send once per Idempotency-Key, with the plan's faults
        (by the destination token, as a debit's by its source token)."""
        request = _parse_debit_request(idempotency_key, raw, token_field="destination_token")
        request["source_token"] = request.pop("destination_token")
        return self._transfer_create("credit", request)

    def _transfers(self, direction: str) -> dict[str, Debit]:
        return self._credits if direction == "credit" else self._debits

    def _transfer_create(self, direction: str, request: dict) -> Answer:
        """Move money once per Idempotency-Key of ``direction``, with the plan's faults."""
        transfers = self._transfers(direction)
        key = request["idempotency_key"]
        in_flight = (direction, key)
        received_at = datetime.now(UTC).isoformat()
        fault = self.plan.debit_fault(request["source_token"])
        if fault.latency_seconds:
            time.sleep(fault.latency_seconds)
        refused = self._fault_answer(fault)
        if refused is not None:
            return refused
        fingerprint = _fingerprint(request)
        closed = Answer(
            400, {"error": "account closed (R02)", "code": "account_closed", "return_code": "R02"}
        )
        with self._lock:
            existing = transfers.get(key)
            # A refusal is the key's result, as a charge is: a call that reaches the processor
            # after it (a slow network) gets it again and never charges the key.
            rejected = self._rejected.get(in_flight)
            if existing is None and rejected is None:
                if in_flight in self._in_flight:
                    return Answer(
                        409,
                        {
                            "error": "a request with this Idempotency-Key is still being "
                            "processed; retry later"
                        },
                        (("Retry-After", "1"),),
                    )
                if fault.kind == FaultKind.REJECTED:
                    self._rejected[in_flight] = fingerprint
                    return closed
                self._in_flight.add(in_flight)
        if existing is not None:
            return self._debit_replay(existing, fingerprint, fault)
        if rejected is not None:
            if rejected != fingerprint:
                return Answer(
                    422,
                    {"error": "Idempotency-Key was already used with a different request"},
                )
            return closed
        debit = self._debit_charge(request, fingerprint, fault, direction, received_at)
        if self.latch is not None:
            self.latch.hold(key)
        self._callbacks_schedule(debit)
        return Answer(201, debit.answer())

    def _fault_answer(self, fault: DebitFault) -> Answer | None:
        """The answer of a fault that refuses the call before anything is looked at."""
        if fault.kind == FaultKind.SERVER_ERROR:
            return Answer(503, {"error": "processor temporarily unavailable (injected fault)"})
        if fault.kind == FaultKind.RATE_LIMITED:
            retry_after = self.plan.config.retry_after_seconds
            return Answer(
                429,
                {"error": f"rate limited; retry after {retry_after} s (injected fault)"},
                (("Retry-After", str(retry_after)),),
            )
        return None

    def _debit_replay(self, existing: Debit, fingerprint: str, fault: DebitFault) -> Answer:
        """A known key: the original result for the same request, 422 for another one."""
        if existing.request_fingerprint != fingerprint:
            return Answer(
                422,
                {
                    "error": "Idempotency-Key was already used with a different request "
                    f"(first for payment {existing.payment_id}, amount {existing.amount})"
                },
            )
        if fault.kind == FaultKind.TIMEOUT:
            time.sleep(self.plan.config.timeout_seconds)
        with self._lock:
            self._replays += 1
        return Answer(200, existing.answer())

    def _debit_charge(
        self,
        request: dict,
        fingerprint: str,
        fault: DebitFault,
        direction: str = "debit",
        received_at: str = "",
    ) -> Debit:
        """Charge (or credit) a key this call holds in flight, and let it go whatever happens."""
        key = request["idempotency_key"]
        try:
            if fault.kind == FaultKind.TIMEOUT:
                # Past the client's read timeout; the charge is still made, as real processors do.
                time.sleep(self.plan.config.timeout_seconds)
            debit = Debit(
                idempotency_key=key,
                processor_id=f"pr_{uuid.uuid4().hex[:24]}",
                payment_id=request["payment_id"],
                amount=request["amount"],
                currency=request["currency"],
                source_token=request["source_token"],
                status="submitted",
                created_at=datetime.now(UTC).isoformat(),
                request_fingerprint=fingerprint,
                direction=direction,
                sec_code=request.get("sec_code", ""),
                company_entry_description=request.get("company_entry_description", ""),
                received_at=received_at,
            )
            with self._lock:
                self._transfers(direction)[key] = debit
                sent, by_payment = (
                    (self._credits_sent, self._credits_sent_by_payment)
                    if direction == "credit"
                    else (self._charges, self._charges_by_payment)
                )
                sent[key] += 1
                by_payment[debit.payment_id] += 1
        finally:
            with self._lock:
                self._in_flight.discard((direction, key))
        return debit

    def debit_get(self, idempotency_key: str) -> Answer:
        return self._transfer_get("debit", idempotency_key)

    def credit_get(self, idempotency_key: str) -> Answer:
        return self._transfer_get("credit", idempotency_key)

    def _transfer_get(self, direction: str, idempotency_key: str) -> Answer:
        with self._lock:
            found = self._transfers(direction).get(idempotency_key)
        if found is None:
            return Answer(404, {"error": f"no {direction} with Idempotency-Key {idempotency_key}"})
        return Answer(200, found.answer())

    def dishonor_create(self, debit_key: str, idempotency_key: str | None, raw: bytes) -> Answer:
        """``POST /v1/ach/debits/<key>/dishonors``: one dishonor per Idempotency-Key, for a
        returned debit; its answer follows as callbacks."""
        request = _parse_dishonor_request(idempotency_key, raw)
        key = request["idempotency_key"]
        fingerprint = hashlib.sha256(
            json.dumps([debit_key, request["reason_code"]]).encode()
        ).hexdigest()
        with self._lock:
            debit = self._debits.get(debit_key)
            existing = self._dishonors.get(key)
            if existing is not None:
                if existing.request_fingerprint != fingerprint:
                    return Answer(
                        422,
                        {"error": "Idempotency-Key was already used with a different request"},
                    )
                self._replays += 1
                return Answer(200, existing.answer())
            if debit is None:
                return Answer(404, {"error": f"no debit with Idempotency-Key {debit_key}"})
            if debit.status != "returned":
                return Answer(
                    409, {"error": f"debit {debit.processor_id} is {debit.status}, not returned"}
                )
            dishonor = Dishonor(
                idempotency_key=key,
                dishonor_id=f"dh_{uuid.uuid4().hex[:24]}",
                debit_key=debit_key,
                reason_code=request["reason_code"],
                status="pending",
                request_fingerprint=fingerprint,
            )
            self._dishonors[key] = dishonor
        _DishonorCallbacks(self, debit, dishonor).start()
        return Answer(202, dishonor.answer())

    def count(self, operation: str, status: int) -> None:
        with self._lock:
            self._requests[operation] += 1
            self._responses[str(status)] += 1

    # --- callbacks
    def _callbacks_schedule(self, debit: Debit) -> None:
        if debit.direction == "credit":
            _CreditCallbacks(self, debit).start()
        else:
            _DebitCallbacks(self, debit).start()

    def _event_made(self, body: dict) -> None:
        with self._lock:
            self._events += 1

    def _event_happened(self, body: dict) -> None:
        """An event's callback came due (delivered, dropped or undeliverable alike): from now
        on the events API lists it, in the order they came due, once (a duplicate delivery of
        the same event is the same event)."""
        with self._lock:
            event_id = str(body.get("processor_event_id"))
            if event_id not in self._event_logged:
                self._event_logged.add(event_id)
                self._event_log.append(dict(body))

    # --- the events API
    def _cursor(self, position: int) -> str:
        return f"c1.{self._event_epoch}.{position}"

    def _cursor_position(self, cursor: str) -> int:
        prefix = f"c1.{self._event_epoch}."
        position = cursor[len(prefix) :]
        if not cursor.startswith(prefix) or not position.isdigit():
            raise RequestError(400, f"unknown cursor {cursor[:64]!r}")
        if int(position) > len(self._event_log):
            raise RequestError(400, f"unknown cursor {cursor[:64]!r}")
        return int(position)

    def events_list(self, after: str | None, limit: str | None) -> Answer:
        """``GET /v1/events``: the events after ``after`` (from the first when absent), at
        most ``limit``."""
        try:
            count = EVENTS_LIMIT_DEFAULT if limit is None else int(limit)
        except ValueError:
            count = 0
        if not 1 <= count <= EVENTS_LIMIT_MAX:
            return Answer(400, {"error": f"limit must be 1-{EVENTS_LIMIT_MAX}, got {limit!r}"})
        with self._lock:
            self.events_requests.append({"after": after, "limit": count})
            try:
                start = 0 if after is None else self._cursor_position(after)
            except RequestError as exc:
                return Answer(exc.status, {"error": exc.error})
            page = [dict(body) for body in self._event_log[start : start + count]]
            end = start + len(page)
            return Answer(
                200,
                {
                    "data": page,
                    "next_cursor": self._cursor(end),
                    "has_more": end < len(self._event_log),
                },
            )

    def transfers_made(self, direction: str = "debit") -> list[dict]:
        """Every debit (or credit) made, in the order their calls arrived, with its account,
        class, description and times (the chaos run's record)."""
        with self._lock:
            made = list(self._transfers(direction).values())
        made.sort(key=lambda t: (t.received_at, t.created_at))
        return [
            {**t.answer(), "source_token": t.source_token, "received_at": t.received_at}
            for t in made
        ]

    def events_made(self) -> list[dict]:
        """Every event the events API lists so far, in order (tests)."""
        with self._lock:
            return [dict(body) for body in self._event_log]

    def _debit_status_set(self, debit: Debit, status: str) -> None:
        with self._lock:
            debit.status = status


class _DebitCallbacks:
    """The callbacks of one accepted debit: ``submitted``, then ``settled`` or ``returned``, and
    for some settled debits a ``returned`` later; any of them may be delivered twice. Each one
    is scheduled once the one before it is sent. What happens is drawn from the fault plan
    here, in the order a seeded run has always drawn it."""

    def __init__(self, sandbox: SandboxProcessor, debit: Debit) -> None:
        assert sandbox.callbacks is not None
        self.sandbox = sandbox
        self.sender = sandbox.callbacks
        self.plan = plan = sandbox.plan
        self.debit = debit
        self.final = "returned" if plan.returns(debit.source_token) else "settled"
        settled = self.final == "settled"
        self.later_return = (
            plan.settled_return_code(debit.source_token, first_debit=self._first_debit())
            if settled
            else None
        )
        self.later_noc = plan.settled_change_code(debit.source_token) if settled else None
        self.duplicate = plan.duplicates(debit.source_token)

    def _first_debit(self) -> bool:
        """No other debit named this debit's token before (asked of ``tok_nsfonce`` only)."""
        token = self.debit.source_token
        if not token.startswith("tok_nsfonce"):
            return True
        with self.sandbox._lock:
            return not any(
                other.source_token == token and other.created_at < self.debit.created_at
                for other in self.sandbox._debits.values()
            )

    def start(self) -> None:
        first = self._event("submitted")
        self.sender.schedule(
            Delivery(body=first, then=self._then_duplicate(first, self._final_event)),
            self.plan.callback_delay(),
        )

    def _final_event(self) -> None:
        body = self._event(self.final)
        self.sender.schedule(
            Delivery(
                body=body,
                on_send=lambda: self.sandbox._debit_status_set(self.debit, self.final),
                then=self._then_duplicate(body, self._after_settlement()),
            ),
            self.plan.config.settle_after_seconds + self.plan.callback_delay(),
        )

    def _after_settlement(self) -> Callable[[], None] | None:
        if self.later_return:
            return self._return_event
        if self.later_noc:
            return self._noc_event
        return None

    def _noc_event(self) -> None:
        code = self.later_noc or "C01"
        body = self._event(
            "notification_of_change",
            change_code=code,
            corrected_data=noc_corrected_data(code),
            message="Notification of change",
        )
        self.sender.schedule(
            Delivery(body=body, then=self._then_duplicate(body, None)),
            self.plan.config.return_after_seconds + self.plan.callback_delay(),
        )

    def _return_event(self) -> None:
        body = self._event("returned", self.later_return or "")
        self.sender.schedule(
            Delivery(
                body=body,
                on_send=lambda: self.sandbox._debit_status_set(self.debit, "returned"),
                then=self._then_duplicate(body, None),
            ),
            self.plan.config.return_after_seconds + self.plan.callback_delay(),
        )

    def _event(self, event_type: str, reason_code: str = "", **extra: Any) -> dict:
        body = {
            "payment_id": self.debit.payment_id,
            "event_type": event_type,
            "processor_event_id": f"evt_{uuid.uuid4().hex}",
            "amount": self.debit.amount,
            "timestamp": datetime.now(UTC).isoformat(),
        }
        if event_type == "returned":
            code = reason_code or "R01"
            body.update({"reason_code": code, "message": RETURN_MESSAGES[code]})
        body.update(extra)
        self.sandbox._event_made(body)
        return body

    def _then_duplicate(self, body: dict, after: Callable[[], None] | None) -> Callable[[], None]:
        """After ``body`` is sent: its duplicate when the plan says so, then ``after``."""

        def run() -> None:
            if self.duplicate:
                self.sender.schedule(Delivery(body=dict(body)), self.plan.callback_delay())
            if after is not None:
                after()

        return run


class _CreditCallbacks(_DebitCallbacks):
    """The callbacks of one accepted credit: ``submitted``, then ``settled``, and for a
    destination token naming a credit return code (``tok_refund_R03``) a ``returned`` with it
    ``return_after_seconds`` later. Each states ``direction: "credit"``. Duplicates and delays
    are drawn as a debit's; returns and NOCs come from the token only."""

    def __init__(self, sandbox: SandboxProcessor, credit: Debit) -> None:
        assert sandbox.callbacks is not None
        self.sandbox = sandbox
        self.sender = sandbox.callbacks
        self.plan = sandbox.plan
        self.debit = credit
        self.final = "settled"
        rule = _CREDIT_RETURN_RULE.search(credit.source_token)
        self.later_return = rule.group(1) if rule else None
        self.later_noc = None
        self.duplicate = self.plan.duplicates(credit.source_token)

    def _event(self, event_type: str, reason_code: str = "", **extra: Any) -> dict:
        return super()._event(event_type, reason_code, direction="credit", **extra)


RETURN_MESSAGES = {
    "R01": "Insufficient funds",
    "R10": "Customer advises not authorized",
    # The sandbox's R17 is the 2024 rule's: the RDFI says the entry is QUESTIONABLE.
    "R17": "QUESTIONABLE: account opened under false pretenses",
    "R02": "Account closed",
    "R03": "No account/unable to locate account",
    "R04": "Invalid account number structure",
    "R23": "Credit entry refused by receiver",
}
# A value of each corrected field of the contract (payments.change_codes), as a NOC states it.
NOC_SAMPLE_VALUES = {
    "account_number_last4": "6789",
    "routing_number_last4": "0021",
    "receiving_dfi_identification_last4": "0021",
    "source_token": "tok_corrected_0001",
    "account_type": "savings",
    "transaction_code": "37",
    "individual_name": "JANE Q PUBLIC",
    "individual_identification_number": "CUST-0042",
    "company_name": "EXAMPLE CO",
    "company_identification": "EXAMPLE01",
    "addenda_information": "CORRECTED ADDENDA",
    "sec_code": "PPD",
}


def noc_corrected_data(code: str) -> dict:
    """The corrected data a NOC of ``code`` carries: a value for each field the code names;
    none for a refused NOC, and an account number's last four for an unknown code."""
    from payments.change_codes import change_code_get

    row = change_code_get(code)
    if row is None:
        return {"account_number_last4": NOC_SAMPLE_VALUES["account_number_last4"]}
    return {name: NOC_SAMPLE_VALUES[name] for name in row.fields}


class _DishonorCallbacks:
    """The answer to one dishonor request, ``return_after_seconds`` later: ``return_dishonored``
    with the request's code, then for a token with ``_contest`` in it ``dishonor_contested``
    (R73 Timely Original Return against an R68, R76 No Errors Found otherwise); with
    ``_contestfirst`` the contest is sent before the dishonor (an out-of-order processor). Any
    of them may be delivered twice, as the debit's own callbacks are."""

    def __init__(self, sandbox: SandboxProcessor, debit: Debit, dishonor: Dishonor) -> None:
        assert sandbox.callbacks is not None
        self.sandbox = sandbox
        self.sender = sandbox.callbacks
        self.plan = sandbox.plan
        self.debit = debit
        self.dishonor = dishonor
        token = debit.source_token
        contest = "R73" if dishonor.reason_code == "R68" else "R76"
        events = [("return_dishonored", dishonor.reason_code)]
        if "_contestfirst" in token:
            events.insert(0, ("dishonor_contested", contest))
        elif "_contest" in token:
            events.append(("dishonor_contested", contest))
        self.events = events
        self.duplicate = self.plan.duplicates(token)

    def start(self) -> None:
        self._next(0)

    def _next(self, index: int) -> None:
        if index >= len(self.events):
            return
        event_type, code = self.events[index]
        body = {
            "payment_id": self.debit.payment_id,
            "event_type": event_type,
            "processor_event_id": f"evt_{uuid.uuid4().hex}",
            "amount": self.debit.amount,
            "timestamp": datetime.now(UTC).isoformat(),
            "reason_code": code,
            "message": DISHONOR_MESSAGES[event_type],
        }
        self.sandbox._event_made(body)

        def then() -> None:
            if self.duplicate:
                self.sender.schedule(Delivery(body=dict(body)), self.plan.callback_delay())
            self._next(index + 1)

        self.sender.schedule(
            Delivery(body=body, then=then),
            self.plan.config.return_after_seconds + self.plan.callback_delay(),
        )


DISHONOR_MESSAGES = {
    "return_dishonored": "The dishonored return was accepted",
    "dishonor_contested": "The receiving bank contested the dishonored return",
}


def _keyed_json_request(idempotency_key: str | None, raw: bytes) -> tuple[str, dict]:
    """The request's Idempotency-Key (a UUID) and its body (a JSON object), or a 400 naming
    what is wrong: what every keyed request of the sandbox starts with."""
    if not idempotency_key:
        raise RequestError(400, "missing Idempotency-Key header (a UUID, the same on every retry)")
    try:
        key = str(uuid.UUID(idempotency_key))
    except ValueError:
        raise RequestError(
            400, f"Idempotency-Key must be a UUID, got {idempotency_key!r}"
        ) from None
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(400, f"body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise RequestError(400, "body must be a JSON object")
    return key, body


def _parse_dishonor_request(idempotency_key: str | None, raw: bytes) -> dict:
    key, body = _keyed_json_request(idempotency_key, raw)
    code = body.get("reason_code")
    if code not in DISHONOR_CODES:
        raise RequestError(
            400,
            "invalid dishonor request: reason_code",
            {"reason_code": [f"must be one of {', '.join(DISHONOR_CODES)}"]},
        )
    return {"idempotency_key": key, "reason_code": code}


def _fingerprint(request: dict) -> str:
    fields = ("payment_id", "amount", "currency", "source_token", *ENTRY_FIELDS)
    canonical = json.dumps({k: request[k] for k in fields if k in request}, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _parse_debit_request(
    idempotency_key: str | None, raw: bytes, *, token_field: str = "source_token"
) -> dict:
    """A debit's request, or a credit's with ``token_field="destination_token"``."""
    key, body = _keyed_json_request(idempotency_key, raw)
    errors: dict[str, list[str]] = {}
    for name in ("payment_id", "amount", "currency", token_field):
        if name not in body:
            errors[name] = ["this field is required"]
        elif not isinstance(body[name], str):
            errors[name] = ["must be a string"]
    if "payment_id" not in errors:
        try:
            body["payment_id"] = str(uuid.UUID(body["payment_id"]))
        except ValueError:
            errors["payment_id"] = ["must be a UUID"]
    if "amount" not in errors:
        if not _AMOUNT_RE.match(body["amount"]):
            errors["amount"] = ['must be a decimal string with 2 places, e.g. "12.50"']
        else:
            try:
                if Decimal(body["amount"]) <= 0:
                    errors["amount"] = ["must be greater than zero"]
            except InvalidOperation:
                errors["amount"] = ["not a number"]
    if "currency" not in errors and body["currency"] != "USD":
        errors["currency"] = [f"unsupported currency {body['currency']!r}; ACH moves USD"]
    if token_field not in errors and not _TOKEN_RE.match(body[token_field]):
        errors[token_field] = ["must be 1-128 characters of A-Z, a-z, 0-9, _ or -"]
    if "sec_code" in body and body["sec_code"] not in SEC_CODES:
        errors["sec_code"] = [f"must be one of {', '.join(SEC_CODES)}"]
    description = body.get("company_entry_description")
    if "company_entry_description" in body and not (
        isinstance(description, str) and _ENTRY_DESCRIPTION_RE.fullmatch(description)
    ):
        errors["company_entry_description"] = [
            "must be 1-10 characters of printable ASCII without lower-case letters"
        ]
    if errors:
        fields = ", ".join(sorted(errors))
        what = "credit" if token_field == "destination_token" else "debit"
        raise RequestError(400, f"invalid {what} request: {fields}", errors)
    return {**body, "idempotency_key": key}


def _statement_answer(sandbox: SandboxProcessor, query: str) -> Answer:
    tokens = parse_qs(query).get("token", [])
    if len(tokens) != 1 or not _TOKEN_RE.fullmatch(tokens[0]):
        return Answer(400, {"error": "token: one account token of A-Za-z0-9_- (1-128) required"})
    return Answer(200, {"token": tokens[0], "entries": sandbox.statement(tokens[0])})


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    sandbox: SandboxProcessor


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"  # keep-alive: the client reuses its connections
    # Headers and body are separate writes: without TCP_NODELAY, Nagle's algorithm and the
    # client's delayed ACK add 40 ms to every answer on a kept-alive connection.
    disable_nagle_algorithm = True
    # One handler serves one connection: in a ``flap_connection`` outage, whether the balancer
    # pinned it to the dead backend (None: not decided yet).
    pinned_down: bool | None = None
    timeout = 120  # an idle kept-alive connection is closed, and its thread ends

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        logger.debug("sandbox %s " + format, self.address_string(), *args)

    def do_GET(self) -> None:  # noqa: N802
        sandbox = self.server.sandbox
        if self.path == "/_sandbox/stats":
            self._send(Answer(200, sandbox.stats()))
            return
        if self.path == "/_sandbox/callbacks":
            self._send(Answer(200, {"delivered": sandbox.callbacks_delivered()}))
            return
        if self.path == "/_sandbox/outage":
            self._send(Answer(200, sandbox.outage()))
            return
        if self.path == "/_sandbox/drops":
            self._send(Answer(200, sandbox.drops.state()))
            return
        path, _, query = self.path.partition("?")
        if path == "/v1/events":
            self._events_get(sandbox, query)
            return
        if path == "/_sandbox/statement":
            self._send(_statement_answer(sandbox, query))
            return
        direction, match = "debit", _DEBIT_PATH.match(self.path)
        if match is None:
            direction, match = "credit", _CREDIT_PATH.match(self.path)
        if match is None:
            self._send(Answer(404, {"error": f"no such endpoint: GET {self.path}"}))
            return
        operation = f"{direction}_get"
        if self._outage(sandbox, operation):
            return
        if not sandbox.authorized(self.headers.get("Authorization")):
            self._send(Answer(401, {"error": "missing or wrong Authorization: Bearer <api key>"}))
            return
        answer = sandbox._transfer_get(direction, match.group(1))
        sandbox.count(operation, answer.status)
        self._send(answer)

    def do_POST(self) -> None:  # noqa: N802
        sandbox = self.server.sandbox
        try:
            raw = self._read_body()
        except RequestError as exc:
            self._send(Answer(exc.status, {"error": exc.error}), close=True)
            return
        if self.path == "/_sandbox/reset":
            sandbox.reset()
            self._send(Answer(200, {"reset": True}))
            return
        if self.path == "/_sandbox/outage":
            self._send(_outage_control(sandbox, raw))
            return
        if self.path == "/_sandbox/drops":
            self._send(_drops_control(sandbox, raw))
            return
        dishonor = _DISHONOR_PATH.match(self.path)
        if dishonor is not None:
            self._dishonor_post(sandbox, dishonor.group(1), raw)
            return
        creates = {"/v1/ach/debits": sandbox.debit_create, "/v1/ach/credits": sandbox.credit_create}
        create = creates.get(self.path)
        if create is None:
            self._send(Answer(404, {"error": f"no such endpoint: POST {self.path}"}))
            return
        operation = "credit_create" if self.path == "/v1/ach/credits" else "debit_create"
        if self._outage(sandbox, operation):
            return
        if not sandbox.authorized(self.headers.get("Authorization")):
            answer = Answer(401, {"error": "missing or wrong Authorization: Bearer <api key>"})
        elif (self.headers.get("Content-Type") or "").split(";")[0].strip() != "application/json":
            answer = Answer(415, {"error": "Content-Type must be application/json"})
        else:
            try:
                answer = create(self.headers.get("Idempotency-Key"), raw)
            except RequestError as exc:
                body = {"error": exc.error}
                if exc.errors:
                    body["errors"] = exc.errors
                answer = Answer(exc.status, body)
        sandbox.count(operation, answer.status)
        self._send(answer)

    def _events_get(self, sandbox: SandboxProcessor, query: str) -> None:
        if self._outage(sandbox, "events_list"):
            return
        if not sandbox.authorized(self.headers.get("Authorization")):
            answer = Answer(401, {"error": "missing or wrong Authorization: Bearer <api key>"})
        else:
            params = parse_qs(query, keep_blank_values=True)
            answer = sandbox.events_list(
                (params.get("after") or [None])[0], (params.get("limit") or [None])[0]
            )
        sandbox.count("events_list", answer.status)
        self._send(answer)

    def _dishonor_post(self, sandbox: SandboxProcessor, debit_key: str, raw: bytes) -> None:
        if self._outage(sandbox, "dishonor_create"):
            return
        if not sandbox.authorized(self.headers.get("Authorization")):
            answer = Answer(401, {"error": "missing or wrong Authorization: Bearer <api key>"})
        elif (self.headers.get("Content-Type") or "").split(";")[0].strip() != "application/json":
            answer = Answer(415, {"error": "Content-Type must be application/json"})
        else:
            try:
                answer = sandbox.dishonor_create(
                    debit_key, self.headers.get("Idempotency-Key"), raw
                )
            except RequestError as exc:
                body = {"error": exc.error}
                if exc.errors:
                    body["errors"] = exc.errors
                answer = Answer(exc.status, body)
        sandbox.count("dishonor_create", answer.status)
        self._send(answer)

    def _outage(self, sandbox: SandboxProcessor, operation: str) -> bool:
        """Answer as the outage says; False when there is none."""
        if self.pinned_down is None and sandbox.outage()["mode"] == OutageMode.FLAP_CONNECTION:
            self.pinned_down = sandbox.connection_pinned_down()
        try:
            answer = sandbox.outage_answer(
                debit=operation in ("debit_create", "credit_create"),
                connection_down=bool(self.pinned_down),
            )
        except OutageReset:
            sandbox.count(operation, 0)
            self.close_connection = True
            return True
        if answer is None:
            return False
        sandbox.count(operation, answer.status)
        self._send(answer)
        return True

    def _read_body(self) -> bytes:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            raise RequestError(400, "invalid Content-Length") from None
        if length > MAX_BODY_BYTES:
            raise RequestError(413, f"body over {MAX_BODY_BYTES} bytes")
        return self.rfile.read(length) if length else b""

    def _send(self, answer: Answer, *, close: bool = False) -> None:
        payload = json.dumps(answer.body).encode()
        try:
            self.send_response(answer.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            for name, value in answer.headers:
                self.send_header(name, value)
            if close:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            # The client gave up (its timeout); what was done is done, as with a real processor.
            self.close_connection = True


def _outage_control(sandbox: SandboxProcessor, raw: bytes) -> Answer:
    try:
        body = json.loads(raw or b"{}")
    except ValueError:
        return Answer(400, {"error": 'the body must be JSON: {"mode": ..., "seconds": ...}'})
    if not isinstance(body, dict):
        return Answer(400, {"error": "the body must be a JSON object"})
    unknown = sorted(set(body) - {"mode", "seconds"})
    if unknown:
        return Answer(400, {"error": f"unknown field(s): {', '.join(unknown)}"})
    mode = body.get("mode")
    if mode == "off":
        sandbox.outage_stop()
        return Answer(200, sandbox.outage())
    seconds = body.get("seconds")
    if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, int | float)):
        return Answer(400, {"error": "seconds must be a number"})
    if not isinstance(mode, str):
        return Answer(400, {"error": f"mode must be one of off, {', '.join(OUTAGE_MODES)}"})
    try:
        sandbox.outage_start(mode, seconds)
    except ValueError as exc:
        return Answer(400, {"error": str(exc)})
    return Answer(200, sandbox.outage())


def _drops_control(sandbox: SandboxProcessor, raw: bytes) -> Answer:
    try:
        body = json.loads(raw or b"{}")
    except ValueError:
        return Answer(400, {"error": 'the body must be JSON: {"share": ..., "event_types": ...}'})
    if not isinstance(body, dict):
        return Answer(400, {"error": "the body must be a JSON object"})
    unknown = sorted(set(body) - {"share", "event_types"})
    if unknown:
        return Answer(400, {"error": f"unknown field(s): {', '.join(unknown)}"})
    share, event_types = body.get("share"), body.get("event_types")
    if isinstance(share, bool) or not isinstance(share, int | float):
        return Answer(400, {"error": "share must be a number within 0..1"})
    if event_types is not None and not (
        isinstance(event_types, list) and all(isinstance(t, str) for t in event_types)
    ):
        return Answer(400, {"error": "event_types must be a list of event types"})
    try:
        sandbox.drops.set(share, event_types)
    except ValueError as exc:
        return Answer(400, {"error": str(exc)})
    return Answer(200, sandbox.drops.state())
