"""One exception hierarchy for the payments app.

``retryable`` tells the caller (the queue worker) whether trying the same message again may
succeed; ``retry_after`` is a lower bound, in seconds, for the next try when the cause says so.
"""


class PaymentError(Exception):
    retryable: bool = False
    retry_after: float | None = None


class PaymentNotFound(PaymentError):
    # A callback can name a payment whose row a lagging replica or an unfinished transaction
    # does not show yet: retry it, then let a human look.
    retryable = True


class InvalidTransition(PaymentError):
    """The event has no valid transition from the payment's current state and is not stale.

    Retried, because an earlier event that would make it valid may still be on its way, then
    dead-lettered for a human.
    """

    retryable = True


class EventConflict(PaymentError):
    """A processor_event_id seen before arrived with a different payload: a human must decide."""


class EventMismatch(PaymentError):
    """The event restates a field of the payment (``payments.events.RESTATED_FIELDS``) with
    another value: it may be about another debit, or report money we never asked to move. Never
    applied automatically: dead-lettered at once for a human."""


class AmountMismatch(EventMismatch):
    """The processor reports an amount other than the payment's: never apply it automatically."""


class CurrencyMismatch(EventMismatch):
    """The processor reports a currency other than the payment's: 10.00 EUR is not 10.00 USD."""


class DirectionMismatch(EventMismatch):
    """The processor reports a credit entry; every payment of this module is a debit."""


class ProcessorIdMismatch(EventMismatch):
    """The processor names another debit (its id) than the one it gave us for this payment."""


class ProcessorUnavailable(PaymentError):
    """5xx, 408, 429, timeout or connection error: state unchanged, retry with the same key."""

    retryable = True

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ProcessorCircuitOpen(ProcessorUnavailable):
    """The processor is down as a whole (its circuit breaker is open) or asked every caller to
    pause (429 Retry-After). Says nothing about the message: the caller waits ``retry_after``
    seconds and tries again, without spending one of the message's attempts.

    ``called``: a real call was made (and failed) before the breaker said so; otherwise no
    call was made at all. ``breaker_open``: the breaker is open or probing (an outage of unknown
    length), as opposed to a 429 pause of a known, short length.
    """

    def __init__(
        self, message: str, *, retry_after: float, called: bool = False, breaker_open: bool = True
    ) -> None:
        super().__init__(message, retry_after=retry_after)
        self.called = called
        self.breaker_open = breaker_open


class ProcessorDegraded(ProcessorCircuitOpen):
    """The submission failed while the processor fails other payments too (degraded, its
    breaker closed): the failure is the processor's, so the message spends no attempt on it.
    Unlike an open breaker's outage, the processor takes calls: the caller waits the backoff a
    retry after the payment's ``attempt_number``-th call would (``retry_after`` a floor), then
    tries again."""

    def __init__(self, message: str, *, retry_after: float, attempt_number: int) -> None:
        super().__init__(message, retry_after=retry_after, called=True, breaker_open=False)
        self.attempt_number = attempt_number


