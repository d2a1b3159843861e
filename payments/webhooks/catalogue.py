"""The event types a merchant's endpoints may ask for, declared once: a payment, refund or payout
made and each state it reaches by a transition; the review decision on one held; the facts
about a debit's return and its refunds (a notification of change, a dishonor, a double loss);
an account's validation; and the endpoint's own disabling."""

from payments.models import PaymentPurpose, PaymentState

# What a money movement is called in an event type, by its purpose.
NOUNS = {
    PaymentPurpose.COLLECTION: "payment",
    PaymentPurpose.REFUND: "refund",
    PaymentPurpose.PAYOUT: "payout",
}
# Pending is where a movement starts (``<noun>.created``), not a transition's target.
REACHED_STATES = tuple(state for state in PaymentState if state != PaymentState.PENDING)
CREATED = "created"
REVIEW_DECISIONS = ("review_approved", "review_rejected")

NOC_RECEIVED = "noc.received"
NOC_APPLIED = "noc.applied"
DISHONOR_RECORDED = "return.dishonored"
DISHONOR_CONTESTED = "return.dishonor_contested"
DOUBLE_LOSS_OPENED = "double_loss.opened"
DOUBLE_LOSS_RESOLVED = "double_loss.resolved"
# Written by the account validation (``payments.webhooks.events.event_record``).
ACCOUNT_VALIDATED = "account_validation.validated"
ACCOUNT_VALIDATION_FAILED = "account_validation.failed"
ENDPOINT_DISABLED = "webhook_endpoint.disabled"

EVENT_TYPES: tuple[str, ...] = (
    *(f"{noun}.{CREATED}" for noun in NOUNS.values()),
    *(f"{noun}.{state}" for noun in NOUNS.values() for state in REACHED_STATES),
    *(f"{noun}.{decision}" for noun in NOUNS.values() for decision in REVIEW_DECISIONS),
    NOC_RECEIVED,
    NOC_APPLIED,
    DISHONOR_RECORDED,
    DISHONOR_CONTESTED,
    DOUBLE_LOSS_OPENED,
    DOUBLE_LOSS_RESOLVED,
    ACCOUNT_VALIDATED,
    ACCOUNT_VALIDATION_FAILED,
    ENDPOINT_DISABLED,
)


def event_type_of_state(purpose: str, state: str) -> str:
    """``payment.confirmed``, ``refund.created``: a movement made (pending) or reaching a
    state."""
    return f"{NOUNS[purpose]}.{CREATED if state == PaymentState.PENDING else state}"


def event_type_of_review(purpose: str, decision: str) -> str:
    return f"{NOUNS[purpose]}.review_{decision}"
