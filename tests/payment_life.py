"""The steps of a payment's life, each driven the way production drives it, in this process: the
API create (DRF's test client, with an Idempotency-Key), the submission (the worker's service
against the processor over HTTP), a callback's ingest (the signed POST to the callback
endpoint) and the apply of a batch of events (the queue worker). ``tests/payments/
test_statement_counts.py`` pins each step's statements; ``scripts/payment_life_cost.py`` times
them. Every function returns what the step made, and fails loudly if the step did not succeed.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from decimal import Decimal

from django.db import connection

MERCHANT = "life-merchant"
SOURCE_TOKEN = "tok_life_source_0001"
DESTINATION_TOKEN = "tok_life_destination_0001"
EVENTS_PER_BATCH = 10


@dataclass
class Statements:
    """Every statement a step sends to PostgreSQL, transaction control included (``BEGIN``,
    ``COMMIT``, savepoints): each is a round trip. ``connection.queries`` logs them all when
    the connection is in debug mode."""

    sql: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.sql)

    def listing(self) -> str:
        return "\n".join(f"{i + 1:3} {sql[:160]}" for i, sql in enumerate(self.sql))


@contextmanager
def statements_counted() -> Iterator[Statements]:
    """The statements run inside the block, as ``CaptureQueriesContext`` sees them."""
    from django.test.utils import CaptureQueriesContext

    counted = Statements()
    # The log keeps the last 9,000 statements: emptied first, so a long run's later steps are
    # counted from the start of their own log, not lost off its end.
    connection.queries_log.clear()
    with CaptureQueriesContext(connection) as queries:
        yield counted
    counted.sql.extend(query["sql"] for query in queries.captured_queries)


def api_client_for(merchant_id: str = MERCHANT):
    """An API client with a token of a new user granted ``merchant_id``."""
    from rest_framework.authtoken.models import Token
    from rest_framework.test import APIClient

    from tests.factories import UserFactory, grant

    user = UserFactory()
    grant(user, merchant_id)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return client


def _created(response) -> str:
    assert response.status_code == 201, (response.status_code, response.content[:500])
    return response.json()["id"]


def _post(client, path: str, body: dict) -> str:
    return _created(
        client.post(
            path,
            json.dumps(body),
            content_type="application/json",
            HTTP_IDEMPOTENCY_KEY=uuid.uuid4().hex,
        )
    )


def debit_create(client, amount: str = "25.00") -> str:
    body = {"merchant_id": MERCHANT, "amount": amount, "source_token": SOURCE_TOKEN}
    return _post(client, "/api/payments/", body)


def web_debit_create(client, amount: str = "25.00") -> str:
    """A WEB debit (its account validated before, ``account_validated``: NACHA's rule): one
    read more than a PPD debit's, the account's validation."""
    body = {"merchant_id": MERCHANT, "amount": amount, "source_token": SOURCE_TOKEN}
    return _post(client, "/api/payments/", {**body, "sec_code": "WEB"})


def refund_create(client, debit_id: str, amount: str = "5.00") -> str:
    return _post(client, f"/api/payments/{debit_id}/refunds/", {"amount": amount})


def payout_create(client, amount: str = "5.00") -> str:
    body = {"merchant_id": MERCHANT, "amount": amount, "destination_token": DESTINATION_TOKEN}
    return _post(client, "/api/payouts/", body)


def collected_debit(amount: str = "1000.00") -> str:
    """A settled debit of the merchant, its money available at once when
    ``AVAILABLE_AFTER_BANKING_DAYS`` is 0: what a refund refunds and a payout pays out of."""
    from payments.models import PaymentState
    from payments.services import payment_apply_event
    from tests.factories import PaymentFactory, processor_event

    debit = PaymentFactory(
        merchant_id=MERCHANT, state=PaymentState.SUBMITTED, amount=Decimal(amount)
    )
    payment_apply_event(event=processor_event(debit, "settled"))
    return str(debit.id)


def accounts_known_for_weeks() -> None:
    """The merchant's payments with its source and destination accounts made 40 days ago: a
    fraud rule sees neither account as new."""
    from datetime import timedelta

    from django.utils import timezone

    from payments.models import Payment
    from tests.factories import PaymentFactory

    PaymentFactory(merchant_id=MERCHANT, source_token=DESTINATION_TOKEN, amount=Decimal("1.00"))
    Payment.objects.filter(merchant_id=MERCHANT).update(
        created_at=timezone.now() - timedelta(days=40)
    )


def submit(payment_id: str) -> None:
    """The submission of a pending payment (what the worker runs for its submit command)."""
    from payments.services.submission import SubmitOutcome, payment_submit

    result = payment_submit(payment_id=payment_id, caused_by="worker")
    assert result.outcome == SubmitOutcome.SUBMITTED, result


def callback_body(payment_id: str, event_type: str) -> bytes:
    """The processor's callback of ``event_type`` for the payment, as it sends it."""
    from payments.models import Payment
    from tests.factories import processor_event

    event = processor_event(Payment.objects.get(pk=payment_id), event_type)
    return json.dumps(
        {
            "payment_id": str(event.payment_id),
            "event_type": event.event_type,
            "processor_event_id": event.processor_event_id,
            "amount": f"{event.amount:.2f}",
            "timestamp": event.timestamp.isoformat(),
        }
    ).encode()


_callback_client = None


def callback_post(raw: bytes) -> None:
    """A callback signed and posted to the callback endpoint, which queues it."""
    from django.test import Client

    from callbacks import conf as callbacks_conf
    from payments import signing

    global _callback_client
    if _callback_client is None:
        # One client, as one server process: a new test client loads the middleware again (the
        # static files' middleware walks every static file when it starts), which no request
        # in production pays.
        _callback_client = Client()
    response = _callback_client.post(
        "/callbacks/processor/",
        data=raw,
        content_type="application/json",
        headers={signing.HEADER: signing.sign(raw, callbacks_conf.CALLBACK_SIGNING_SECRETS)},
    )
    assert response.status_code == 202, (response.status_code, response.content[:500])


def worker_drain() -> int:
    """Apply what is on the queue with the product's worker in this process, batch by batch
    until a receive comes back empty; how many batches it took."""
    from callbacks.worker import Worker

    worker = Worker(wait_time=0, relay=False, linger=0)
    batches = 0
    with worker.running():
        while batch := worker.receive():
            batches += 1
            worker.process_batch(batch)
    assert set(worker.stats.outcomes) <= {"applied", "submitted"}, worker.stats
    return batches


def ledger_grown(entries: int, *, batch: int = 2000) -> None:
    """``entries`` more ledger entries for the merchant, each the credit of a debit settled 30
    days ago, every tenth debit returned since (its reversal a second entry): a merchant with a
    long history. Written in bulk, as a backfill would, through the ledger's triggers where the
    database has them."""
    from datetime import timedelta

    from django.utils import timezone

    from payments.models import LedgerEntry, Payment, PaymentState

    settled = timezone.now() - timedelta(days=30)
    plan: list[bool] = []  # per debit, whether it was returned
    while len(plan) + sum(plan) < entries:
        plan.append(len(plan) % 10 == 9 and len(plan) + sum(plan) + 2 <= entries)
    for start in range(0, len(plan), batch):
        returned = plan[start : start + batch]
        debits = Payment.objects.bulk_create(
            Payment(
                merchant_id=MERCHANT,
                amount=Decimal("10.00"),
                currency="USD",
                source_token=f"tok_bank_{start + n:06d}bulk",
                state=PaymentState.RETURNED if back else PaymentState.CONFIRMED,
            )
            for n, back in enumerate(returned)
        )
        rows = []
        for debit, back in zip(debits, returned, strict=True):
            rows.append(
                LedgerEntry(
                    payment=debit,
                    merchant_id=MERCHANT,
                    kind="credit",
                    amount=debit.amount,
                    currency="USD",
                    posted_at=settled,
                )
            )
            if back:
                rows.append(
                    LedgerEntry(
                        payment=debit,
                        merchant_id=MERCHANT,
                        kind="reversal",
                        amount=-debit.amount,
                        currency="USD",
                        posted_at=settled + timedelta(days=3),
                    )
                )
        LedgerEntry.objects.bulk_create(rows)
