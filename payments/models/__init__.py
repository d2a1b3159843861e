"""Payments, their append-only history, the merchant ledger and the idempotency records,
one module per aggregate; every model is importable from ``payments.models`` as before.

State changes go through ``payments.services`` only: the FSM field is protected, transitions
change the state in memory, and the service saves them under a row lock.
"""

from payments.models.access import (  # noqa: F401
    ApiIdempotencyKey,
    MerchantAccess,
)
from payments.models.breaker import (  # noqa: F401
    BreakerState,
    BreakerTransitionKind,
    CircuitBreaker,
    CircuitBreakerTransition,
)
from payments.models.events import (  # noqa: F401
    AttemptOutcome,
    EventKind,
    EventOutcome,
    OutboxMessage,
    PaymentEvent,
    ProcessedEvent,
    ProcessorAttempt,
)
from payments.models.ledger import (  # noqa: F401
    AVAILABLE_ALWAYS,
    HOUSE_ACCOUNT,
    LEDGER_KIND_SIGNS,
    LedgerEntry,
    LedgerEntryKind,
    LedgerEntryStatus,
    MerchantAvailableAdjustment,
    MerchantAvailableTotal,
)
from payments.models.noc import (  # noqa: F401
    NocAction,
    NocStatus,
    NotificationOfChange,
)
from payments.models.originator import (  # noqa: F401
    OriginatorProfile,
    OriginatorProfileChange,
)
from payments.models.payment import (  # noqa: F401
    FINAL_STATES,
    PAYMENT_GRAPH,
    SHOWN_PURPOSES,
    STATE_RANK,
    Payment,
    PaymentDirection,
    PaymentPurpose,
    PaymentState,
    ReviewStatus,
)
from payments.models.returns import (  # noqa: F401
    DishonorRequestStatus,
    DoubleLoss,
    DoubleLossStatus,
    MerchantReturnDay,
    PaymentReturn,
    ReturnDishonor,
)
from payments.models.risk import (  # noqa: F401
    AccountBlock,
    AccountBlockScope,
    ExposureLimit,
    ExposureLimitChange,
    HeldPayment,
    MerchantDayAdjustment,
    MerchantDayTotal,
)
from payments.models.validation import (  # noqa: F401
    AccountValidation,
    ValidationMethod,
    ValidationState,
)

# Events and webhooks live in their own package; imported here so the app registers them.
from payments.webhooks.models import (  # noqa: E402, F401
    DeliveryStatus,
    Event,
    WebhookAction,
    WebhookActionKind,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
)
