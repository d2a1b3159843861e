"""The processor event as the payments app sees it, whatever transport carried it.

What each event type is and does is declared in the catalogue (``payments.catalogue``).
"""

import hashlib
import json
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal

from payments.catalogue import EventTypeKind, event_type_names
from payments.models import PAYMENT_GRAPH


def event_types() -> tuple[str, ...]:
    """Every event type of the contract, from the catalogue."""
    return event_type_names()


def event_target_state(event_type: str, current: str) -> str:
    """The state the transition type ``event_type`` drives a payment in state ``current`` to."""
    return PAYMENT_GRAPH.event_target(event_type, current)


def transition_event_types() -> tuple[str, ...]:
    return event_type_names(EventTypeKind.TRANSITION)


# A payment is a debit (it collects) or, money out, a credit (``PaymentDirection``).
DIRECTIONS = ("debit", "credit")

# The fields of the payment an event may restate, each compared with the payment's before the
# event is applied (``payments.services``): a difference is a mismatch for a human, never
# applied. ``amount`` is always sent; ``currency``, ``direction`` and ``processor_id`` are
# optional ("" = not stated) and compared when stated (``processor_id`` only once the payment
# has the processor's id: before our submission's answer is recorded there is nothing to compare
# it with, and an event never sets it).
#
# Not restated, so not compared:
# - ``payment_id`` is the key the event is looked up by, not a restatement; the worker checks it
#   against the queue message's group.
# - ``merchant_id``: the processor never learns our merchant (a debit is submitted with
#   payment_id, amount, currency and source_token only), so a ``merchant_id`` in a callback is
#   the processor's own identifier, in another namespace; it stays unread in ``raw``, and money
#   always moves for the payment's own merchant.
# - ``source_token`` and ``idempotency_key``: the contract does not carry them, so callbacks
#   (logged, kept in the event log, shown in the admin) hold no reference to a bank account.
# - ``description``: free text of ours, never sent to the processor.
RESTATED_FIELDS = ("amount", "currency", "direction", "processor_id")


@dataclass(frozen=True)
class ProcessorEvent:
    payment_id: uuid.UUID
    event_type: str
    processor_event_id: str
    amount: Decimal
    timestamp: datetime
    reason_code: str = ""
    message: str = ""
    currency: str = ""  # ISO 4217; "" = not stated
    direction: str = ""  # "debit" or "credit"; "" = not stated
    processor_id: str = ""  # the processor's id of the debit; "" = not stated
    # The fields its type carries beyond these (``payments.catalogue``), as validated.
    details: dict = field(default_factory=dict, hash=False)
    raw: dict = field(default_factory=dict, compare=False)

    COMMON_FIELDS = (
        "payment_id",
        "event_type",
        "processor_event_id",
        "amount",
        "timestamp",
        "reason_code",
        "message",
        "currency",
        "direction",
        "processor_id",
    )

    @classmethod
    def of(cls, *, raw: dict | None = None, **fields) -> "ProcessorEvent":
        """The event from its validated fields: the common ones by name, every other stated
        one into ``details`` (an empty value is not stated)."""
        common = {name: fields.pop(name) for name in cls.COMMON_FIELDS if name in fields}
        details = {name: value for name, value in fields.items() if value}
        return cls(**common, details=details, raw=raw if raw is not None else {})

    @property
    def change_code(self) -> str:
        """A notification of change's C-code; "" for any other event."""
        return self.details.get("change_code", "")

    @property
    def corrected_data(self) -> dict:
        """A notification of change's corrected fields."""
        return self.details.get("corrected_data", {})

    @property
    def fingerprint(self) -> str:
        """Hash of the fields that define the event; a repeat with another hash is a conflict.

        The type's own fields (a NOC's ``change_code`` and ``corrected_data``) count like the
        optional fields.
        The free-text ``message`` is left out: processors reword it between deliveries. The
        optional restated fields count only when stated, so an event without them keeps the hash
        it had before they existed (dedup records written then still recognise its repeats).
        """
        fields = {
            "payment_id": str(self.payment_id),
            "event_type": self.event_type,
            "amount": f"{self.amount:.2f}",
            "timestamp": self.timestamp.astimezone(UTC).isoformat(),
            "reason_code": self.reason_code,
        }
        fields.update(self._optional_fields())
        canonical = json.dumps(fields, sort_keys=True)
        return hashlib.sha256(canonical.encode()).hexdigest()

    def as_payload(self) -> dict:
        return {
            "payment_id": str(self.payment_id),
            "event_type": self.event_type,
            "processor_event_id": self.processor_event_id,
            "amount": f"{self.amount:.2f}",
            "timestamp": self.timestamp.isoformat(),
            "reason_code": self.reason_code,
            "message": self.message,
            **self._optional_fields(),
        }

    def _optional_fields(self) -> dict:
        """The optional restated fields that were stated; an absent one stays absent (its empty
        value is no valid ISO code or id, so the envelope must not carry it)."""
        stated = {
            "currency": self.currency,
            "direction": self.direction,
            "processor_id": self.processor_id,
            **self.details,
        }
        return {name: value for name, value in stated.items() if value}
