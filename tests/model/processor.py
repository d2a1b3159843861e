"""The simulated processor: a ``ProcessorBackend`` whose processor lives in the test's process.

``SimProcessor`` keeps debits by idempotency key and charges a key once, as the contract asks
of a processor; the model counts every charge, so a second key for one payment (or a second
payment for one API Idempotency-Key) shows as a second charge. Its mood answers each call:
``ok``; ``timeout_after_charge`` (charged, then no answer); ``5xx``, ``429`` and ``timeout``
(nothing charged); ``4xx`` (a new key refused); ``flap`` (every other call a 503). A known key
is answered with its original result whatever the mood, unless the processor is down.

Its callbacks wait in ``pending`` until the model delivers them, in any order, and stay in
``sent`` to be delivered again (inside SQS's deduplication window or after it); one may be
dropped instead (``dropped``: given up, never delivered). Its events API lists every event it
emitted (``history``), delivered or not, after a cursor (the position in the list), as the
pull reads it: a dropped event comes back only that way, a delivered one again (late, or before
its callback: reordered). Each debit
moves through the processor's own life (submitted, then settled or failed or returned before
settlement; a settled one returned; any charged one a NOC), and so does a credit (a refund:
``credit_create``; no NOC) only when the model says so, and
a dishonor request is answered (dishonored, contested, or contested first) the same way.

``ModelProcessorBackend`` is the class ``PROCESSOR_BACKEND`` names during a run; it hands every
call to the run's ``SimProcessor`` (``SimProcessor.current``).
"""

from __future__ import annotations

import itertools
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from decimal import Decimal

from payments.processor.backend import (
    CallbackRequest,
    CallErrorKind,
    CallTimer,
    DebitAccepted,
    DebitStatus,
    DishonorAccepted,
    EventsPage,
    ProcessorBackend,
    ProcessorCallRejected,
    ProcessorCallUnavailable,
)
from payments.processor.contract import processor_event_parse
from sandbox.server import noc_corrected_data

# What a debit's token makes of it at the processor, one step per tick (``SimProcessor.tick``).
SCRIPTS: dict[str, tuple[tuple[str, str], ...]] = {
    "tok_model_ok": (("settle", ""),),
    "tok_model_nsf": (("settle", ""), ("return", "R01")),
    "tok_model_nsf_contest": (("settle", ""), ("return", "R09")),
    "tok_model_unauth": (("settle", ""), ("return", "R10")),
    "tok_model_fail": (("fail", ""),),
    "tok_model_early": (("return", "R01"),),
    "tok_model_noc": (("settle", ""), ("noc", "")),
}
MOODS = ("ok", "timeout_after_charge", "timeout", "5xx", "429", "4xx", "flap")


@dataclass
class Debit:
    key: str
    payment_id: str
    amount: Decimal
    processor_id: str
    token: str = ""
    direction: str = "debit"  # or "credit": money out (a refund), its life the same
    status: str = "submitted"  # submitted, settled, failed, returned
    returned: bool = False
    noc_sent: bool = False


@dataclass
class Dishonor:
    key: str
    debit_key: str
    payment_id: str
    reason_code: str
    answered: set[str] = field(default_factory=set)  # return_dishonored, dishonor_contested


