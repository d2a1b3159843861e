"""The processor event contract (docs/security/callback-edge.md) as one DRF serializer.

The reference backend parses what the processor posted with ``processor_event_parse``; the
worker parses the event nested in the queue envelope with the same serializer
(``callbacks.schema.parse_processor_event``), so a message that passed the endpoint cannot
fail validation in the worker, and the contract has one definition. Another backend maps its
processor's callback onto these fields and parses them here too, for the same guarantee. It
lives in payments, beside the backends, because callbacks depends on payments and not the other
way round; ``callbacks.serializers`` re-exports it.

Every field is a JSON string: DRF's own fields would turn ``12345`` into ``"12345"`` or a
UUID, and ``125.0`` into an amount, which the contract refuses.
"""

import re
from datetime import UTC, datetime
from decimal import Decimal
from functools import cache
from typing import Any

from rest_framework import serializers
from rest_framework.utils.serializer_helpers import BindingDict

from payments.catalogue import event_fields, event_type_get, event_type_names, event_types
from payments.change_codes import (
    CHANGE_CODE_RE,
    CORRECTED_DATA_MAX_KEYS,
    change_code_get,
    corrected_data_problems,
)
from payments.events import DIRECTIONS, ProcessorEvent
from payments.exceptions import InvalidCallback
from payments.kernel.bank_numbers import holds_bank_number, mask_bank_numbers

PROCESSOR_EVENT_ID_RE = re.compile(r"[A-Za-z0-9._:-]{1,128}")
# Two decimal places exactly, no sign, no exponent, no leading zeros; at most 12 integer digits
# (the payment amount column is NUMERIC(14, 2)).
AMOUNT_RE = re.compile(r"(0|[1-9][0-9]{0,11})\.[0-9]{2}")
# ISO 8601 date, "T" or space, time, offset; fromisoformat alone also accepts forms like
# "20261102". Months, days, hours and minutes in their ranges, so the pattern published in the
# OpenAPI schema describes (nearly) only real moments; fromisoformat checks the rest (Feb 30).
TIMESTAMP_RE = re.compile(
    r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])[T ]([01][0-9]|2[0-3]):[0-5][0-9]"
    r"(:[0-5][0-9](\.[0-9]{1,6})?)?(Z|[+-]([01][0-9]|2[0-3]):?[0-5][0-9])"
)
# ISO 4217 alphabetic code: three upper-case letters. Whether it is the payment's currency is
# the worker's question (a difference is a mismatch for a human), not the edge's.
CURRENCY_RE = re.compile(r"[A-Z]{3}")
DIRECTION_RE = re.compile("|".join(DIRECTIONS))
PROCESSOR_ID_RE = re.compile(r"[A-Za-z0-9._:-]{1,128}")
REASON_CODE_MAX = 64
MESSAGE_MAX = 1000


def _quoted(value: str) -> str:
    """A refused value as its refusal quotes it: a bank number in it masked, then cut short."""
    return mask_bank_numbers(value)[:64]


class _StrictString:
    """Refuses anything but a JSON string before the field's own conversion."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("not_a_string", type=type(data).__name__)
        return super().to_internal_value(data)


class StringField(_StrictString, serializers.CharField):
    default_error_messages = {"not_a_string": "Must be a string, got {type}."}

    def __init__(self, **kwargs) -> None:
        # The processor's text is kept as sent: no trimming, an empty string is allowed.
        kwargs.setdefault("trim_whitespace", False)
        kwargs.setdefault("allow_blank", True)
        super().__init__(**kwargs)


class UUIDStringField(_StrictString, serializers.UUIDField):
    default_error_messages = {
        "not_a_string": "Must be a string, got {type}.",
        "invalid": "Must be a UUID, got {value!r}.",
    }

    def to_internal_value(self, data):
        try:
            return super().to_internal_value(data)
        except serializers.ValidationError:
            if isinstance(data, str):
                self.fail("invalid", value=_quoted(data))
            raise


class PatternField(_StrictString, serializers.CharField):
    """A string matching ``pattern`` whole; ``invalid`` names the expected form."""

    default_error_messages = {"not_a_string": "Must be a string, got {type}."}

    def __init__(self, *, pattern: re.Pattern, invalid: str, **kwargs) -> None:
        kwargs.setdefault("trim_whitespace", False)
        super().__init__(**kwargs)
        self.pattern = pattern
        self.error_messages["invalid"] = invalid

    def to_internal_value(self, data):
        value = super().to_internal_value(data)
        if not self.pattern.fullmatch(value):
            self.fail("invalid", value=_quoted(value), length=len(value))
        return value


class EventTypeField(serializers.ChoiceField):
    """One of the catalogue's event types (``payments.catalogue``), read when asked, so a type
    registered after start-up is taken and published like the module's own."""

    default_error_messages = {
        "not_a_string": "Must be a string, got {type}.",
        "invalid_choice": "Must be one of {choices}; got {input!r}.",
    }

    def __init__(self, **kwargs) -> None:
        super().__init__(choices=(), **kwargs)

    def _get_choices(self) -> dict[str, str]:
        return {name: name for name in event_type_names()}

    def _set_choices(self, choices) -> None:
        """The catalogue holds the choices; nothing to keep."""

    choices = property(_get_choices, _set_choices)

    @property
    def grouped_choices(self) -> dict[str, str]:
        return self._get_choices()

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("not_a_string", type=type(data).__name__)
        names = event_type_names()
        if data not in names:
            self.fail("invalid_choice", choices=", ".join(names), input=_quoted(data))
        return data


