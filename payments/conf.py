"""The payments app's settings, each with its default kept here.

A host sets them in one dict, ``PAYMENTS = {"PROCESSOR_BASE_URL": ..., ...}``
(``payments.kernel.app_settings``); the code reads them as ``conf.NAME`` (at call time, so a changed
setting is seen): the host's value when it sets one, else the default below. A host sets only
``REQUIRED``.
"""

import re
from datetime import timedelta
from typing import Any

from payments.api_access_classes import (
    AUTHENTICATION_ACCEPTED,
    PERMISSION_ACCEPTED,
    authentication_classes,
    permission_classes,
)
from payments.api_versions import FIRST, VERSIONS, VERSIONS_ACCEPTED
from payments.exposure_limits import ACCEPTED as LIMITS_ACCEPTED
from payments.exposure_limits import parse_exposure_limits
from payments.fraud_rules import ACCEPTED as FRAUD_RULES_ACCEPTED
from payments.fraud_rules import parse_fraud_rules
from payments.kernel.app_settings import AppSettings
from payments.kernel.setting_specs import (
    Duration,
    Flag,
    Keys,
    Number,
    Parsed,
    Seconds,
    Spec,
    Text,
    Url,
    defaults,
    json_text,
)
from payments.throttle_rates import RATE_ACCEPTED, parse_throttle_rates

# Standard Webhooks' schedule after the first try: 5 s, 5 min, 30 min, 2 h, 5 h, then 10 h.
DEFAULT_WEBHOOK_RETRY_SCHEDULE = [
    5,
    300,
    1800,
    7200,
    18000,
    36000,
    36000,
    36000,
    36000,
    36000,
    36000,
    36000,
]
RETRY_SCHEDULE_ACCEPTED = "a list of 1-50 delays in seconds, each 0-604800"


def parse_retry_schedule(value: Any) -> list[float]:
    """The retry delays as floats; ValueError naming the problem."""
    if not isinstance(value, list | tuple) or not 1 <= len(value) <= 50:
        raise ValueError(RETRY_SCHEDULE_ACCEPTED)
    delays = []
    for delay in value:
        if (
            isinstance(delay, bool)
            or not isinstance(delay, int | float)
            or not 0 <= delay <= 604800
        ):
            raise ValueError(f"{delay!r}: {RETRY_SCHEDULE_ACCEPTED}")
        delays.append(float(delay))
    return delays


REQUIRED = ("PROCESSOR_BASE_URL", "PROCESSOR_API_KEY")

