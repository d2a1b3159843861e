"""The model: the real pipeline driven step by step in a simulated world, every invariant checked
after every step.

A step is one of the moves a world makes: a client creates a payment through the API (with its
Idempotency-Key sometimes replayed), a merchant refunds part or all of a debit (money out, with
the same life at the processor as a debit), the worker takes one receive from the queue, the
processor moves a debit on or answers a dishonor, a callback is delivered (in any order, again,
inside or after SQS's deduplication window) or dropped, the events pull runs (a dropped
callback comes back that way, one delivered comes again late, one still to come comes first),
the processor's mood changes, the clock moves, an operator asks for a dishonor, sends a failed
one again, reinitiates a return or redrives a dead letter, the DLQ is ingested, or everything
is drained. The code under test is the product's own: the
API view, ``payment_create``, the outbox relay, the worker's ``process_batch`` (bulk starts, the
batch transaction, the per-message path, retries, dead letters, holds), ``payment_submit``,
``payment_apply_event``, the refund service, the events pull, the dishonor and reinitiation
services, DLQ ingestion and the triage redrive, on the real database.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from contextlib import ExitStack
from datetime import timedelta
from decimal import Decimal

from django.apps import apps
from django.db import connection, transaction
from django.db.models import Exists, OuterRef
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from rest_framework.test import APIClient

from callbacks import sqs
from callbacks.events_pull import PullOutcome, processor_events_pull
from callbacks.handlers import processor_breaker_tick
from callbacks.models import (
    FINISHED_STATUSES,
    HoldKind,
    ParkedMessage,
    ProcessingError,
    QueueMessage,
    QueueMessageStatus,
)
from callbacks.outbox import outbox_relay_publish
from callbacks.schema import event_deduplication_id, parse_processor_event, processor_event_message
from callbacks.services import outage_holds_waiting
from callbacks.worker import Worker
from payments.exceptions import DishonorRefused, ReinitiationRefused
from payments.models import (
    AttemptOutcome,
    DishonorRequestStatus,
    EventKind,
    EventOutcome,
    LedgerEntry,
    Payment,
    PaymentDirection,
    PaymentEvent,
    PaymentReturn,
    PaymentState,
    ProcessedEvent,
    ProcessorAttempt,
    ReturnDishonor,
)
from payments.return_codes import dishonor_deadline
from payments.services import payment_reinitiate, return_dishonor_request, return_dishonor_resend
from tests.factories import grant
from tests.model.processor import MOODS, SCRIPTS, SimProcessor
from triage.exceptions import TriageError
from triage.ingestion import dead_letters_ingest
from triage.models import Alert, AlertSeverity, DeadLetter, DeadLetterStatus
from triage.services import dead_letter_discard, dead_letter_redrive

MERCHANT = "m-model"
TOKENS = tuple(SCRIPTS)
AMOUNTS = ("10.00", "25.50", "7.25")
API_KEYS = (None, "key-1", "key-2", "key-3")
RETURN_CODES = ("R01", "R09", "R10", "R03")
DISHONOR_CODES = ("R61", "R67", "R68")
REFUND_AMOUNTS = ("1.00", "5.00", "10.00")
ALTERED_AMOUNT = "99.99"  # no payment of the model is for this amount
CLOCK_STEPS = {
    "seconds": timedelta(seconds=7),
    "backoff": timedelta(seconds=31),
    "past_dedup_window": timedelta(minutes=5, seconds=1),
    "hours": timedelta(hours=9),
    "banking_day": timedelta(days=1),
    "week": timedelta(days=7),
}
# The tables a run writes; emptied between examples (users and their tokens stay).
APPS_EMPTIED = ("payments", "callbacks", "bank", "triage")


class World:
    """What one test shares with every example of its machine: the clock, the queue and the
    operator; set by the ``model_world`` fixture (``tests.model.conftest``). Each example
    makes its own processor."""

    clock = None
    sqs = None
    operator = None


def empty_tables() -> None:
    """Delete every row the run wrote (foreign keys are deferrable on PostgreSQL), history
    included: as the suite's flush does, in replica mode, past the database's history guard
    (``payments.history``)."""
    tables = [
        model._meta.db_table
        for label in APPS_EMPTIED
        for model in apps.get_app_config(label).get_models()
        if model._meta.managed and not model._meta.proxy
    ]
    statements = [
        "SET LOCAL session_replication_role = replica",
        "SET CONSTRAINTS ALL DEFERRED",
        *(f'DELETE FROM "{t}"' for t in tables),
    ]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("; ".join(statements))  # one round trip


class PipelineModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = World.clock
        self.clock.reset()
        self.sqs = World.sqs
        self.sqs.reset()
        self.processor = SimProcessor(self.clock)
        SimProcessor.current = self.processor
        self.operator = World.operator
        grant(self.operator, MERCHANT)
        self.api = APIClient()
        self.api.force_authenticate(self.operator)
        self.payments: list[str] = []
        # The database changed since the invariants were last checked (moves of the processor,
        # the clock and deliveries to the queue change nothing the checks read there).
        self.dirty = False
        # API Idempotency-Key -> the body first sent with it, and every payment id answered.
        self.api_bodies: dict[str, dict] = {}
        self.api_answers: dict[str, set[str]] = defaultdict(set)
        self.sends: list[tuple[str, str]] = []  # (processor_event_id, SQS message id)
        self.altered: list[tuple[str, str]] = []  # the same, of conflicting resends
        self.finished: set[str] = set()  # messages seen finished after they left the queue
        self._stack = ExitStack()
        self.worker = Worker(
            batch_size=10, wait_time=0, visibility_timeout=30, relay=False, linger=0
        )
        self._stack.enter_context(self.worker.running())

    # What the runs reached, summed over a test's examples (printed by the test): a model that
    # never gets a payment returned or a message dead-lettered checks nothing about them.
    reached: Counter = Counter()

    def teardown(self) -> None:
        self._count_reached()
        self._stack.close()
        SimProcessor.current = None
        empty_tables()

    def _count_reached(self) -> None:
        reached = PipelineModel.reached
        reached["examples"] += 1
        for state in Payment.objects.values_list("state", flat=True):
            reached[f"payment {state}"] += 1
        reached["reinitiations"] += Payment.objects.filter(reinitiation_of__isnull=False).count()
        for outcome in PaymentEvent.objects.filter(kind=EventKind.PROCESSOR_EVENT).values_list(
            "outcome", flat=True
        ):
            reached[f"event {outcome}"] += 1
        reached["dishonors asked"] += ReturnDishonor.objects.exclude(requested_at=None).count()
        reached["dishonors booked"] += ReturnDishonor.objects.exclude(
            dishonored_event_id=""
        ).count()
        reached["contests booked"] += ReturnDishonor.objects.exclude(contested_event_id="").count()
        reached["dead letters"] += DeadLetter.objects.count()
        reached["dead letters redriven"] += DeadLetter.objects.filter(
            status=DeadLetterStatus.REDRIVEN
        ).count()
        reached["parked messages"] += ParkedMessage.objects.count()
        reached["processing errors"] += ProcessingError.objects.count()
        reached["duplicate deliveries"] += QueueMessage.objects.filter(outcome="duplicate").count()
        reached["callbacks dropped"] += len(self.processor.dropped)
        for state in Payment.objects.filter(direction=PaymentDirection.CREDIT).values_list(
            "state", flat=True
        ):
            reached[f"refund {state}"] += 1

    # --- moves: clients and operators --------------------------------------------------------

    @initialize(tokens=st.lists(st.sampled_from(TOKENS), min_size=1, max_size=3))
    def first_payments(self, tokens):
        for token in tokens:
            self.create(AMOUNTS[0], token, None, False)

    @rule(
        amount=st.sampled_from(AMOUNTS),
        token=st.sampled_from(TOKENS),
        key=st.sampled_from(API_KEYS),
        replay=st.booleans(),
    )
    def create(self, amount, token, key, replay):
        self.dirty = True
        body = {"merchant_id": MERCHANT, "amount": amount, "currency": "USD", "source_token": token}
        if key is not None and replay and key in self.api_bodies:
            body = self.api_bodies[key]  # the client's retry: the same body under the same key
        headers = {"HTTP_IDEMPOTENCY_KEY": key} if key else {}
        response = self.api.post("/api/payments/", body, format="json", **headers)
        if key is not None:
            self.api_bodies.setdefault(key, body)
        if response.status_code in (200, 201):
            payment_id = response.json()["id"]
            if key is not None:
                self.api_answers[key].add(payment_id)
            if payment_id not in self.payments:
                self.payments.append(payment_id)
            return
        # Another body under a known key, or a token whose NOC is overdue: refused, nothing made.
        assert response.status_code in (409, 422), (response.status_code, response.content)

    @precondition(lambda self: self.payments)
    @rule(index=st.integers(0, 30), amount=st.sampled_from(REFUND_AMOUNTS))
    def refund(self, index, amount):
        """A merchant refunds part or all of one of its debits through the API: refused (a
        debit not confirmed, more than is left to refund) or made, its money held at once."""
        self.dirty = True
        debit_id = self.payments[index % len(self.payments)]
        response = self.api.post(
            f"/api/payments/{debit_id}/refunds/", {"amount": amount}, format="json"
        )
        if response.status_code == 201:
            self.payments.append(response.json()["id"])
            return
        assert response.status_code in (400, 409, 422), (response.status_code, response.content)

    refund_more = refund

    def _returned(self, index: int) -> str | None:
        """One of the run's returned payments (what the operator's pages offer to act on)."""
        have_returns = {
            str(pk)
            for pk in PaymentReturn.objects.filter(payment_id__in=self.payments).values_list(
                "payment_id", flat=True
            )
        }
        # In the order the run made them: ids are random, and a replay must pick the same one.
        returned = [p for p in self.payments if p in have_returns]
        return returned[index % len(returned)] if returned else None

    @precondition(lambda self: self.payments)
    @rule(index=st.integers(0, 30), code=st.sampled_from(DISHONOR_CODES))
    def dishonor_request(self, index, code):
        self.dirty = True
        payment_id = self._returned(index)
        if payment_id is None:
            return
        try:
            return_dishonor_request(
                payment_id=payment_id,
                reason_code=code,
                note="model: the return is wrong",
                user=self.operator,
                now=self.clock.now(),
            )
        except DishonorRefused:
            return
        self._assert_not_reinitiated(payment_id)

    dishonor_request_more = dishonor_request

    @precondition(lambda self: self.payments)
    @rule(index=st.integers(0, 30))
    def dishonor_resend(self, index):
        self.dirty = True
        payment_id = self._returned(index)
        if payment_id is None:
            return
        try:
            return_dishonor_resend(payment_id=payment_id, now=self.clock.now())
        except DishonorRefused:
            return
        self._assert_not_reinitiated(payment_id)

    @precondition(lambda self: self.payments)
    @rule(index=st.integers(0, 30), authorized=st.booleans())
    def reinitiate(self, index, authorized):
        self.dirty = True
        payment_id = self._returned(index)
        if payment_id is None:
            return
        try:
            payment = payment_reinitiate(
                payment_id=payment_id,
                authorization_reference="auth-model-1" if authorized else "",
                now=self.clock.now(),
            )
        except ReinitiationRefused:
            return
        self.payments.append(str(payment.id))
        self._assert_dishonor_cannot_stand(payment_id)

    reinitiate_more = reinitiate

    @rule()
    def ingest_dead_letters(self):
        self.dirty = True
        dead_letters_ingest(max_messages=100)

    @rule(index=st.integers(0, 30), action=st.sampled_from(("redrive", "redrive", "discard")))
    def triage(self, index, action):
        """An operator decides on an open dead letter: redrives it, or discards it (a
        conflicting resend, say, that must never be applied)."""
        self.dirty = True
        open_ids = list(
            DeadLetter.objects.filter(status=DeadLetterStatus.OPEN)
            .order_by("pk")
            .values_list("pk", flat=True)
        )
        if not open_ids:
            return
        dead_letter = DeadLetter.objects.get(pk=open_ids[index % len(open_ids)])
        decide = dead_letter_redrive if action == "redrive" else dead_letter_discard
        try:
            decide(dead_letter=dead_letter, user=self.operator, note=f"model {action}")
        except TriageError:
            pass

    # --- moves: the queue and the worker -----------------------------------------------------

    @rule(
        turns=st.integers(1, 4),
        batch=st.integers(1, 10),
        several=st.booleans(),
        crash=st.sampled_from((False, False, True)),
    )
    def work(self, turns, batch, several, crash):
        """Turns of the worker's loop: relay, ticks, one receive and its batch each. ``crash``:
        the worker dies between its commits and its delete in the first turn (the delete never
        happens; the messages come back when their visibility timeout runs out)."""
        self.sqs.several_per_group = several
        self.worker.batch_size = batch
        for turn in range(turns):
            self.sqs.fail_deletes = 1 if crash and turn == 0 else 0
            self._turn()
        self.sqs.fail_deletes = 0

    work_more = work  # the worker turns more often than anything else happens

    def _turn(self) -> bool:
        self.dirty = True
        outbox_relay_publish(limit=500)
        processor_breaker_tick()
        messages = self.worker.receive()
        if messages:
            self.worker.process_batch(messages)
        return bool(messages)

    # --- moves: the processor ---------------------------------------------------------------

    @rule(mood=st.sampled_from(MOODS), calls=st.integers(1, 8))
    def processor_mood(self, mood, calls):
        self.processor.set_mood(mood, calls)

    @precondition(lambda self: self.processor.debits)
    @rule(
        index=st.integers(0, 30),
        step=st.sampled_from(("settle", "settle", "fail", "return", "return", "noc")),
        code=st.sampled_from(RETURN_CODES),
    )
    def processor_advance(self, index, step, code):
        debits = list(self.processor.debits.values())
        self.processor.advance(debits[index % len(debits)], step, code)

    @precondition(lambda self: self.processor.debits)
    @rule()
    def processor_tick(self):
        """Time passes at the processor: each debit takes its token's next step, each dishonor
        asked for is answered."""
        self.processor.tick()

    processor_tick_more = processor_tick
    processor_tick_again = processor_tick

    @precondition(lambda self: self.processor.dishonors)
    @rule(
        index=st.integers(0, 10),
        answer=st.sampled_from(("return_dishonored", "return_dishonored", "dishonor_contested")),
    )
    def processor_answers_dishonor(self, index, answer):
        dishonors = list(self.processor.dishonors.values())
        self.processor.answer_dishonor(dishonors[index % len(dishonors)], answer)

    @precondition(lambda self: self.processor.pending)
    @rule(index=st.integers(0, 30))
    def deliver(self, index):
        """The processor posts one of its waiting callbacks, not necessarily the oldest."""
        body = self.processor.pending.pop(index % len(self.processor.pending))
        self._send(body)
        self.processor.sent.append(body)

    @precondition(lambda self: self.processor.pending)
    @rule(index=st.integers(0, 30))
    def drop(self, index):
        """The processor gives up on one of its waiting callbacks: never delivered, only its
        events API still lists it."""
        body = self.processor.pending.pop(index % len(self.processor.pending))
        self.processor.dropped.append(body)

    @rule()
    def pull(self):
        """A pass of the events pull: every event after the stored cursor onto the queue as a
        callback would be, the dropped ones, those delivered already (late: duplicates) and
        those whose callback is still to come (reordered: the callback is the duplicate)."""
        self.dirty = True
        may_fail = self.processor.mood != "ok"  # the processor's mood answers the list too
        result = processor_events_pull()
        assert result.outcome in (PullOutcome.DONE, PullOutcome.FAILED), result.summary()
        assert result.outcome == PullOutcome.DONE or may_fail, result.error
        assert not result.malformed and not result.unqueued, result.summary()

    @precondition(lambda self: self.processor.pending)
    @rule(newest_first=st.booleans())
    def deliver_all(self, newest_first):
        """The processor posts every waiting callback, oldest or newest first."""
        while self.processor.pending:
            self.deliver(-1 if newest_first else 0)

    @precondition(lambda self: self.processor.sent)
    @rule(index=st.integers(0, 30))
    def deliver_again(self, index):
        """The processor posts a callback again: dropped by SQS inside its window, by the
        dedup record after it."""
        self._send(self.processor.sent[index % len(self.processor.sent)])

    @precondition(lambda self: self.processor.sent)
    @rule(index=st.integers(0, 30))
    def deliver_altered(self, index):
        """The processor posts a known event id with another amount: a conflict for a person,
        never applied."""
        body = {**self.processor.sent[index % len(self.processor.sent)], "amount": ALTERED_AMOUNT}
        self._send(body, altered=True)

    def _send(self, body: dict, *, altered: bool = False) -> None:
        """What the callback endpoint does with an authentic callback: parse it, wrap it in the
        queue envelope and send it with its qualified deduplication id."""
        event = parse_processor_event(body)
        message_id = sqs.send_message_now(
            body=processor_event_message(event),
            group_id=str(event.payment_id),
            deduplication_id=event_deduplication_id(event),
        )
        (self.altered if altered else self.sends).append((event.processor_event_id, message_id))

    @rule(step=st.sampled_from(sorted(CLOCK_STEPS)))
    def advance_clock(self, step):
        self.clock.advance(CLOCK_STEPS[step])

    @rule()
    def drain(self):
        """Everything the processor has to say is delivered and the pipeline runs until the
        queue is empty and the DLQ ingested: then every callback is accounted for."""
        self.processor.set_mood("ok", 0)
        while self.processor.pending:
            self.deliver(0)
        self.pull()  # what was dropped comes back this way
        for _ in range(200):
            if self._turn():
                continue
            wait = self.sqs.next_visible_in()
            if wait is None and self.sqs.idle():
                if not outage_holds_waiting():
                    break
                # Submissions wait out a processor outage in the database: the breaker's tick
                # releases them at a pace counted on the clock.
                wait = timedelta(seconds=2)
            self.clock.advance(max(wait or timedelta(seconds=31), timedelta(seconds=1)))
        else:
            raise AssertionError("the pipeline did not drain in 200 turns")
        dead_letters_ingest(max_messages=1000)
        self._check_every_callback_accounted_for()

    drain_more = drain

    @rule()
    def day_passes(self):
        """A banking day in one move: the clock moves a day, the processor takes its next step
        with every debit and answers every dishonor, and the pipeline drains."""
        self.clock.advance(timedelta(days=1))
        self.processor.tick()
        self.drain()

    day_passes_more = day_passes
    day_passes_again = day_passes

    # --- invariants -----------------------------------------------------------------------------

    @invariant()
    def invariants_hold(self):
        if not self.payments or not self.dirty:
            return
        self.dirty = False
        payments = {str(p.id): p for p in Payment.objects.filter(pk__in=self.payments)}
        self._check_charged_once(payments)
        self._check_events_once_and_in_order(payments)
        dishonors = {
            str(d.payment_id): d
            for d in ReturnDishonor.objects.filter(payment_id__in=list(payments))
        }
        self._check_ledger(payments, dishonors)
        self._check_no_remedy_twice(payments, dishonors)
        self._check_nothing_lost()

    def _check_charged_once(self, payments: dict[str, Payment]) -> None:
        for payment_id, keys in self.processor.charges.items():
            assert len(keys) == 1, f"payment {payment_id} charged under {len(keys)} keys: {keys}"
            assert keys[0] == str(payments[payment_id].idempotency_key), (
                f"payment {payment_id} charged under a key that is not its own"
            )
        for key, answered in self.api_answers.items():
            assert len(answered) == 1, f"Idempotency-Key {key} made {len(answered)} payments"
            charged = [p for p in answered if self.processor.charges.get(p)]
            assert len(charged) <= 1

    def _check_events_once_and_in_order(self, payments: dict[str, Payment]) -> None:
        rows = list(
            PaymentEvent.objects.filter(payment_id__in=list(payments))
            .order_by("pk")
            .values(
                "payment_id",
                "kind",
                "outcome",
                "processor_event_id",
                "from_state",
                "to_state",
                "caused_by",
            )
        )
        claims = set(
            ProcessedEvent.objects.filter(payment_id__in=list(payments)).values_list(
                "processor_event_id", flat=True
            )
        )
        taken: dict[str, int] = defaultdict(int)
        state: dict[str, str] = {}
        last_sequence: dict[str, int] = {}
        for row in rows:
            payment_id = str(row["payment_id"])
            if row["from_state"] and row["to_state"] and row["from_state"] != row["to_state"]:
                before = state.get(payment_id, PaymentState.PENDING)
                assert row["from_state"] == before, (
                    f"payment {payment_id} moved {row['from_state']}->{row['to_state']} "
                    f"from {before}"
                )
                state[payment_id] = row["to_state"]
            if row["kind"] != EventKind.PROCESSOR_EVENT or row["outcome"] == EventOutcome.DUPLICATE:
                continue
            event_id = row["processor_event_id"]
            taken[event_id] += 1
            assert taken[event_id] == 1, f"event {event_id} applied {taken[event_id]} times"
            assert event_id in claims, f"event {event_id} applied without its dedup record"
            caused_by = row["caused_by"]
            if caused_by.startswith("sqs:"):
                sequence = self.sqs.sequence_of(self.sqs.root_message_id(caused_by[4:]))
                if sequence is not None:
                    previous = last_sequence.get(payment_id, -1)
                    assert sequence > previous, (
                        f"event {event_id} of payment {payment_id} applied out of its queue order"
                    )
                    last_sequence[payment_id] = sequence
        for payment_id, payment in payments.items():
            assert state.get(payment_id, PaymentState.PENDING) == payment.state, (
                f"payment {payment_id} is {payment.state} but its log ends in "
                f"{state.get(payment_id, PaymentState.PENDING)}"
            )
        unlogged = claims - set(taken)
        assert not unlogged, f"dedup records without an event applied: {sorted(unlogged)}"

    def _check_ledger(
        self, payments: dict[str, Payment], dishonors: dict[str, ReturnDishonor]
    ) -> None:
        entries: dict[str, dict[str, Decimal]] = defaultdict(dict)
        for payment_id, kind, amount in LedgerEntry.objects.filter(
            payment_id__in=list(payments)
        ).values_list("payment_id", "kind", "amount"):
            assert kind not in entries[str(payment_id)], f"two {kind} entries for {payment_id}"
            entries[str(payment_id)][kind] = amount
        returns = {
            str(r.payment_id): r
            for r in PaymentReturn.objects.filter(payment_id__in=list(payments))
        }
        for payment_id, payment in payments.items():
            ach_return = returns.get(payment_id)
            if payment.direction == PaymentDirection.CREDIT:
                self._check_credit_ledger(payment, ach_return, entries.get(payment_id, {}))
                continue
            settled = payment.state == PaymentState.CONFIRMED or (
                payment.state == PaymentState.RETURNED
            )
            reversed_ = payment.state == PaymentState.RETURNED
            assert not reversed_ or (ach_return is not None and ach_return.after_settlement)
            dishonor = dishonors.get(payment_id)
            recredit = reversed_ and dishonor is not None and bool(dishonor.dishonored_event_id)
            recredit_reversed = recredit and bool(dishonor.contested_event_id)
            amount = payment.amount
            expected = {}
            if settled:
                expected["credit"] = amount
            if reversed_:
                expected["reversal"] = -amount
            if recredit:
                expected["recredit"] = amount
            if recredit_reversed:
                expected["recredit_reversal"] = -amount
            assert entries.get(payment_id, {}) == expected, (
                f"payment {payment_id} ({payment.state}) has ledger {entries.get(payment_id)}, "
                f"its history implies {expected}"
            )

    @staticmethod
    def _check_credit_ledger(payment: Payment, ach_return, entries: dict[str, Decimal]) -> None:
        """A refund holds its money from its making (its entry, however it ends); the money
        comes back once, with an entry of its own, when the bank returned the credit: it ends
        ``returned``, or ``failed`` by a return delivered before its settlement (a credit is
        returned only once it settled). A recovery owed (its debit's return after it was sent)
        is the double loss's to check."""
        amount = payment.amount
        back = payment.state == PaymentState.RETURNED or (
            payment.state == PaymentState.FAILED
            and ach_return is not None
            and not ach_return.after_failure
        )
        expected = {"refund": -amount}
        if back:
            expected["refund_return"] = amount
        found = {k: v for k, v in entries.items() if k != "recovery_owed"}
        assert found == expected, (
            f"refund {payment.id} ({payment.state}) has ledger {entries}, its history implies "
            f"{expected}"
        )

    def _check_no_remedy_twice(
        self, payments: dict[str, Payment], dishonors: dict[str, ReturnDishonor]
    ) -> None:
        """A returned entry is sent again (reinitiated) or its return dishonored, not both: a
        standing dishonor re-credits the merchant and the reinitiation charges the customer
        again. The services refuse each other (checked where the model calls them:
        ``reinitiate``, ``dishonor_request``); what no check can stop, the processor's own
        answer to a request that timed out, stands only with the high alert that names it."""
        for payment_id in self._reinitiated(payments):
            dishonor = dishonors.get(payment_id)
            if dishonor is None or not dishonor.dishonored_event_id or dishonor.contested_event_id:
                continue
            assert Alert.objects.filter(
                key=f"payment.dishonor_after_reinitiation:{payment_id}",
                severity=AlertSeverity.HIGH,
            ).exists(), (
                f"payment {payment_id} was reinitiated and its return's dishonor stands, with no "
                "alert for a person"
            )

    @staticmethod
    def _reinitiated(payments: dict[str, Payment]) -> set[str]:
        """The entries another entry of their chain sent again."""
        numbers = {
            (str(p.reinitiation_of_id or p.id), p.reinitiation_number or 0): pid
            for pid, p in payments.items()
        }
        return {
            numbers[(str(p.reinitiation_of_id), p.reinitiation_number - 1)]
            for p in payments.values()
            if p.reinitiation_of_id is not None
            and (str(p.reinitiation_of_id), p.reinitiation_number - 1) in numbers
        }

    def _assert_dishonor_cannot_stand(self, entry_id: str) -> None:
        """At a reinitiation: the return has no dishonor that stood, or may yet stand (asked for
        and unanswered, or failed with a call the processor may have taken, inside its window);
        a contested one, a refused one (4xx) or one past its window leaves it reinitiable."""
        dishonor = (
            ReturnDishonor.objects.filter(payment_id=entry_id).select_related("ach_return").first()
        )
        if dishonor is None or dishonor.contested_event_id:
            return
        assert not dishonor.dishonored_event_id, (
            f"payment {entry_id} was reinitiated after its return's dishonor stood"
        )
        assert dishonor.request_status not in (
            DishonorRequestStatus.REQUESTED,
            DishonorRequestStatus.SENT,
        ), f"payment {entry_id} was reinitiated while its dishonor was {dishonor.request_status}"
        if dishonor.request_status == DishonorRequestStatus.FAILED:
            last = (
                ProcessorAttempt.objects.filter(idempotency_key=dishonor.idempotency_key)
                .order_by("-attempt_number")
                .first()
            )
            refused = last is not None and last.outcome == AttemptOutcome.REJECTED
            past_window = self.clock.now() > dishonor_deadline(dishonor.ach_return.returned_at)
            assert refused or past_window, (
                f"payment {entry_id} was reinitiated while a dishonor call the processor may "
                "have taken could still stand"
            )

    def _assert_not_reinitiated(self, entry_id: str) -> None:
        """At a dishonor request that was not refused: the return was not reinitiated."""
        payments = {str(p.id): p for p in Payment.objects.filter(pk__in=self.payments)}
        assert entry_id not in self._reinitiated(payments), (
            f"a dishonor of payment {entry_id}'s return was asked for after it was reinitiated"
        )

    def _check_nothing_lost(self) -> None:
        """Every message the queue took is still in it, or finished (applied, parked or dead-
        lettered) by the worker; nothing reached the DLQ by receives alone; every dead letter
        has its error history; every parked message waits behind a hold. A finished message
        stays finished, so each is looked at once."""
        left = {
            m.message_id: m.left_by
            for m in self.sqs.main.messages
            if m.deleted and m.message_id not in self.finished
        }
        by_policy = [mid for mid, how in left.items() if how == "redrive_policy"]
        assert not by_policy, f"moved to the DLQ by receives alone: {by_policy}"
        if left:
            rows = QueueMessage.objects.filter(message_id__in=list(left)).annotate(
                has_errors=Exists(ProcessingError.objects.filter(queue_message=OuterRef("pk")))
            )
            found = {
                message_id: (status, has_errors)
                for message_id, status, has_errors in rows.values_list(
                    "message_id", "status", "has_errors"
                )
            }
            for message_id in left:
                status, has_errors = found.get(message_id, (None, False))
                assert status in FINISHED_STATUSES, (
                    f"message {message_id} left the queue as {status!r}"
                )
                assert status != QueueMessageStatus.DEAD_LETTERED or has_errors, (
                    f"dead letter {message_id} has no error history"
                )
                self.finished.add(message_id)
        released = ParkedMessage.objects.filter(
            republished_message_id="", hold__released_at__isnull=False
        ).values_list("message_id", flat=True)
        assert not released, f"parked messages wait behind a released hold: {list(released)}"

    def _check_every_callback_accounted_for(self) -> None:
        """After a drain: each callback sent was applied (or recorded, or stale), or is with a
        person: in a dead letter not redriven (open, or closed by their decision), or parked
        behind a hold for one. A conflicting resend is never applied."""
        applied = defaultdict(set)
        for event_id, amount in (
            PaymentEvent.objects.filter(kind=EventKind.PROCESSOR_EVENT)
            .exclude(outcome=EventOutcome.DUPLICATE)
            .values_list("processor_event_id", "payload__amount")
        ):
            applied[event_id].add(amount)
        with_person = set(
            DeadLetter.objects.exclude(status=DeadLetterStatus.REDRIVEN).values_list(
                "processor_event_id", flat=True
            )
        )
        for body in ParkedMessage.objects.filter(
            republished_message_id="", hold__kind=HoldKind.TRIAGE
        ).values_list("body", flat=True):
            event = (body or {}).get("event") or {}
            with_person.add(event.get("processor_event_id", ""))
        for event_id, message_id in self.sends:
            assert event_id in applied or event_id in with_person, (
                f"callback {event_id} (message {message_id}) was neither applied nor left for a "
                "person"
            )
        for body in self.processor.dropped:
            event_id = body["processor_event_id"]
            assert event_id in applied or event_id in with_person, (
                f"dropped callback {event_id} was not pulled back: neither applied nor left for "
                "a person"
            )
        for event_id, message_id in self.altered:
            assert ALTERED_AMOUNT not in applied[event_id], (
                f"the conflicting resend of {event_id} (message {message_id}) was applied"
            )