class AmountField(PatternField):
    default_error_messages = {"not_positive": "Must be greater than zero; got {value!r}."}

    def __init__(self, **kwargs) -> None:
        super().__init__(
            pattern=AMOUNT_RE,
            invalid=(
                'Must be a decimal string with exactly 2 decimal places, such as "125.00"; '
                "got {value!r}."
            ),
            **kwargs,
        )

    def to_internal_value(self, data) -> Decimal:
        amount = Decimal(super().to_internal_value(data))
        if amount <= 0:
            self.fail("not_positive", value=_quoted(data))
        return amount

    def to_representation(self, value) -> str:
        return f"{value:.2f}"


class TimestampField(PatternField):
    """ISO 8601 with a UTC offset, convertible to UTC: ``0001-01-01T00:00:00+01:00`` parses but
    lies before year 1 in UTC, where Python (and so the fingerprint and the database) cannot go.
    """

    default_error_messages = {
        "out_of_range": "Must be a date-time that exists in UTC (years 1 to 9999); got {value!r}."
    }

    def __init__(self, **kwargs) -> None:
        super().__init__(
            pattern=TIMESTAMP_RE,
            invalid=(
                "Must be an ISO 8601 date-time with a UTC offset, such as "
                '"2026-11-02T12:00:00+00:00"; got {value!r}.'
            ),
            **kwargs,
        )

    def to_internal_value(self, data) -> datetime:
        text = super().to_internal_value(data)
        try:
            value = datetime.fromisoformat(text)
        except ValueError:
            self.fail("invalid", value=_quoted(text), length=len(text))
        try:
            value.astimezone(UTC)
        except OverflowError:
            self.fail("out_of_range", value=_quoted(text))
        return value

    def to_representation(self, value) -> str:
        return value.isoformat()


class CorrectedDataField(serializers.Field):
    """A NOC's ``corrected_data``: a flat JSON object of at most as many keys as the change-code
    table names, each key a string of at most 40 characters. Which keys and values are taken
    depends on the change code, so the serializer's ``validate`` checks them."""

    default_error_messages = {
        "not_object": "Must be a JSON object of the corrected fields, got {type}.",
        "too_many": "Must have at most {limit} keys, got {count}.",
        "bad_key": "Keys must be strings of 1-40 characters.",
    }

    def to_internal_value(self, data) -> dict:
        if not isinstance(data, dict):
            self.fail("not_object", type=type(data).__name__)
        if len(data) > CORRECTED_DATA_MAX_KEYS:
            self.fail("too_many", limit=CORRECTED_DATA_MAX_KEYS, count=len(data))
        if any(not isinstance(key, str) or not 1 <= len(key) <= 40 for key in data):
            self.fail("bad_key")
        return dict(data)

    def to_representation(self, value) -> dict:
        return value


