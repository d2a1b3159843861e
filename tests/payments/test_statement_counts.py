"""The statements each step of a payment's life sends to PostgreSQL, pinned: a debit's, a
refund's and a payout's API create (with an Idempotency-Key, its outbox row published after
commit), the worker's submission of a batch of ten, a callback's ingest and the worker's apply of a
batch of ten events; and a WEB debit's create, which reads its account's validation.

Each is a round trip the web process or the worker pays on every payment (transaction control
included); a change that adds one fails here, with the statements listed. A change that saves
one lowers the pin (``docs/performance.md`` keeps the figures before and after).
``scripts/payment_life_cost.py`` times the same steps (``tests/payment_life.py``)."""

import pytest

from payments.models import Payment, PaymentState
from tests import payment_life
from tests.factories import account_validated
from tests.payment_life import statements_counted

pytestmark = pytest.mark.django_db(transaction=True)

# The API's part of every create (payments.api.base, payments.idempotency): the token's read,
# which carries the user's merchant grants (payments.api.authentication), BEGIN, the
# Idempotency-Key's claim (its advisory lock and its row in one statement), the answer stored
# under the key, COMMIT: 5 (a refund 6: the debit's read, before the claim). The service's: a
# debit's checks (its merchant's profile and limits, its account's notifications of change,
# blocks and, a WEB debit's, validation) in one read that takes the exposure lock first (a WEB
# debit takes it on its own, after the validation's row lock it may need: +1); a refund's
# debit row lock, then its money-out share and exposure locks with the merchant's limits and
# what the debit's refunds hold; a payout's money-out and exposure locks with the limits and,
# once they are held, the available balance (9 when the balance was a statement of its own);
# each the fraud rules' read of the merchant's history, and the payment with its ledger entry,
# audit row, submit command and merchant's event in one statement.
CREATE = {"debit": 8, "web_debit": 9, "refund": 10, "payout": 8}
# The outbox row's publish after the create's commit, in the same request, each statement
# committing as it runs: its group's try-lock (with the row's group read), the group's
# unpublished rows read after the lock, the mark, the unlock (callbacks.outbox); 9 when the
# claim and the mark were transactions of their own.
PUBLISH = 4
# Per payment: the breaker's read by the worker's gate before it starts, the queue record, the
# row lock and mark in one statement that also reads the breaker for the admission right before
# the call (read again in a statement of its own only when it is not plainly closed or the mark
# waited on the row lock); then the record, one statement that commits alone while the row is
# the version the mark wrote (the row lock, the attempt numbered by its insert, the state and
# processor id, the merchant's event and the audit row; BEGIN and COMMIT around it when a host
# receives payment_transitioned); the queue record done: 5. The record statement by statement
# (BEGIN, the row lock, the attempt, the UPDATE, the INSERT, COMMIT) made it 10. A closed
# breaker that counted no failure is not reset (no UPDATE).
SUBMISSION_BATCH_OF_TEN = 50
INGEST = 0
# The batch of ten: the start, BEGIN, the payments' locks with their rows and then, in the same
# statement, the merchants' return-rate days locked in one order, one statement per event (its
# row came with the batch's lock), the done marks, COMMIT: 15 (16 with the days locked in a
# statement of their own, 26 with a row lock per event).
APPLY_BATCH_OF_TEN = 15


@pytest.fixture
def life(sqs_queues, sandbox, module_settings):
    """A merchant with money available at once, its API client and a collected debit."""
    module_settings.AVAILABLE_AFTER_BANKING_DAYS = 0
    # The fraud rules on, as a host has them by default; the accounts known for weeks, so
    # nothing is held and each create pays the rules' lock and read and its submit command.
    module_settings.FRAUD_RULES = None
    client = payment_life.api_client_for()
    debit_id = payment_life.collected_debit()
    payment_life.accounts_known_for_weeks()
    account_validated(payment_life.SOURCE_TOKEN, payment_life.MERCHANT)
    # The first request of a process reads what it caches (the content types, the settings'
    # parsed values): not a payment's cost.
    payment_life.debit_create(client)
    return client, debit_id


@pytest.mark.parametrize("path", sorted(CREATE))
def test_a_create_through_the_api_makes_its_pinned_statements(life, path):
    client, debit_id = life
    create = {
        "debit": lambda: payment_life.debit_create(client),
        "web_debit": lambda: payment_life.web_debit_create(client),
        "refund": lambda: payment_life.refund_create(client, debit_id),
        "payout": lambda: payment_life.payout_create(client),
    }[path]

    with statements_counted() as counted:
        create()

    expected = CREATE[path] + PUBLISH
    assert len(counted) == expected, f"{len(counted)} statements, pinned {expected}:\n" + (
        counted.listing()
    )


def test_the_submission_ingest_and_apply_make_their_pinned_statements(life):
    client, _ = life
    payment_life.worker_drain()  # the warm-up create's submit command
    created = [payment_life.debit_create(client) for _ in range(payment_life.EVENTS_PER_BATCH)]

    with statements_counted() as submission:
        submitted = payment_life.worker_drain()  # the creates' submit commands
    callbacks = [payment_life.callback_body(payment_id, "settled") for payment_id in created]
    with statements_counted() as ingest:
        payment_life.callback_post(callbacks[0])
    for raw in callbacks[1:]:
        payment_life.callback_post(raw)
    with statements_counted() as apply:
        batches = payment_life.worker_drain()

    assert (submitted, batches) == (1, 1)
    assert set(Payment.objects.filter(pk__in=created).values_list("state", flat=True)) == {
        PaymentState.CONFIRMED
    }
    steps = {"submission": submission, "ingest": ingest, "apply": apply}
    pins = {"submission": SUBMISSION_BATCH_OF_TEN, "ingest": INGEST, "apply": APPLY_BATCH_OF_TEN}
    counts = {step: len(counted) for step, counted in steps.items()}
    assert counts == pins, "\n".join(
        f"{step}: {counts[step]} statements, pinned {pins[step]}:\n{steps[step].listing()}"
        for step in steps
        if counts[step] != pins[step]
    )
