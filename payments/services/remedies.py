"""The remedies of a returned debit exclude each other: at most one of them moves money.

A debit the customer's bank returned can be put right two ways, and each moves money:

- a **reinitiation** (``payments.services.reinitiation``) sends the debit again as a new
  payment: the customer is charged again;
- a **dishonor** (``payments.services.dishonors``) that stands undoes the return: the merchant
  is re-credited for the original debit, which the customer pays after all.

Both at once charge the customer twice for one debt. So each service refuses while the other
has been taken, or may yet take effect:

- a dishonor is refused (requested, or sent again) once the return was reinitiated;
- a reinitiation is refused while a dishonor stood and was not contested, or may still stand:
  requested, sent and not yet answered, or failed with an answer that never came (a timeout or
  a 5xx the processor may have taken) while the dishonor window is open. Only a request the
  processor refused (4xx), a contested dishonor, or an unanswered one past its window leaves the
  return reinitiable.

Both services take the returned entry's row lock first and decide under it, so in either order
and under concurrency one of the two is refused. What no check here can stop, the processor's
own ``return_dishonored`` for a return already reinitiated (an answer to a request that timed
out, or one we never made), is recorded as the money moved and raised as a high alert naming
the reinitiation (``payments.services.dishonors``).
"""

from __future__ import annotations

from datetime import datetime

from payments import catalogue
from payments.models import (
    AttemptOutcome,
    DishonorRequestStatus,
    Payment,
    ProcessorAttempt,
    ReturnDishonor,
)
from payments.return_codes import dishonor_deadline

# The reinitiation rules a dishonor can break (``ReinitiationRefused.rule``).
RETURN_DISHONORED = catalogue.RETURN_DISHONORED.name
DISHONOR_PENDING = "dishonor_pending"


def return_reinitiation(entry: Payment) -> Payment | None:
    """The entry that sent ``entry``'s returned debit again, if any: the next one of its chain."""
    original_id = entry.reinitiation_of_id or entry.id
    return (
        Payment.objects.filter(
            reinitiation_of_id=original_id,
            reinitiation_number__gt=entry.reinitiation_number or 0,
        )
        .order_by("reinitiation_number")
        .first()
    )


def dishonor_may_stand(dishonor: ReturnDishonor | None, *, now: datetime) -> str | None:
    """The reinitiation rule a return's dishonor breaks (``return_dishonored`` or
    ``dishonor_pending``), or ``None`` when it can no longer re-credit the merchant."""
    if dishonor is None or dishonor.contested_at is not None:
        return None
    if dishonor.dishonored_at is not None:
        return RETURN_DISHONORED
    if dishonor.request_status in (DishonorRequestStatus.REQUESTED, DishonorRequestStatus.SENT):
        return DISHONOR_PENDING
    if dishonor.request_status != DishonorRequestStatus.FAILED:
        return None
    last = (
        ProcessorAttempt.objects.filter(
            payment_id=dishonor.payment_id, idempotency_key=dishonor.idempotency_key
        )
        .order_by("-attempt_number")
        .first()
    )
    if last is not None and last.outcome == AttemptOutcome.REJECTED:
        return None
    if now > dishonor_deadline(dishonor.ach_return.returned_at):
        return None
    return DISHONOR_PENDING
