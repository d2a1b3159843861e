"""The chaos run's load: payments created through ``POST /api/payments/`` at an even rate, each
retried with its Idempotency-Key until it gets its answer, some sent twice at once; the source
tokens pick the sandbox's deterministic faults on top of its random ones.

A 409 is two different answers, told apart by the error's ``code``: ``idempotency_key_in_use``
(the key's first request is still running: retry with the same key) and a refusal the answer
names (``exposure_limit_exceeded`` past one of the merchant's limits): final, recorded as
refused, never retried and never counted as lost."""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal

import requests

from chaos.config import MERCHANTS, Config

# (share of payments, source-token prefix): the sandbox's token rules, for deterministic faults
# on top of the random ones.
TOKEN_MIX = (
    (0.03, "tok_reject"),
    (0.04, "tok_fail5xx_2"),
    (0.01, "tok_timeout_1"),
    (0.03, "tok_return"),
    (0.03, "tok_nsf"),  # settled, then returned R01
    (0.02, "tok_unauth"),  # settled, then returned R10
    (0.04, "tok_dupcb"),
    (0.02, "tok_noc"),  # settled, then a notification of change (C01)
)


def source_token(rng: random.Random, index: int) -> str:
    draw = rng.random()
    for share, prefix in TOKEN_MIX:
        if draw < share:
            return f"{prefix}_p{index:05d}"
        draw -= share
    return f"tok_chaos_p{index:05d}"


@dataclass
class LoadStats:
    created: dict[str, str] = field(default_factory=dict)  # Idempotency-Key -> payment id
    statuses: Counter = field(default_factory=Counter)
    retries: int = 0
    double_sends: int = 0
    failures: list[str] = field(default_factory=list)  # keys given up on, with the reason
    # Idempotency-Key -> the refusal's "code:param" (a 409 that is not "key in flight").
    refused: dict[str, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


# The one 409 to retry with the same key: its first request is still running.
KEY_IN_USE = "idempotency_key_in_use"


def refusal(status: int, body: object) -> str | None:
    """``"code:param"`` of a 409 that refuses the request for good, None for any other answer
    (a 409 ``idempotency_key_in_use`` is retried; an envelope without a code is too, as a
    proxy's 409 would be)."""
    if status != 409 or not isinstance(body, dict):
        return None
    error = body.get("error")
    if not isinstance(error, dict):
        return None
    code = error.get("code")
    if not isinstance(code, str) or not code or code == KEY_IN_USE:
        return None
    return f"{code}:{error.get('param') or ''}"


# Every DOUBLE_SEND-th payment is sent twice at once with the same Idempotency-Key, as a client
# whose first try seemed to hang would: both answers must name the same payment.
DOUBLE_SEND = 20


def post_through_faults(url: str, body: dict, *, token: str, tries: int) -> int:
    """POST ``body`` with a fresh Idempotency-Key, as a client does, again after a connection
    error or a 5xx (the run's web kills and database outages), up to ``tries`` times; the
    status of the first answer under 500, or 0 when none came through."""
    for _ in range(tries):
        try:
            response = requests.post(
                url,
                json=body,
                headers={"Authorization": f"Token {token}", "Idempotency-Key": str(uuid.uuid4())},
                timeout=15,
            )
        except requests.RequestException:
            time.sleep(1)
            continue
        if response.status_code < 500:
            return response.status_code
        time.sleep(1)
    return 0


def create_payments(
    *,
    base_url: str,
    token: str,
    config: Config,
    spread_seconds: float,
    stats: LoadStats,
    count: int | None = None,
) -> None:
    """POST the payments (``count``, else ``CHAOS_PAYMENTS``) at an even rate over
    ``spread_seconds``, four at a time; each one is retried with the same Idempotency-Key until
    it gets its answer (or 120 s pass)."""
    jobs = _jobs(config)[: config.payments if count is None else count]
    client = _Client(base_url, token, stats)
    start = time.monotonic()
    interval = spread_seconds / max(len(jobs), 1)
    queue = list(reversed(jobs))

    def run() -> None:
        session = requests.Session()
        while True:
            with stats.lock:
                if not queue:
                    return
                i, key, body = queue.pop()
            delay = start + i * interval - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            client.create(session, i, key, body)

    threads = [threading.Thread(target=run, name=f"load-{n}", daemon=True) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _jobs(config: Config) -> list[tuple[int, str, dict]]:
    """(index, Idempotency-Key, body) of every payment, drawn from the run's seed."""
    rng = random.Random(config.seed)
    jobs = []
    for i in range(config.payments):
        body = {
            "merchant_id": f"merchant-{i % MERCHANTS}",
            "amount": f"{Decimal(rng.randint(100, 50_000)) / 100:.2f}",
            "currency": "USD",
            "source_token": source_token(rng, i),
        }
        jobs.append((i, str(uuid.uuid4()), body))
    return jobs


REFUSED = "refused:"


def _json(response: requests.Response) -> object:
    try:
        return response.json()
    except ValueError:
        return None


class _Client:
    """An API client that retries, as a merchant's should: a 409 ``idempotency_key_in_use``,
    429, 5xx and connection errors again with the same key, backing off, for up to 120 s; a
    409 refusal (``refusal``) is its final answer."""

    def __init__(self, base_url: str, token: str, stats: LoadStats) -> None:
        self.url = f"{base_url}/api/payments/"
        self.headers = {"Authorization": f"Token {token}"}
        self.stats = stats

    def create(self, session: requests.Session, i: int, key: str, body: dict) -> None:
        """One payment; every DOUBLE_SEND-th is sent twice at once, and both answers must name
        the same payment."""
        stats = self.stats
        answers: list[str] = []
        twin = None
        if i % DOUBLE_SEND == 0:
            twin = threading.Thread(target=self.post, args=(requests.Session(), key, body, answers))
            twin.start()
        self.post(session, key, body, answers)
        if twin is not None:
            twin.join()
        with stats.lock:
            made = [a for a in answers if not a.startswith(REFUSED)]
            refusals = [a.removeprefix(REFUSED) for a in answers if a.startswith(REFUSED)]
            # A refusal wrote nothing and released the key: its twin, retried after it, may
            # find room (an entry failed meanwhile) and make the payment, which then stands.
            if made:
                stats.created[key] = made[0]
            elif refusals:
                stats.refused[key] = refusals[0]
            if len(set(made)) > 1:
                stats.failures.append(f"{key}: one key answered with payments {made}")
            if twin is not None:
                stats.double_sends += 1

    def post(self, session: requests.Session, key: str, body: dict, answers: list[str]) -> None:
        stats = self.stats
        deadline = time.monotonic() + 120
        attempt = 0
        while True:
            attempt += 1
            try:
                response = session.post(
                    self.url,
                    json=body,
                    headers={**self.headers, "Idempotency-Key": key},
                    timeout=15,
                )
                status = str(response.status_code)
            except requests.RequestException as exc:
                response, status = None, type(exc).__name__
            with stats.lock:
                stats.statuses[status] += 1
            if response is not None and response.status_code in (200, 201):
                answers.append(response.json()["id"])
                return
            refused = None if response is None else refusal(response.status_code, _json(response))
            if refused is not None:
                answers.append(REFUSED + refused)
                return
            retryable = (
                response is None
                or response.status_code in (409, 429)
                or (response.status_code >= 500)
            )
            if not retryable or time.monotonic() > deadline:
                text = response.text[:300] if response is not None else status
                with stats.lock:
                    stats.failures.append(f"{key}: {status} {text}")
                return
            with stats.lock:
                stats.retries += 1
            time.sleep(min(0.2 * 2 ** min(attempt, 4), 3.0))