class ProcessorEventSerializer(serializers.Serializer):
    """One processor event. Fields beyond the contract are not validated here; the caller
    keeps them (they travel nested in the queue envelope, never beside our markers)."""

    payment_id = UUIDStringField(help_text="The payment this event is about (a UUID).")
    event_type = EventTypeField()
    processor_event_id = PatternField(
        pattern=PROCESSOR_EVENT_ID_RE,
        invalid=(
            "Must be 1 to 128 characters of A-Z, a-z, 0-9 and . _ : - (got {length} characters)."
        ),
        max_length=128,
        help_text="The processor's id of this event: 1-128 characters of A-Za-z0-9._:-",
    )
    amount = AmountField(help_text='Decimal string with 2 places, greater than zero: "125.00".')
    timestamp = TimestampField(help_text="ISO 8601 date-time with a UTC offset.")
    reason_code = StringField(
        max_length=REASON_CODE_MAX,
        required=False,
        allow_null=True,
        default="",
        help_text=(
            "NACHA reason code: R01-R85 for returned; the dishonor's R61-R69 for "
            "return_dishonored, the contest's R71-R77 for dishonor_contested."
        ),
    )
    message = StringField(max_length=MESSAGE_MAX, required=False, allow_null=True, default="")
    # Optional restatements of the payment's own fields (payments.events.RESTATED_FIELDS):
    # checked for form here, compared with the payment in the worker.
    currency = PatternField(
        pattern=CURRENCY_RE,
        invalid=(
            'Must be an ISO 4217 code of three upper-case letters, such as "USD"; got {value!r}.'
        ),
        required=False,
        allow_null=True,
        default="",
        help_text="ISO 4217 code; compared with the payment's currency when present.",
    )
    direction = PatternField(
        pattern=DIRECTION_RE,
        invalid=f"Must be one of {', '.join(DIRECTIONS)}; got {{value!r}}.",
        required=False,
        allow_null=True,
        default="",
        help_text="debit or credit; every payment is a debit, so a credit is a mismatch.",
    )
    processor_id = PatternField(
        pattern=PROCESSOR_ID_RE,
        invalid=(
            "Must be 1 to 128 characters of A-Z, a-z, 0-9 and . _ : - (got {length} characters)."
        ),
        max_length=128,
        required=False,
        allow_null=True,
        default="",
        help_text="The processor's id of the debit; compared with the one it gave us.",
    )

    @property
    def fields(self) -> BindingDict:
        # DRF deep-copies and binds every declared field for each serializer instance: two
        # thirds of the cost of validating a callback, on the endpoint's hot path. These fields
        # keep no per-request state (no context, no partial updates, nothing nested), so one
        # bound set serves every instance (one per state of the catalogue).
        return _shared_fields(event_types())

    def get_fields(self) -> dict:
        """The common fields, then every event type's own (``payments.catalogue``): each
        optional here, its type's rules checked in ``validate``."""
        fields = super().get_fields()
        for _entry, event_field in event_fields():
            fields[event_field.name] = event_field.contract_field_make()
        return fields

    def validate_reason_code(self, value: str | None) -> str:
        return value or ""

    def validate_message(self, value: str | None) -> str:
        return value or ""

    # null is "not stated", as for the other optional fields.
    def validate_currency(self, value: str | None) -> str:
        return value or ""

    def validate_direction(self, value: str | None) -> str:
        return value or ""

    def validate_processor_id(self, value: str | None) -> str:
        return value or ""

    def validate(self, attrs: dict) -> dict:
        """An event type's own fields (``payments.catalogue``): a field is carried only by the
        types that declare it, a required one must be stated, and the type's own check runs on
        them once each is valid. null is "not stated", as for the optional common fields."""
        event_type = attrs.get("event_type")
        errors: dict[str, list[str]] = {}
        for entry, event_field in event_fields():
            name = event_field.name
            if not attrs.get(name):
                attrs.pop(name, None)
            elif entry.name != event_type:
                errors[name] = [f"Only a {entry.name} event carries {name}."]
        if errors:
            raise serializers.ValidationError(errors)
        entry = event_type_get(event_type)
        for event_field in entry.fields:
            if event_field.required and event_field.name not in attrs:
                errors[event_field.name] = [f"Required for a {entry.name} event."]
        if errors:
            raise serializers.ValidationError(errors)
        problems = entry.contract_check_run(attrs)
        if problems:
            raise serializers.ValidationError({k: [v] for k, v in problems.items()})
        return attrs


def change_code_field() -> serializers.Field:
    """A notification of change's ``change_code`` (``payments.change_codes``)."""
    return PatternField(
        pattern=CHANGE_CODE_RE,
        invalid="Must be a change code such as C01 (1-8 of A-Z and 0-9); got {value!r}.",
        max_length=8,
        required=False,
        allow_null=True,
        help_text="notification_of_change: C01-C14, or C61-C69 for a refused NOC.",
    )


