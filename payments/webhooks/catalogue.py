"""The event types a merchant's endpoints may ask for, declared once: one per state a payment,
refund or payout reaches by a transition, and the endpoint's own disabling."""

from payments.models import PaymentPurpose, PaymentState

# What a money movement is called in an event type, by its purpose.
NOUNS = {
    PaymentPurpose.COLLECTION: "payment",
    PaymentPurpose.REFUND: "refund",
    PaymentPurpose.PAYOUT: "payout",
}
# Pending is where a movement starts, not a transition's target.
REACHED_STATES = tuple(state for state in PaymentState if state != PaymentState.PENDING)

ENDPOINT_DISABLED = "webhook_endpoint.disabled"

EVENT_TYPES: tuple[str, ...] = (
    *(f"{noun}.{state}" for noun in NOUNS.values() for state in REACHED_STATES),
    ENDPOINT_DISABLED,
)


def event_type_of_state(purpose: str, state: str) -> str:
    return f"{NOUNS[purpose]}.{state}"