class SimProcessor:
    current: SimProcessor | None = None

    def __init__(self, clock) -> None:
        self.clock = clock
        self.mood = "ok"
        self.mood_calls = 0  # calls left in the mood; then it is "ok" again
        self._calls = 0
        self._ids = itertools.count(1)
        self.debits: dict[str, Debit] = {}
        self.refused: set[str] = set()
        # Every charge the processor made: payment id -> the keys it charged (once each).
        self.charges: dict[str, list[str]] = defaultdict(list)
        self.dishonors: dict[str, Dishonor] = {}
        self.pending: list[dict] = []
        self.sent: list[dict] = []
        self.dropped: list[dict] = []
        self.history: list[dict] = []  # every event emitted, as the events API lists them

    # --- what the model does to it ---------------------------------------------------------

    def debits_in(self, *statuses: str) -> list[Debit]:
        return [d for d in self.debits.values() if d.status in statuses]

    def advance(self, debit: Debit, step: str, reason_code: str = "") -> None:
        """Move a debit on in the processor's own life and emit the callback that says so."""
        if step == "settle" and debit.status == "submitted":
            debit.status = "settled"
            self._emit(debit, "settled")
        elif step == "fail" and debit.status == "submitted":
            debit.status = "failed"
            self._emit(debit, "failed", reason_code="R03")
        elif step == "return" and debit.status in ("submitted", "settled") and not debit.returned:
            debit.returned = True
            debit.status = "returned"
            self._emit(debit, "returned", reason_code=reason_code or "R01")
        elif step == "noc" and not debit.noc_sent and debit.direction == "debit":
            debit.noc_sent = True
            body = self._event(debit, "notification_of_change")
            body.update(change_code="C05", corrected_data=noc_corrected_data("C05"))
            self._publish(body)

    def tick(self) -> None:
        """Time passes at the processor: every debit takes the next step of the life its token
        scripts (``SCRIPTS``), and every dishonor asked for is answered (contested too, for a
        token with ``contest`` in it)."""
        for debit in list(self.debits.values()):
            script = SCRIPTS.get(debit.token, ())
            for step, code in script:
                before = (debit.status, debit.returned, debit.noc_sent)
                self.advance(debit, step, code)
                if (debit.status, debit.returned, debit.noc_sent) != before:
                    break
        for dishonor in self.dishonors.values():
            debit = self.debits[dishonor.debit_key]
            if "contest" in debit.token:
                self.answer_dishonor(dishonor, "dishonor_contested")
            self.answer_dishonor(dishonor, "return_dishonored")

    def answer_dishonor(self, dishonor: Dishonor, answer: str) -> None:
        debit = self.debits[dishonor.debit_key]
        if answer in dishonor.answered:
            return
        dishonor.answered.add(answer)
        code = dishonor.reason_code if answer == "return_dishonored" else "R76"
        self._emit(debit, answer, reason_code=code)

    def _emit(self, debit: Debit, event_type: str, reason_code: str = "") -> None:
        self._publish(self._event(debit, event_type, reason_code))

    def _publish(self, body: dict) -> None:
        """An event happened: its callback waits to be delivered, and the events API lists it."""
        self.pending.append(body)
        self.history.append(body)

    def _event(self, debit: Debit, event_type: str, reason_code: str = "") -> dict:
        body = {
            "payment_id": debit.payment_id,
            "event_type": event_type,
            "processor_event_id": f"evt_{next(self._ids)}",
            "amount": f"{debit.amount:.2f}",
            "currency": "USD",
            "processor_id": debit.processor_id,
            "timestamp": self.clock.now().isoformat(),
        }
        if reason_code:
            body["reason_code"] = reason_code
        if debit.direction == "credit":
            body["direction"] = "credit"
        return body

    # --- the calls the module makes --------------------------------------------------------

    def set_mood(self, mood: str, calls: int) -> None:
        """The next ``calls`` calls are answered in ``mood``: an outage, a pause or a streak of
        refusals ends."""
        self.mood, self.mood_calls = mood, calls

    def _answer_mood(self) -> str:
        self._calls += 1
        mood = self.mood
        if self.mood_calls > 0:
            self.mood_calls -= 1
            if self.mood_calls == 0:
                self.mood = "ok"
        if mood == "flap":
            return "5xx" if self._calls % 2 else "ok"
        return mood

    @staticmethod
    def _unavailable(timer: CallTimer, status: int | None, kind: CallErrorKind, why: str):
        retry_after = 0.001 if status == 429 else None
        call = timer.record(http_status=status, error_kind=kind, error=why, retry_after=retry_after)
        return ProcessorCallUnavailable(why, call=call)

    def _down(self, timer: CallTimer, mood: str):
        if mood in ("timeout", "timeout_after_charge"):
            return self._unavailable(timer, None, CallErrorKind.TIMEOUT, "read timed out")
        if mood == "5xx":
            return self._unavailable(timer, 503, CallErrorKind.HTTP, "HTTP 503")
        if mood == "429":
            return self._unavailable(timer, 429, CallErrorKind.HTTP, "HTTP 429")
        return None

    def debit_create(
        self,
        *,
        idempotency_key,
        payment_id,
        amount,
        currency,
        source_token,
        sec_code="",
        company_entry_description="",
    ):
        return self._transfer_create("debit", idempotency_key, payment_id, amount, source_token)

    def credit_create(
        self,
        *,
        idempotency_key,
        payment_id,
        amount,
        currency,
        destination_token,
        sec_code="",
        company_entry_description="",
    ):
        return self._transfer_create(
            "credit", idempotency_key, payment_id, amount, destination_token
        )

    def _transfer_create(self, direction, idempotency_key, payment_id, amount, token):
        key = str(idempotency_key)
        timer = CallTimer(method="POST", url=f"sim://v1/ach/{direction}s")
        mood = self._answer_mood()
        if mood in ("timeout", "5xx", "429"):
            raise self._down(timer, mood)
        known = self.debits.get(key)
        if known is not None:
            return DebitAccepted(
                processor_id=known.processor_id,
                status=known.status,
                created=False,
                call=timer.record(http_status=200),
            )
        if mood == "4xx" or key in self.refused:
            self.refused.add(key)
            call = timer.record(http_status=422, error_kind=CallErrorKind.HTTP, error="HTTP 422")
            raise ProcessorCallRejected("HTTP 422: account closed", call=call)
        debit = Debit(
            key=key,
            payment_id=str(payment_id),
            amount=Decimal(amount),
            processor_id=f"prc_{uuid.UUID(key).hex[:12]}",
            token=token,
            direction=direction,
        )
        self.debits[key] = debit
        self.charges[str(payment_id)].append(key)
        self._emit(debit, "submitted")  # the processor tells of the submission too: stale then
        if mood == "timeout_after_charge":
            raise self._down(timer, mood)
        return DebitAccepted(
            processor_id=debit.processor_id,
            status=debit.status,
            created=True,
            call=timer.record(http_status=201),
        )

    def credit_get(self, *, idempotency_key):
        return self.debit_get(idempotency_key=idempotency_key)

    def debit_get(self, *, idempotency_key):
        timer = CallTimer(method="GET", url="sim://v1/ach/debits")
        debit = self.debits.get(str(idempotency_key))
        if debit is None:
            return DebitStatus(found=False, processor_id="", status="", call=timer.record())
        return DebitStatus(
            found=True,
            processor_id=debit.processor_id,
            status=debit.status,
            call=timer.record(http_status=200),
        )

    def events_list(self, *, after, limit):
        """The events after the cursor ``after`` (a position in ``history``), oldest first."""
        timer = CallTimer(method="GET", url="sim://v1/events")
        mood = self._answer_mood()
        if mood in ("timeout", "5xx", "429"):
            raise self._down(timer, mood)
        start = int(after or 0)
        end = min(len(self.history), start + limit)
        return EventsPage(
            data=tuple(dict(body) for body in self.history[start:end]),
            next_cursor=str(end),
            has_more=end < len(self.history),
            call=timer.record(http_status=200),
        )

    def return_dishonor(
        self,
        *,
        idempotency_key,
        debit_idempotency_key,
        payment_id,
        processor_id,
        return_event_id,
        reason_code,
        amount,
        currency,
    ):
        key = str(idempotency_key)
        timer = CallTimer(method="POST", url="sim://v1/ach/debits/dishonors")
        mood = self._answer_mood()
        if mood in ("timeout", "5xx", "429"):
            raise self._down(timer, mood)
        known = self.dishonors.get(key)
        if known is None:
            if mood == "4xx":
                call = timer.record(
                    http_status=422, error_kind=CallErrorKind.HTTP, error="HTTP 422"
                )
                raise ProcessorCallRejected("HTTP 422: not dishonorable", call=call)
            known = Dishonor(
                key=key,
                debit_key=str(debit_idempotency_key),
                payment_id=str(payment_id),
                reason_code=reason_code,
            )
            self.dishonors[key] = known
            if mood == "timeout_after_charge":
                raise self._down(timer, mood)
            created = True
        else:
            created = False
        return DishonorAccepted(
            dishonor_id=f"dsh_{key[:8]}",
            status="requested",
            created=created,
            call=timer.record(http_status=202 if created else 200),
        )


class ModelProcessorBackend(ProcessorBackend):
    """The backend a model run names in ``PROCESSOR_BACKEND``: the run's simulated processor."""

    @staticmethod
    def _processor() -> SimProcessor:
        if SimProcessor.current is None:
            raise RuntimeError("no model run is in progress")
        return SimProcessor.current

    def debit_create(self, **kwargs):
        return self._processor().debit_create(**kwargs)

    def debit_get(self, **kwargs):
        return self._processor().debit_get(**kwargs)

    def credit_create(self, **kwargs):
        return self._processor().credit_create(**kwargs)

    def credit_get(self, **kwargs):
        return self._processor().credit_get(**kwargs)

    def return_dishonor(self, **kwargs):
        return self._processor().return_dishonor(**kwargs)

    def events_list(self, **kwargs):
        return self._processor().events_list(**kwargs)

    def callback_verify(self, request: CallbackRequest) -> None:
        """The model hands its callbacks straight to the queue; nothing comes over HTTP."""

    def callback_parse(self, data, request: CallbackRequest):
        return processor_event_parse(data)
