"""The processor event as the payments app sees it, whatever transport carried it."""

import hashlib
import json
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal

from payments.models import PaymentState

EVENT_TYPES = ("submitted", "settled", "failed", "returned")

# Which state each processor event type drives the payment to, before settlement.
EVENT_TARGET_STATE = {
    "submitted": PaymentState.SUBMITTED,
    "settled": PaymentState.CONFIRMED,
    "failed": PaymentState.FAILED,
    "returned": PaymentState.FAILED,
}
# A return of a debit that has settled is no failure: the payment is returned, its credit
# reversed.
SETTLED_STATES = (PaymentState.CONFIRMED, PaymentState.RETURNED)


def event_target_state(event_type: str, current: str) -> str:
    """The state ``event_type`` drives a payment in state ``current`` to."""
    if event_type == "returned" and current in SETTLED_STATES:
        return PaymentState.RETURNED
    return EVENT_TARGET_STATE[event_type]


@dataclass(frozen=True)
class ProcessorEvent:
    payment_id: uuid.UUID
    event_type: str
    processor_event_id: str
    amount: Decimal
    timestamp: datetime
    reason_code: str = ""
    message: str = ""
    raw: dict = field(default_factory=dict, compare=False)

    def target_state(self, current: str) -> str:
        return event_target_state(self.event_type, current)

    @property
    def fingerprint(self) -> str:
        """Hash of the fields that define the event; a repeat with another hash is a conflict.

        The free-text ``message`` is left out: processors reword it between deliveries.
        """
        canonical = json.dumps(
            {
                "payment_id": str(self.payment_id),
                "event_type": self.event_type,
                "amount": f"{self.amount:.2f}",
                "timestamp": self.timestamp.astimezone(UTC).isoformat(),
                "reason_code": self.reason_code,
            },
            sort_keys=True,
        )
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
        }