def corrected_data_field() -> serializers.Field:
    """A notification of change's ``corrected_data``; described by
    ``payments.api.schema.CorrectedDataFieldSchema``, code by code."""
    return CorrectedDataField(required=False, allow_null=True)


def noc_contract_check(attrs: dict) -> dict[str, str]:
    """A NOC's corrected data, held to its change code's keys and forms. A code outside the
    table is taken (recorded and flagged as unknown, never dropped)."""
    code, data = attrs["change_code"], attrs.get("corrected_data", {})
    problems = {
        f"corrected_data[{key}]" if key else "corrected_data": problem
        for key, problem in corrected_data_problems(code, data).items()
    }
    row = change_code_get(code)
    if not problems and row is not None and not row.refused and not data:
        problems["corrected_data"] = (
            f"{code} must state at least one corrected field: {', '.join(row.fields)}."
        )
    return problems


@cache
def _shared_fields(catalogue: tuple) -> BindingDict:
    prototype = ProcessorEventSerializer()
    fields = BindingDict(prototype)
    for name, field in prototype.get_fields().items():
        fields[name] = field
    return fields


def contract_errors(errors) -> dict[str, list[str]]:
    """A serializer's errors as the plain ``{field: [message, ...]}`` the 400 answer carries."""
    if isinstance(errors, list):  # a body that is not an object
        return {"non_field_errors": [str(e) for e in errors]}
    return {str(field): [str(e) for e in messages] for field, messages in errors.items()}


# The contract's free-text fields: kept masked in the event and in ``raw`` alike.
FREE_TEXT_FIELDS = ("message", "reason_code")
MEMBER_NAME_MESSAGE = (
    "a member's name holds a run of digits that may be a bank account number; a name is "
    "never a number, and bank numbers are never accepted or stored"
)


def kept_members(fields: dict, validated: dict) -> dict:
    """What of a valid callback is kept with its event (``ProcessorEvent.raw``): it travels in
    the queue envelope, is stored as the event log's payload, and is shown in the admin.

    The contract's fields are kept as sent: each has passed its grammar, and the ids among them
    are the processor's keys, kept whole. The free text of ``message`` and ``reason_code`` is
    the exception, kept masked (``payments.kernel.bank_numbers``: ``Account ****3516 closed``).

    The members beyond the contract are kept too, masked the same way. No code reads them; they
    are worth keeping as what the processor said about the event (its own references, a batch
    or trace number) for the person who reconciles it with the processor. Dropping them would
    lose that unseen; keeping them whole would store whatever a processor puts there, a
    corrected account number included. So every string in them, at any depth, has its bank
    numbers masked to their last 4 digits, and a number of 5 or more digits is kept as such a
    masked string. A member name that would be masked is refused instead (``InvalidCallback``,
    400, its place named masked): a name is not data, and two names masked alike would merge.
    """
    problems: dict[str, list[str]] = {}
    kept = {}
    contract = _contract_fields()
    for name, value in fields.items():
        if name in contract:
            kept[name] = validated[name] if name in FREE_TEXT_FIELDS else value
        elif holds_bank_number(name):
            problems.setdefault(_place(name), []).append(MEMBER_NAME_MESSAGE)
        else:
            kept[name] = _masked_member(value, name, problems)
    if problems:
        raise InvalidCallback(problems)
    return kept


def _place(path: str) -> str:
    return mask_bank_numbers(path)[:128]


def event_payload_shown(payload: dict) -> dict:
    """A processor event's stored payload as a person is shown it (the admin): masked as
    ``kept_members`` masks, a member's name masked rather than refused. A payload stored before
    the edge masked, or from a backend that built its own ``raw``, shows no bank number either;
    the row itself is left as it was written."""
    shown = {}
    contract = _contract_fields()
    for name, value in payload.items():
        if name in FREE_TEXT_FIELDS and isinstance(value, str):
            shown[name] = mask_bank_numbers(value)
        elif name in contract:
            shown[name] = value
        else:
            shown[mask_bank_numbers(name)] = _masked_member(value, name, None)
    return shown


def listed_event_shown(item: Any, errors: dict) -> Any:
    """An event a processor listed that breaks the contract, as it is kept for a person (a dead
    letter): masked as ``event_payload_shown`` masks, and a contract field named in ``errors``
    or whose value is not a string masked as a member beyond the contract is, since nothing
    held it to its grammar (an account number in ``amount``, an object in ``corrected_data``).
    What is not an object is masked whole."""
    if not isinstance(item, dict):
        return _masked_member(item, "", None)
    shown = event_payload_shown(item)
    faulty = {re.split(r"[.\[]", str(name), maxsplit=1)[0] for name in errors}
    for name in _contract_fields() & set(item):
        # Kept whole only when it held to its grammar: a string the check found no fault in.
        if name in faulty or not isinstance(item[name], str):
            shown[name] = _masked_member(item[name], name, None)
    return shown


