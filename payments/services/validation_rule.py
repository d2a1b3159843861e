"""NACHA's account validation rule at the points that need it without the validation's
lifecycle (``payments.services.validation``): the create's check and hold, and a change of the
account number that makes the account new (a NOC)."""

from __future__ import annotations

import logging
from typing import Any

from django.db.models import QuerySet

from payments import conf as payments_conf
from payments.exceptions import AccountNotValidated
from payments.models import AccountValidation, Payment, ReviewStatus, ValidationState

logger = logging.getLogger(__name__)

HOLD = "hold"
HOLD_REASON = "account_not_validated"
# A debit held for validation that is also past an exposure limit: its review comes next.
THEN_REVIEW = "; then review: "
# The NOCs that change the account's number: the corrected account is another account.
ACCOUNT_NUMBER_CHANGE_CODES = frozenset({"C01", "C03", "C06", "C07"})


def validation_required(sec_code: str) -> bool:
    """Whether a debit of ``sec_code`` needs its account validated first."""
    required = {"WEB": True, "PPD": False, "CCD": False}
    required.update(payments_conf.ACCOUNT_VALIDATION_REQUIRED or {})
    return bool(required.get(sec_code, False))


def validation_debit_check(
    *, source_token: str, sec_code: str, validations: list[AccountValidation] | None = None
) -> str | None:
    """Before a new debit (not a reinitiation): None when it may go; ``HOLD_REASON`` when it is
    to be created held; ``AccountNotValidated`` when it is refused. One indexed read, and only
    for a class that needs validation; none when the caller read it (``validations``, from
    ``validation_queryset``)."""
    if not validation_required(sec_code):
        return None
    if validations is None:
        validations = list(validation_queryset(source_token))
    state = validations[0].state if validations else ValidationState.UNVALIDATED
    if state == ValidationState.VALIDATED:
        return None
    if payments_conf.UNVALIDATED_WEB_DEBITS == HOLD and state != ValidationState.FAILED:
        return HOLD_REASON
    raise AccountNotValidated(sec_code=sec_code, state=state)


def validation_queryset(source_token: str) -> QuerySet[AccountValidation]:
    """The read of the account's validation state that ``validation_debit_check`` makes."""
    return AccountValidation.objects.filter(account_token=source_token).only("state")[:1]


def validation_hold(payment: Payment, *, then_review: Any = None) -> dict:
    """Mark the new, unsaved ``payment`` held until its account is validated (and then, when
    ``then_review`` is a review hold, ``payments.services.fraud.Hold``, held for a person's
    review: flagged or past a limit); the audit row's payload fields that say so."""
    payment.review_status = ReviewStatus.VALIDATION
    reason = f"{HOLD_REASON}: held until account validation completes"
    if then_review is not None:
        reason += f"{THEN_REVIEW}{then_review.reason}"
        payment.review_rule = then_review.rule
        payment.review_evidence = then_review.evidence
    payment.review_reason = reason[:255]
    return {"review_status": payment.review_status, "review_reason": payment.review_reason}


def account_number_changed(
    *, account_token: str, change_code: str, source: str, noc_id: int | None = None
) -> bool:
    """A NOC ``change_code`` on the account: one that changes its number (C01/C03/C06/C07)
    makes it a new account, so its validation goes back to ``unvalidated`` (the NOC kept in the
    evidence, by its ``noc_id`` when it is a ``NotificationOfChange``); any other is only
    recorded in the evidence. Call in the NOC's transaction. True when the row was reset."""
    validation = (
        AccountValidation.objects.select_for_update().filter(account_token=account_token).first()
    )
    if validation is None:
        return False
    evidence = dict(validation.evidence)
    entry: dict = {"change_code": change_code, "source": source}
    if noc_id is not None:
        entry["noc_id"] = noc_id
    evidence.setdefault("nocs", []).append(entry)
    validation.evidence = evidence
    if change_code not in ACCOUNT_NUMBER_CHANGE_CODES:
        validation.save(update_fields=["evidence", "updated_at"])
        return False
    validation.reset()
    validation.secret_digest = ""
    validation.failure_reason = f"account number changed ({change_code}): validate it again"
    validation.save()
    logger.warning(
        "account validation %s reset: %s",
        validation.id,
        change_code,
        extra={"merchant_id": validation.merchant_id},
    )
    return True


def validation_hold_confirm(*, source_token: str, merchant_id: str, sec_code: str) -> bool:
    """In the create's transaction, before its held debit is written: lock the account's
    validation row (written ``unvalidated`` when there is none), so a validation ending at the
    same moment either finds this debit held (it waits for the create's commit) or is found by
    it (the create waits, then reads the end). True: hold it; False: validated meanwhile, send
    it; ``AccountNotValidated`` when it failed meanwhile."""
    AccountValidation.objects.bulk_create(
        [AccountValidation(account_token=source_token, merchant_id=merchant_id)],
        ignore_conflicts=True,
    )
    state = (
        AccountValidation.objects.select_for_update()
        .filter(account_token=source_token)
        .values_list("state", flat=True)
        .get()
    )
    if state == ValidationState.VALIDATED:
        return False
    if state == ValidationState.FAILED:
        raise AccountNotValidated(sec_code=sec_code, state=state)
    return True
