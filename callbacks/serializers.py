"""The processor event contract, as the callback endpoint and the worker import it.

Defined in ``payments.processor.contract`` (the processor backends parse with it, and payments
imports nothing of callbacks); these are the same objects.
"""

from payments.processor.contract import (
    AMOUNT_RE,
    CURRENCY_RE,
    DIRECTION_RE,
    MESSAGE_MAX,
    PROCESSOR_EVENT_ID_RE,
    PROCESSOR_ID_RE,
    REASON_CODE_MAX,
    TIMESTAMP_RE,
    AmountField,
    EventTypeField,
    PatternField,
    ProcessorEventSerializer,
    StringField,
    TimestampField,
    UUIDStringField,
)

__all__ = [
    "AMOUNT_RE",
    "CURRENCY_RE",
    "DIRECTION_RE",
    "MESSAGE_MAX",
    "PROCESSOR_EVENT_ID_RE",
    "PROCESSOR_ID_RE",
    "REASON_CODE_MAX",
    "TIMESTAMP_RE",
    "AmountField",
    "EventTypeField",
    "PatternField",
    "ProcessorEventSerializer",
    "StringField",
    "TimestampField",
    "UUIDStringField",
]