def _masked_member(value: Any, path: str, problems: dict[str, list[str]] | None) -> Any:
    """``value`` (a member beyond the contract) with its bank numbers masked; a name that holds
    one is noted in ``problems`` under its place, or without ``problems`` shown masked."""
    if isinstance(value, str):
        return mask_bank_numbers(value)
    if isinstance(value, int | float) and not isinstance(value, bool):
        text = str(value)
        return mask_bank_numbers(text) if holds_bank_number(text) else value
    if isinstance(value, list):
        return [_masked_member(item, f"{path}[{i}]", problems) for i, item in enumerate(value)]
    if isinstance(value, dict):
        kept = {}
        for key, item in value.items():
            if not holds_bank_number(key):
                kept[key] = _masked_member(item, f"{path}.{key}", problems)
            elif problems is None:
                kept[mask_bank_numbers(key)] = _masked_member(item, f"{path}.{key}", problems)
            else:
                problems.setdefault(_place(f"{path}.{key}"), []).append(MEMBER_NAME_MESSAGE)
        return kept
    return value


def _contract_fields() -> frozenset[str]:
    """The contract's field names: the common ones and every event type's own."""
    return frozenset(_shared_fields(event_types()))


def processor_event_parse(fields: Any, *, raw: dict | None = None) -> ProcessorEvent:
    """The event the contract's ``fields`` describe; raise ``InvalidCallback`` naming every bad
    field. The free text of ``message`` and ``reason_code`` is kept with its bank numbers masked.
    ``raw`` (default: ``fields``) is kept with the event and travels beside its fields in the
    queue envelope, as ``kept_members`` keeps it: the members beyond the contract included,
    bank numbers masked; it must not use a contract field's name for anything else.

    This is the edge's parse: the worker reads the queue envelope back with the serializer
    alone (``callbacks.schema``), and keeps what the edge or the module's own producers (the
    bank files' import, reconciliation) wrote, such as a bank trace number in a message."""
    serializer = ProcessorEventSerializer(data=fields)
    if not serializer.is_valid():
        raise InvalidCallback(contract_errors(serializer.errors))
    validated = dict(serializer.validated_data)
    for name in FREE_TEXT_FIELDS:
        validated[name] = mask_bank_numbers(validated[name])
    raw = kept_members(fields if raw is None else raw, validated)
    return ProcessorEvent.of(**validated, raw=raw)


# A processor cursor is opaque to us, but it is stored and sent back in a query string.
CURSOR_RE = re.compile(r"[A-Za-z0-9._:=~+/-]{1,512}")


class InvalidEventsPage(ValueError):
    """A page of the events API that breaks its contract as a whole (not one bad event)."""


def events_page_parse(body: Any, *, limit: int) -> tuple[tuple[Any, ...], str | None, bool]:
    """``(data, next_cursor, has_more)`` of a ``GET /v1/events`` answer,
    ``{"data": [...], "next_cursor": ..., "has_more": ...}``; raise ``InvalidEventsPage`` for a
    body that is no such page, or that holds more than the ``limit`` events asked for (a
    processor ignoring the limit is not trusted with the rest of the contract either). The
    events themselves are not checked here: each is checked on its own, as a callback body."""
    if not isinstance(body, dict):
        raise InvalidEventsPage(f"the page must be a JSON object, got {type(body).__name__}")
    data, next_cursor, has_more = body.get("data"), body.get("next_cursor"), body.get("has_more")
    if not isinstance(data, list):
        raise InvalidEventsPage(f"data must be a list, got {type(data).__name__}")
    if len(data) > limit:
        raise InvalidEventsPage(f"{len(data)} events on a page asked for at most {limit}")
    if next_cursor is not None and not (
        isinstance(next_cursor, str) and CURSOR_RE.fullmatch(next_cursor)
    ):
        raise InvalidEventsPage("next_cursor must be null or 1-512 characters of A-Za-z0-9._:=~+/-")
    if not isinstance(has_more, bool):
        raise InvalidEventsPage(f"has_more must be true or false, got {has_more!r}"[:200])
    return tuple(data), next_cursor, has_more
