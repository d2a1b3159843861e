"""Prometheus metrics of the payments core.

Counters are incremented after commit (``transaction.on_commit``) so a rolled-back transition
is never counted. Multi-process collection is configured by the operations layer
(PROMETHEUS_MULTIPROC_DIR); these definitions work in both modes.
"""

from prometheus_client import Counter, Histogram

TRANSITIONS = Counter(
    "payments_transitions_total",
    "Payment state transitions applied, by from and to state.",
    ["from_state", "to_state"],
)
MONEY_OUT = Counter(
    "payments_money_out_total",
    "Refunds and payouts (credits) made and moved, by purpose and the state they reached "
    "(pending: made).",
    ["purpose", "to_state"],
)
CREDIT_RETURNS = Counter(
    "payments_credit_returns_total",
    "Refunds and payouts the receiving bank sent back, by purpose: counted apart from the debits' "
    "returns (a merchant's return rates are its debits').",
    ["purpose"],
)
DOUBLE_LOSSES = Counter(
    "payments_double_losses_total",
    "Debits returned after a refund of them was sent: the customer has the money twice.",
)
PROCESSOR_REQUEST_SECONDS = Histogram(
    "payments_processor_request_seconds",
    "Latency of calls to the processor, by operation and outcome.",
    ["operation", "outcome"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
)
REVIEW_HOLDS = Counter(
    "payments_review_holds_total",
    "Payments created held for a person's review, by the rule that held them (exposure_limit or "
    "a fraud rule's name).",
    ["rule"],
)
REVIEW_DECISIONS = Counter(
    "payments_review_decisions_total",
    "Decisions on held payments, by the rule that held them and the decision (approved, rejected).",
    ["rule", "decision"],
)