# Each setting with its default and what it accepts: ``manage.py check`` refuses any other value
# (payments.checks), so a nonsense one stops start-up instead of breaking every call later.
SPECS: dict[str, Spec] = {
    # Read timeout of one processor call; requests refuses 0 ("Invalid timeout"), and a call
    # longer than five minutes would outlive the message's visibility timeout.
    "PROCESSOR_TIMEOUT_SECONDS": Seconds(10.0, 300),
    "PROCESSOR_CONNECT_TIMEOUT_SECONDS": Seconds(3.05, 60),
    # Dedup records of processed events outlive SQS's 5-minute window by far; below a day, a
    # processor's resend of an old event could be applied twice.
    "PROCESSED_EVENT_RETENTION": Duration(timedelta(days=30), minimum=timedelta(days=1)),
    # The Idempotency-Key contract keeps keys at least 24 hours.
    "API_IDEMPOTENCY_RETENTION": Duration(timedelta(hours=24), minimum=timedelta(hours=24)),
    # How long a claimed Idempotency-Key whose request has not answered is held before another
    # request with the key may take it over. A request that is still running holds the key's
    # row locked and is never taken over, whatever its age (payments.idempotency): the lease
    # only says how long a client waits after a request died mid-way (a killed worker process).
    # Set it above the host's request timeout, so a request is dead before its key is free.
    "API_IDEMPOTENCY_LEASE": Duration(
        timedelta(seconds=60), minimum=timedelta(seconds=1), maximum=timedelta(hours=1)
    ),
    # The largest request body the payments API reads: a create is a few hundred bytes; a
    # larger body is answered 413 after reading at most one byte past it. Above 10 MiB a body is
    # a denial of service, not a payment.
    "PAYMENTS_API_MAX_BODY_BYTES": Number(
        64 * 1024, 1024, 10 * 1024 * 1024, whole=True, unit="of bytes"
    ),
    # Rate limits of the payments API per user, by scope (payments.api_throttling): None, the
    # default, limits nothing; {"read": "600/min", "write": "60/min"} answers 429 past them.
    "PAYMENTS_API_THROTTLE_RATES": Parsed(
        None, parse=parse_throttle_rates, accepted=RATE_ACCEPTED, types=(dict, type(None))
    ),
    # Who may call the payments API (and the bank app's books and vault), as DRF classes by
    # dotted path: a host on OAuth or JWT names its own authentication class; the permission
    # classes run before the merchant access policy, which still decides per merchant.
    "API_AUTHENTICATION_CLASSES": Parsed(
        [
            "payments.api.authentication.TokenAuthentication",
            "rest_framework.authentication.SessionAuthentication",
        ],
        parse=authentication_classes,
        accepted=AUTHENTICATION_ACCEPTED,
        types=(list, tuple),
    ),
    # The API version a request that names none is served in (payments.api_versions), and a
    # webhook endpoint made without one renders its events in. The default is the first, so a
    # host upgrading keeps the shapes its clients parse; a new install pins the latest.
    "API_VERSION": Text(
        FIRST, pattern="|".join(map(re.escape, VERSIONS)), accepted=VERSIONS_ACCEPTED
    ),
    "API_PERMISSION_CLASSES": Parsed(
        ["rest_framework.permissions.IsAuthenticated"],
        parse=permission_classes,
        accepted=PERMISSION_ACCEPTED,
        types=(list, tuple),
    ),
    # Published outbox rows: the queue message and the event log carry what they said; a week
    # is for looking into a publish that went wrong.
    "OUTBOX_RETENTION": Duration(timedelta(days=7)),
    # Breaker transitions: an incident's history, read when it is reviewed.
    "BREAKER_TRANSITION_RETENTION": Duration(timedelta(days=90)),
    # Money out (payments.services.refunds): a settled debit's credit becomes available to pay
    # out this many banking days after it settled (the return reserve; 0: at once).
    "AVAILABLE_AFTER_BANKING_DAYS": Number(2, 0, 60, whole=True, unit="of banking days"),
    # A refund waits this many banking days after its debit settled before it is sent (its
    # return window; 0: at once, and a return after it is caught as a double loss instead).
    "REFUND_HOLD_BANKING_DAYS": Number(0, 0, 60, whole=True, unit="of banking days"),
    # Exposure limits (payments.exposure_limits, enforced by payments.services.limits): the
    # default caps of every merchant without its own (ExposureLimit, edited in the admin), by
    # currency and direction; None, the default, caps nothing.
    "EXPOSURE_LIMITS": Parsed(
        None,
        parse=parse_exposure_limits,
        accepted=LIMITS_ACCEPTED,
        types=(dict, type(None)),
        text_type=json_text,
    ),
    # What a create past an exposure limit does: "refuse" answers 409 exposure_limit_exceeded;
    # "hold" creates it held for a person's review (payments.services.review), never submitted
    # before its approval.
    "OVER_LIMIT": Text("refuse", pattern=r"refuse|hold", accepted="'refuse' or 'hold'"),
    # Fraud monitoring (payments.fraud_rules, run at create by payments.services.fraud): the
    # built-in rules (new_destination, velocity, first_large_debit) are on with their default
    # options unless named here; a host's own rule by "path". A flagged payment is created held
    # for a person's review (payments.services.review).
    "FRAUD_RULES": Parsed(
        None,
        parse=parse_fraud_rules,
        accepted=FRAUD_RULES_ACCEPTED,
        types=(dict, type(None)),
        text_type=json_text,
    ),
    # A payment held for review longer than this alerts (payments.tasks.review_holds_check).
    "REVIEW_HOLD_ALERT_HOURS": Number(24, 1, 24 * 30, unit="of hours"),
    # Rows per DELETE (each its own transaction) of every retention purge (payments.retention).
    "RETENTION_PURGE_BATCH_SIZE": Number(1000, 1, 100_000, whole=True, unit="of rows"),
    # Dotted path of a callable ``(user, merchant_id) -> bool``: may this API user act for this
    # merchant? The default reads the MerchantAccess grants edited in the admin. (That it
    # imports and is callable is checked apart, payments.E002.)
    "PAYMENTS_MERCHANT_ACCESS_POLICY": Text(
        "payments.access.merchant_access_granted",
        pattern=r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)+",
        accepted="a dotted path such as 'package.module.callable'",
    ),
    # Dotted path of the processor backend class (payments.processor.backend.ProcessorBackend):
    # the default is the HTTP API of the design card, which the sandbox serves. (That it imports
    # and is a backend is checked apart, payments.E005.)
    "PROCESSOR_BACKEND": Text(
        "payments.processor.backends.http.ProcessorClient",
        pattern=r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)+",
        accepted="a dotted path such as 'package.module.Class'",
    ),
    # The standard entry class of a payment whose create names none, where the backend knows
    # none of its own (the bank backend takes the vault account's class): payments.originator.
    "DEFAULT_SEC_CODE": Text(
        "PPD", pattern="PPD|CCD|WEB", accepted="one of PPD, CCD or WEB (upper case)"
    ),
    # NACHA's account validation rule (payments.services.validation): which standard entry
    # classes need the debited account validated before their first debit. The rule's own
    # table is the default (WEB only); a host may give some classes and keep the others'.
    "ACCOUNT_VALIDATION_REQUIRED": Keys(
        values={"WEB": Flag(True), "PPD": Flag(False), "CCD": Flag(False)}, partial=True
    ),
    # What a debit from an account not validated does where validation is required: "refuse"
    # answers 409 account_not_validated; "hold" creates it held until the validation ends
    # (validated: submitted once; failed: failed with the reason).
    "UNVALIDATED_WEB_DEBITS": Text("refuse", pattern=r"refuse|hold", accepted="'refuse' or 'hold'"),
    # Micro-entries: wrong tries before the validation fails, and days before it expires.
    "MICRO_ENTRY_MAX_ATTEMPTS": Number(3, 1, 10, whole=True, unit="of tries"),
    "MICRO_ENTRY_EXPIRY_DAYS": Number(10, 1, 60, whole=True, unit="of days"),
    # Whose money the micro-entries' credits are until their offsetting debit settles, and
    # whose loss they stay when that debit comes back: "house", the originator's own ledger
    # account (payments.models.HOUSE_ACCOUNT), or "merchant", the validating merchant's.
    "MICRO_ENTRY_COST": Text("house", pattern=r"house|merchant", accepted="'house' or 'merchant'"),
    # Dotted path of the validation service class (payments.validation_methods.ValidationService)
    # the "service" method calls; "" when the host has none. (That it imports is checked apart,
    # payments.E006.)
    "ACCOUNT_VALIDATION_SERVICE": Text(
        "",
        pattern=r"|[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)+",
        accepted="'' or a dotted path such as 'package.module.Class'",
    ),
    # The processor's circuit breaker (payments.processor.breaker): open after this many
    # failures in a row, or when this share of the last WINDOW_CALLS first submissions (none
    # older than WINDOW_SECONDS) failed; after the pause, TRIAL_CALLS real submissions are let
    # through and it closes once they all succeed; every reopening doubles the pause up to the
    # cap; a reopening within INCIDENT_COOLDOWN_SECONDS of a close is the same incident.
    "PROCESSOR_BREAKER_FAILURES": Number(5, 1, 1000, whole=True, unit="of failures"),
    "PROCESSOR_BREAKER_FAILURE_RATE": Number(0.5, 0, 1, above_minimum=True),
    "PROCESSOR_BREAKER_WINDOW_CALLS": Number(10, 1, 10_000, whole=True, unit="of calls"),
    "PROCESSOR_BREAKER_WINDOW_SECONDS": Seconds(60.0, 86_400),
    "PROCESSOR_BREAKER_PAUSE_SECONDS": Seconds(15.0, 86_400),
    "PROCESSOR_BREAKER_MAX_PAUSE_SECONDS": Seconds(300.0, 86_400),
    "PROCESSOR_BREAKER_TRIAL_CALLS": Number(3, 1, 1000, whole=True, unit="of calls"),
    "PROCESSOR_BREAKER_INCIDENT_COOLDOWN_SECONDS": Seconds(300.0, 86_400),
    # Webhooks (payments.webhooks): events are listed by GET /api/events/ this many days.
    "EVENT_RETENTION_DAYS": Number(30, 1, 3650, whole=True, unit="of days"),
    # Read timeout of one delivery; a receiver that answers later is a failed attempt.
    "WEBHOOK_TIMEOUT_SECONDS": Seconds(10.0, 60),
    # Seconds to wait before each retry of a delivery, after the first try; with jitter of up
    # to a fifth either way. The default spans about three days (Standard Webhooks' own).
    "WEBHOOK_RETRY_SCHEDULE": Parsed(
        DEFAULT_WEBHOOK_RETRY_SCHEDULE,
        parse=parse_retry_schedule,
        accepted=RETRY_SCHEDULE_ACCEPTED,
        types=(list, tuple),
        text_type=json_text,
    ),
    # An endpoint failing this many attempts in a row, over at least this many hours, is
    # disabled (with an alert and a webhook_endpoint.disabled event) until it is enabled again.
    "WEBHOOK_DISABLE_AFTER_FAILURES": Number(100, 1, 100_000, whole=True, unit="of attempts"),
    "WEBHOOK_DISABLE_AFTER_HOURS": Number(24, 0, 24 * 30, unit="of hours"),
    # After a rotation the old secret signs beside the new one this long.
    "WEBHOOK_SECRET_GRACE": Duration(timedelta(hours=24)),
    # For tests and local development only: endpoint URLs with http://, and hosts that resolve
    # to loopback, private or link-local addresses. Production refuses both.
    "WEBHOOK_ALLOW_HTTP": Flag(False),
    "WEBHOOK_ALLOW_PRIVATE_ADDRESSES": Flag(False),
}
# Pairs (low, high) whose low value may not exceed the high one.
RELATIONS = (("PROCESSOR_BREAKER_PAUSE_SECONDS", "PROCESSOR_BREAKER_MAX_PAUSE_SECONDS"),)
# The required settings have no default; when set, their values are checked the same way.
REQUIRED_SPECS: dict[str, Spec] = {
    "PROCESSOR_BASE_URL": Url(None, optional=False),
    "PROCESSOR_API_KEY": Text(
        None, pattern=r"[\x21-\x7e]+", accepted="a non-empty key of printable ASCII, no spaces"
    ),
}

DEFAULTS: dict[str, Any] = defaults(SPECS)

# Dotted paths of 0.1.0 that moved in 0.2.0: read as the new ones for this release, with a
# start-up warning (payments.W002). The bank backend moved with the bank app.
RENAMED = {
    "PROCESSOR_BACKEND": {
        "payments.processor.client.ProcessorClient": (
            "payments.processor.backends.http.ProcessorClient"
        ),
        "payments.nacha.backend.NachaBankBackend": "bank.nacha.backend.NachaBankBackend",
    }
}

payments_settings = AppSettings(
    app="payments",
    setting="PAYMENTS",
    specs=SPECS,
    required=REQUIRED_SPECS,
    relations=RELATIONS,
    renamed=RENAMED,
)


def __getattr__(name: str) -> Any:
    return getattr(payments_settings, name)
