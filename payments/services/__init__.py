"""Writes to payments, by concern. Each service owns its transaction.

- ``create``: input checks, the payment, its audit row and its submit command (the outbox);
- ``events``: applying a processor event exactly once; ``returns``: the ACH return it may carry;
  ``nocs``: the notification of change it may carry, and the debits an overdue one blocks;
- ``cancel``: a pending payment canceled before origination, once, against the submission;
- ``reinitiation``: a returned debit sent again as a new payment, within NACHA's limits;
- ``dishonors``: the operator's dishonor of a return, and the money the processor's answers move;
- ``transitions``: a state change in memory, its rows and its announcements;
- ``writes``: the payment's row lock and the one write of an event's rows (two backends);
- ``submission`` and ``status``: the calls to the processor, over ``calls``, what both share.

The names below are the package's interface; import them from ``payments.services``.
"""

from payments.retention import processed_events_purge
from payments.services.calls import STATUS_OPERATION, SUBMIT_OPERATION
from payments.services.cancel import CancelResult, payment_cancel
from payments.services.create import (
    _TOKEN_RE,
    BANK_NUMBER_MESSAGE,
    SUBMIT_PAYMENT,
    SUPPORTED_CURRENCIES,
    looks_like_bank_number,
    outbox_enqueue,
    payment_create,
    validate_source_token,
)
from payments.services.dishonors import (
    DISHONOR_OPERATION,
    DishonorResult,
    return_dishonor_request,
    return_dishonor_resend,
)
from payments.services.events import ApplyOutcome, ApplyResult, payment_apply_event
from payments.services.nocs import (
    NocNoteRequired,
    NocNotOpen,
    noc_debit_check,
    noc_mark_applied,
    noc_warning,
    nocs_open_for_token,
)
from payments.services.reinitiation import payment_reinitiate
from payments.services.status import StatusCheckResult, payment_status_check
from payments.services.submission import SubmitOutcome, SubmitResult, payment_submit
from payments.services.transitions import EVENT_TRANSITIONS, TRANSITIONS, payment_transition
from payments.services.writes import (
    EventWrite,
    Move,
    event_write,
    events_share_transaction,
    merchant_days_lock,
    payment_lock,
    payments_lock,
    payments_locked,
)

__all__ = [
    "BANK_NUMBER_MESSAGE",
    "DISHONOR_OPERATION",
    "EVENT_TRANSITIONS",
    "STATUS_OPERATION",
    "SUBMIT_OPERATION",
    "SUBMIT_PAYMENT",
    "SUPPORTED_CURRENCIES",
    "TRANSITIONS",
    "_TOKEN_RE",  # the OpenAPI schema states the token's pattern
    "ApplyOutcome",
    "ApplyResult",
    "CancelResult",
    "DishonorResult",
    "EventWrite",
    "Move",
    "NocNotOpen",
    "NocNoteRequired",
    "StatusCheckResult",
    "SubmitOutcome",
    "SubmitResult",
    "event_write",
    "events_share_transaction",
    "looks_like_bank_number",
    "noc_debit_check",
    "noc_mark_applied",
    "noc_warning",
    "nocs_open_for_token",
    "outbox_enqueue",
    "payment_apply_event",
    "payment_cancel",
    "payment_create",
    "payment_lock",
    "payment_reinitiate",
    "payment_status_check",
    "payment_submit",
    "payment_transition",
    "merchant_days_lock",
    "payments_lock",
    "payments_locked",
    "processed_events_purge",
    "return_dishonor_request",
    "return_dishonor_resend",
    "validate_source_token",
]