class ProcessorRejected(PaymentError):
    """4xx other than 408/429: the request itself is wrong; retrying cannot help."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class InvalidCallback(PaymentError):
    """A verified callback whose body cannot be a processor event: answered 400 naming each bad
    field (``errors``: field -> messages), never queued. Retrying the same body cannot help."""

    def __init__(self, errors: dict[str, list[str]]) -> None:
        self.errors = errors
        summary = "; ".join(f"{k}: {' '.join(v)}" for k, v in errors.items())
        super().__init__(f"invalid processor callback: {summary}")


class SecCodeNotAllowed(PaymentError):
    """A payment of a standard entry class the merchant's originator profile does not allow
    (``payments.originator``): nothing is written."""

    code = "sec_code_not_allowed"

    def __init__(self, *, merchant_id: str, sec_code: str, allowed: list[str]) -> None:
        self.sec_code = sec_code
        self.allowed = list(allowed)
        super().__init__(
            f"merchant {merchant_id} may not originate {sec_code} entries; its originator "
            f"profile allows {', '.join(allowed) or 'none'}"
        )


class AccountNotValidated(PaymentError):
    """A debit of a class that needs its account validated first (NACHA's WEB debit account
    validation rule, ``PAYMENTS["ACCOUNT_VALIDATION_REQUIRED"]``) from an account that is not:
    nothing is written."""

    code = "account_not_validated"

    def __init__(self, *, sec_code: str, state: str) -> None:
        self.sec_code = sec_code
        self.state = state
        super().__init__(
            f"the account is {state}: a {sec_code} debit needs its account validated first "
            "(POST /api/accounts/<token>/validation/)"
        )


class ValidationRefused(PaymentError):
    """A start or a verification of an account validation that its rules refuse; ``rule``
    names the rule (the API's 409 code, ``payments.services.validation.RULES``), ``param`` the
    field."""

    def __init__(self, rule: str, message: str, *, param: str = "") -> None:
        self.rule = rule
        self.param = param
        super().__init__(message)


class AmountsInvalid(PaymentError):
    """Micro-entry amounts that are not one or two amounts of 0.01 to 0.99 written as the
    statement shows them (400 ``invalid_amounts``); the message never repeats the value."""


class NocPastDeadline(PaymentError):
    """A new debit on a token whose notification of change is open past its deadline: the
    account detail it corrects must be applied at the processor first. Names the NOC and its
    code, never its corrected data."""

    def __init__(self, *, noc_id: int, change_code: str, deadline) -> None:
        self.noc_id = noc_id
        self.change_code = change_code
        self.deadline = deadline
        super().__init__(
            f"the source_token has notification of change {noc_id} ({change_code}) open past "
            f"its deadline {deadline.date().isoformat()}: apply it at the processor and mark it "
            "applied before a new debit"
        )


class ReinitiationRefused(PaymentError):
    """A reinitiation NACHA's rules do not allow; ``rule`` names which one, ``param`` what the
    refusal names (a limit's name; None: the payment)."""

    def __init__(self, rule: str, message: str, *, param: str | None = None) -> None:
        self.rule = rule
        self.param = param
        super().__init__(message)


class DishonorRefused(PaymentError):
    """An operator's request to dishonor a return that the rules do not allow (no return after
    settlement, outside the 5-banking-day window, a code outside R61-R69, an R68 for a timely
    return, no note, a request already made): nothing is written and nothing is sent; the
    message says which rule."""


class CancelRefused(PaymentError):
    """A cancel the payment no longer allows; ``rule`` names why (``payments.services.cancel``):
    ``already_submitted`` (the debit has reached, or may have reached, the processor or a bank
    file) or ``payment_not_cancelable`` (it failed: nothing is left to cancel)."""

    def __init__(self, rule: str, message: str) -> None:
        self.rule = rule
        super().__init__(message)


class MoneyOutRefused(PaymentError):
    """A refund or payout the rules do not allow; ``rule`` names which one (the API's 409
    ``code``). Nothing is written."""

    def __init__(self, rule: str, message: str) -> None:
        self.rule = rule
        super().__init__(message)


class ExposureLimitExceeded(PaymentError):
    """A create that would take a merchant past one of its exposure limits
    (``payments.services.limits``): nothing is written. ``limit`` names it
    (``debit_daily_limit``); ``over`` is by how much."""

    rule = "exposure_limit_exceeded"

    def __init__(self, *, limit: str, cap, used, amount, currency: str, merchant_id: str) -> None:
        self.limit = limit
        self.cap = cap
        self.used = used
        self.amount = amount
        self.over = used + amount - cap
        super().__init__(
            f"{amount:.2f} {currency} would take merchant {merchant_id} {self.over:.2f} "
            f"{currency} over its {limit.replace('_', ' ')} of {cap:.2f} {currency} "
            f"({used:.2f} {currency} counted already)"
        )


class AccountBlocked(PaymentError):
    """A debit from an account a return blocked (``payments.models.AccountBlock``): an R17
    return the bank marked ``QUESTIONABLE`` (for every merchant) or an unauthorized return (for
    the merchant) until a person clears it. Nothing is written."""

    rule = "account_blocked"

    def __init__(self, *, block_id: int, return_code: str, message: str) -> None:
        self.block_id = block_id
        self.return_code = return_code
        super().__init__(message)
