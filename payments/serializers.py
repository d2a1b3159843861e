"""The payments API's request and answer shapes: strict input (unknown fields, JSON numbers for
amounts, bank numbers anywhere and ill-formed metadata are refused by name) and the answers'
fields, which the OpenAPI schema follows (payments.openapi)."""

import re
from collections.abc import Mapping
from datetime import UTC
from decimal import Decimal

from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from payments import originator
from payments.models import (
    PaymentDirection,
    PaymentPurpose,
    PaymentState,
)

# The objects' shapes live apart, so the event write renders them without the API's rules.
from payments.object_shapes import (  # noqa: F401
    DestinationOutputSerializer,
    DoubleLossOutputSerializer,
    PaymentOutputSerializer,
    PayoutOutputSerializer,
    RefundOutputSerializer,
    object_field,
)
from payments.services import BANK_NUMBER_MESSAGE, looks_like_bank_number, validate_source_token

MERCHANT_RE = re.compile(r"[A-Za-z0-9_.:\-]{1,64}", re.ASCII)
MERCHANT_MESSAGE = "1-64 characters of A-Z, a-z, 0-9, _ . : or -"
# The callback contract's grammar: ASCII digits, one dot, two decimals, at most 12 integer
# digits (NUMERIC(14, 2)). No sign, exponent, underscore, space or non-ASCII digit.
AMOUNT_RE = re.compile(r"(0|[1-9][0-9]{0,11})\.[0-9]{2}", re.ASCII)
AMOUNT_MESSAGE = 'must be a decimal string with two decimals, such as "12.34"'

# --- Input ------------------------------------------------------------------------------------


class StrictCharField(serializers.CharField):
    """A JSON string only: DRF's CharField would turn a number into its digits silently."""

    default_error_messages = {
        **serializers.CharField.default_error_messages,
        "not_string": "must be a JSON string",
    }

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("not_string")
        return super().to_internal_value(data)


class AmountField(serializers.DecimalField):
    """A decimal given as a JSON string ("12.34") in the callback contract's grammar.

    JSON numbers are floats and lose cents; ``Decimal()`` alone would take "1e3", "1_000.00",
    "+5.00" and non-ASCII digits.
    """

    default_error_messages = {
        **serializers.DecimalField.default_error_messages,
        "not_string": f"{AMOUNT_MESSAGE}, not a JSON number",
        "grammar": AMOUNT_MESSAGE,
    }

    def __init__(self, **kwargs):
        super().__init__(
            max_digits=14,
            decimal_places=2,
            min_value=Decimal("0.01"),
            coerce_to_string=True,
            **kwargs,
        )

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("not_string")
        if not AMOUNT_RE.fullmatch(data):
            self.fail("grammar")
        return super().to_internal_value(data)


NOT_ASCII_MESSAGE = (
    "must be written in ASCII: the digits 0-9 (and, where the field takes them, '.', '-', ':', "
    "'+', 'T', 'Z'); digits of other scripts are not read"
)


class StrictInputSerializer(serializers.Serializer):
    """Refuses unknown fields by name, and any text that looks like a bank number.

    A bank number found in a field replaces the field's other errors: DRF's messages may quote
    the value (``"..." is not a valid choice``), and a refused value is never echoed, stored in
    the idempotency record, or logged.
    """

    # Fields holding a number (an amount, a date, a count), which the bank-number rule does not
    # apply to; their text must be ASCII: Python and DRF read other scripts' digits ("٢٠٢٦") as
    # numbers, so a value no client of ours writes would be taken silently.
    numeric_fields: tuple[str, ...] = ()

    def to_internal_value(self, data):
        if not isinstance(data, Mapping):
            raise serializers.ValidationError(
                {"non_field_errors": ["the body must be a JSON object"]}
            )
        errors: dict[str, list[str]] = {}
        for name in data:
            if looks_like_bank_number(name):
                errors.setdefault("non_field_errors", []).append(
                    f"a field name {BANK_NUMBER_MESSAGE}"
                )
            elif name not in self.fields:
                errors[name[:64]] = [
                    f"unknown field; accepted fields: {', '.join(sorted(self.fields))}"
                ]
        bank_fields = {
            name
            for name, value in data.items()
            if name in self.fields
            and name not in self.numeric_fields
            and isinstance(value, str)
            and looks_like_bank_number(value)
        }
        not_ascii = {
            name
            for name, value in data.items()
            if name in self.numeric_fields and isinstance(value, str) and not value.isascii()
        }
        try:
            value = super().to_internal_value(data)
        except serializers.ValidationError as exc:
            for name, messages in exc.detail.items():
                if name in bank_fields or name in not_ascii:
                    continue
                # A field of parts (metadata) names each part: metadata[<key>].
                parts = messages if isinstance(messages, Mapping) else {"": messages}
                for part, part_messages in parts.items():
                    errors.setdefault(f"{name}{part}", []).extend(str(m) for m in part_messages)
        for name in bank_fields:
            errors[name] = [BANK_NUMBER_MESSAGE]
        for name in not_ascii:
            errors[name] = [NOT_ASCII_MESSAGE]
        if errors:
            raise serializers.ValidationError(errors)
        return value


# Stripe's bounds on metadata, which a team's clients already respect.
METADATA_MAX_KEYS = 50
METADATA_MAX_KEY_CHARS = 40
METADATA_MAX_VALUE_CHARS = 500
# Control characters (NUL among them) and unpaired surrogates: PostgreSQL's jsonb refuses NUL
# and surrogates, and a control character in a key would be written to logs and the admin.
_UNSAFE_RE = re.compile(r"[\x00-\x1f\x7f\ud800-\udfff]")
_VALUE_UNSAFE_RE = re.compile(r"[\x00\ud800-\udfff]")


class MetadataField(serializers.Field):
    """Stripe's ``metadata``: a JSON object of at most 50 keys of 1-40 characters, each value a
    string of at most 500. A problem is named ``metadata[<key>]`` when the key itself may be
    echoed, else ``metadata``; no bank number is taken in a key or a value."""

    default_error_messages = {"not_object": "must be a JSON object of strings"}

    def to_internal_value(self, data):
        if not isinstance(data, Mapping):
            self.fail("not_object")
        problems: dict[str, list[str]] = {}
        if len(data) > METADATA_MAX_KEYS:
            problems[""] = [f"at most {METADATA_MAX_KEYS} keys, got {len(data)}"]
        for key, value in data.items():
            key_problem = _metadata_key_problem(key)
            if key_problem is not None:
                problems.setdefault("", []).append(key_problem)
            elif (value_problem := _metadata_value_problem(value)) is not None:
                problems[f"[{key}]"] = [value_problem]
        if problems:
            # Named by the serializer as metadata, metadata[<key>], ...
            raise serializers.ValidationError(problems)
        return dict(data)

    def to_representation(self, value):
        return value


def _metadata_key_problem(key: str) -> str | None:
    if not 1 <= len(key) <= METADATA_MAX_KEY_CHARS:
        return f"a key must be 1-{METADATA_MAX_KEY_CHARS} characters"
    if _UNSAFE_RE.search(key):
        return "a key holds a control character or an unpaired surrogate"
    if looks_like_bank_number(key):
        return f"a key {BANK_NUMBER_MESSAGE}"
    return None


def _metadata_value_problem(value) -> str | None:
    if not isinstance(value, str):
        return "must be a JSON string"
    if len(value) > METADATA_MAX_VALUE_CHARS:
        return f"at most {METADATA_MAX_VALUE_CHARS} characters"
    if _VALUE_UNSAFE_RE.search(value):
        return "holds a NUL character or an unpaired surrogate"
    if looks_like_bank_number(value):
        return BANK_NUMBER_MESSAGE
    return None


def merchant_id_checked(value: str) -> str:
    if not MERCHANT_RE.fullmatch(value):
        raise serializers.ValidationError(MERCHANT_MESSAGE)
    return value


def account_token_checked(value: str) -> str:
    """A token for a bank account (a debit's source, a payout's destination), never a number."""
    try:
        validate_source_token(value)
    except DjangoValidationError as exc:
        raise serializers.ValidationError(exc.messages) from None
    return value


# What the schema says of the entry's class and description, so a client (and the schema-driven
# tests) can tell a valid value from the schema alone: the classes the module originates, and a
# batch header's free text (upper-case printable ASCII, no space at either end).
_PRINTABLE = r"\x21-\x60\x7b-\x7e"


@extend_schema_field({"type": "string", "enum": list(originator.SEC_CODES)})
class SecCodeField(StrictCharField):
    pass


@extend_schema_field(
    {
        "type": "string",
        "minLength": 1,
        "maxLength": originator.ENTRY_DESCRIPTION_WIDTH,
        "pattern": f"^[{_PRINTABLE}]([{_PRINTABLE} ]*[{_PRINTABLE}])?$",
    }
)
class EntryDescriptionField(StrictCharField):
    pass


class PaymentCreateInputSerializer(StrictInputSerializer):
    numeric_fields = ("amount",)

    merchant_id = StrictCharField(max_length=64)
    amount = AmountField()
    currency = serializers.ChoiceField(choices=["USD"], default="USD")
    source_token = StrictCharField(max_length=128)
    description = StrictCharField(max_length=255, required=False, allow_blank=True)
    metadata = MetadataField(required=False)
    # The entry's standard entry class and company entry description (payments.originator):
    # refused, never corrected (no upper-casing, no cutting), when they do not fit.
    sec_code = SecCodeField(required=False, trim_whitespace=False)
    entry_description = EntryDescriptionField(required=False, trim_whitespace=False)

    def validate_merchant_id(self, value: str) -> str:
        return merchant_id_checked(value)

    def validate_source_token(self, value: str) -> str:
        return account_token_checked(value)

    def validate_sec_code(self, value: str) -> str:
        if problem := originator.sec_code_problem(value):
            raise serializers.ValidationError(problem)
        return value

    def validate_entry_description(self, value: str) -> str:
        if problem := originator.text_problem(value, originator.ENTRY_DESCRIPTION_WIDTH):
            raise serializers.ValidationError(problem)
        return value


AUTHORIZATION_REFERENCE_RE = re.compile(r"[A-Za-z0-9_.:\-]{1,64}", re.ASCII)
AUTHORIZATION_REFERENCE_MESSAGE = "1-64 characters of A-Z, a-z, 0-9, _ . : or -"


class PaymentCancelInputSerializer(StrictInputSerializer):
    """The body of ``POST /api/payments/<id>/cancel/``: none, or an empty object. Any field is
    refused by name, so a client that meant something by it hears so."""


class PaymentReinitiateInputSerializer(StrictInputSerializer):
    """The body of ``POST /api/payments/<id>/reinitiate/``: empty, or the reference of the new
    authorization a reinitiation after an unauthorized return (R05, R07, R08, R10, R29, R51)
    is made under (the client's own id of the signed or recorded authorization)."""

    authorization_reference = StrictCharField(max_length=64, required=False)

    def validate_authorization_reference(self, value: str) -> str:
        if not AUTHORIZATION_REFERENCE_RE.fullmatch(value):
            raise serializers.ValidationError(AUTHORIZATION_REFERENCE_MESSAGE)
        return value


class RefundCreateInputSerializer(StrictInputSerializer):
    """The body of ``POST /api/payments/<id>/refunds/``: the amount to refund (a part or all of
    what is still refundable), why, and the client's own metadata."""

    numeric_fields = ("amount",)

    amount = AmountField()
    reason = StrictCharField(max_length=255, required=False, allow_blank=True)
    metadata = MetadataField(required=False)

    def validate_reason(self, value: str) -> str:
        if looks_like_bank_number(value):
            raise serializers.ValidationError(BANK_NUMBER_MESSAGE)
        return value


class PayoutCreateInputSerializer(StrictInputSerializer):
    """The body of ``POST /api/payouts/``: whose money, how much, and the account it goes to (a
    processor token, or a vault token held for the merchant on the bank backend)."""

    numeric_fields = ("amount",)

    merchant_id = StrictCharField(max_length=64)
    amount = AmountField()
    currency = serializers.ChoiceField(choices=["USD"], default="USD")
    destination_token = StrictCharField(max_length=128)
    description = StrictCharField(max_length=255, required=False, allow_blank=True)
    metadata = MetadataField(required=False)
    # Wages: the entry is described PAYROLL (NACHA's Standard Company Entry Description).
    payroll = serializers.BooleanField(required=False, default=False)

    def validate_merchant_id(self, value: str) -> str:
        return merchant_id_checked(value)

    def validate_destination_token(self, value: str) -> str:
        return account_token_checked(value)

    def validate_description(self, value: str) -> str:
        if looks_like_bank_number(value):
            raise serializers.ValidationError(BANK_NUMBER_MESSAGE)
        return value


# --- Output -----------------------------------------------------------------------------------


class NocWarningOutputSerializer(serializers.Serializer):
    """An open notification of change on the token, within its deadline: named, never its
    corrected data."""

    code = serializers.CharField()
    noc_id = serializers.IntegerField()
    change_code = serializers.CharField()
    change_title = serializers.CharField()
    deadline = serializers.DateTimeField(allow_null=True)
    message = serializers.CharField()


class PaymentCreatedOutputSerializer(PaymentOutputSerializer):
    """The create answer: the payment, and warnings when the token has an open notification of
    change within its deadline (present only then)."""

    warnings = NocWarningOutputSerializer(many=True, required=False)

    class Meta(PaymentOutputSerializer.Meta):
        fields = [*PaymentOutputSerializer.Meta.fields, "warnings"]


class ReinitiationEntryOutputSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    reinitiation_number = serializers.IntegerField(allow_null=True)
    state = serializers.CharField()
    return_code = serializers.CharField(allow_blank=True)
    created_at = serializers.DateTimeField()


class ReinitiationOutputSerializer(serializers.Serializer):
    """A payment's reinitiation chain: the original entry, then its reinitiations in order."""

    original_id = serializers.UUIDField()
    reinitiation_number = serializers.IntegerField(allow_null=True)
    authorization_reference = serializers.CharField(allow_blank=True)
    chain = ReinitiationEntryOutputSerializer(many=True)


class PaymentReinitiatedOutputSerializer(PaymentOutputSerializer):
    """The reinitiate answer: the new payment and its chain."""

    reinitiation = ReinitiationOutputSerializer()

    class Meta(PaymentOutputSerializer.Meta):
        fields = [*PaymentOutputSerializer.Meta.fields, "reinitiation"]


class PaymentEventOutputSerializer(serializers.Serializer):
    kind = serializers.CharField()
    outcome = serializers.CharField()
    event_type = serializers.CharField()
    processor_event_id = serializers.CharField()
    from_state = serializers.CharField()
    to_state = serializers.CharField()
    caused_by = serializers.CharField()
    created_at = serializers.DateTimeField()


class ProcessorAttemptOutputSerializer(serializers.Serializer):
    attempt_number = serializers.IntegerField()
    operation = serializers.CharField()
    outcome = serializers.CharField()
    http_status = serializers.IntegerField(allow_null=True)
    error_kind = serializers.CharField()
    # A stable code and a short text (payments.selectors.PROCESSOR_PUBLIC_ERRORS); the stored
    # error, which names the processor's host and path, stays in the admin.
    error_code = serializers.CharField()
    error = serializers.CharField()
    latency_ms = serializers.FloatField()
    started_at = serializers.DateTimeField()


class PaymentErrorOutputSerializer(serializers.Serializer):
    source = serializers.ChoiceField(choices=["processor", "worker"])
    code = serializers.CharField()
    message = serializers.CharField()
    attempt = serializers.IntegerField()
    at = serializers.DateTimeField()


class PaymentDetailOutputSerializer(PaymentOutputSerializer):
    """The shape of ``GET /api/payments/<id>/`` (the view assembles it, with other apps'
    sections, from the same field serializers), for the OpenAPI schema."""

    events = PaymentEventOutputSerializer(many=True)
    attempts = ProcessorAttemptOutputSerializer(many=True)
    # Processor errors, plus what other apps add (the queue layer's processing errors): each
    # with a stable ``code`` and a short ``message``, never the stored error text.
    errors = PaymentErrorOutputSerializer(many=True)
    # The queue layer's active hold on the payment, when it has one.
    hold = serializers.DictField(allow_null=True, required=False)
    # The reinitiation chain the payment belongs to (original, first, second), when it has one.
    reinitiation = ReinitiationOutputSerializer(allow_null=True)
    # A debit's refunds, oldest first, and what may still be refunded of it (0.00 for money
    # out); a refund names its debit.
    refunds = RefundOutputSerializer(many=True)
    refundable_amount = serializers.DecimalField(max_digits=14, decimal_places=2)
    refund_of = serializers.UUIDField(allow_null=True, source="refund_of_id")

    class Meta(PaymentOutputSerializer.Meta):
        fields = [
            *PaymentOutputSerializer.Meta.fields,
            "events",
            "attempts",
            "errors",
            "hold",
            "reinitiation",
            "refunds",
            "refundable_amount",
            "refund_of",
        ]


class CurrencyBalanceOutputSerializer(serializers.Serializer):
    """One currency of a merchant's balance, in the words of Stripe and Modern Treasury
    (``payments.selectors.merchant_balances``); each help text is the figure's one definition,
    which the generated API reference shows."""

    currency = serializers.CharField(help_text="ISO 4217 code of the figures below.")
    pending = serializers.CharField(
        help_text="Money in flight, not yet settled: refunds and payouts made and not yet "
        "settled, failed or canceled, as a negative amount (money leaving). A debit enters the "
        "balance when it settles."
    )
    posted = serializers.CharField(
        help_text="Money settled: debits collected, less their returns (and plus the re-credits "
        "of dishonored returns), less refunds and payouts settled, plus money out that came "
        "back and double losses recovered."
    )
    available = serializers.CharField(
        help_text="What may be paid out now: posted money of debits past the return reserve "
        "(PAYMENTS AVAILABLE_AFTER_BANKING_DAYS banking days after settling), less money out "
        "pending or posted, plus money out that came back and double losses recovered. It may "
        "be negative (a return after a payout); shown as it is."
    )
    reserved = serializers.CharField(
        help_text="Posted money of debits still inside the return reserve: available once the "
        "reserve ends, unless the debit is returned. available + reserved = posted + pending."
    )
    owed = serializers.CharField(
        help_text="Double losses not recovered: refunds sent whose debits then came back, which "
        "the merchant is owed and recovers outside ACH; counted in no other figure until "
        "recovered (then in posted and available) or written off (then nowhere)."
    )


class BalanceObjectOutputSerializer(serializers.Serializer):
    """``GET /api/merchants/<id>/balance/`` from version 2026-12-01."""

    object = object_field("balance")
    merchant_id = serializers.CharField()
    balances = CurrencyBalanceOutputSerializer(many=True)


class BalanceOutputSerializer(serializers.Serializer):
    """Version 2026-11-01's balance of one currency: credits from confirmations, reversals from
    returns after settlement, the net of the two, and the payments behind them."""

    currency = serializers.CharField()
    credits = serializers.CharField()
    reversals = serializers.CharField()
    # Dishonored returns: their re-credits, less the ones a contest reversed again.
    recredits = serializers.CharField()
    net = serializers.CharField()
    confirmed_count = serializers.IntegerField()
    returned_count = serializers.IntegerField()
    returned_total = serializers.CharField()
    # Kept from the first version of this answer: ``balance`` equals ``net``.
    balance = serializers.CharField()
    entries = serializers.IntegerField()
    confirmed_total = serializers.CharField()
    # From every entry, money out included (``payments.selectors.merchant_money_figures``):
    # pending (all that has not failed), posted (moved), available (may be paid out now; may
    # be negative, shown as it is), and the refunds and payouts not failed less their returns.
    pending = serializers.CharField()
    posted = serializers.CharField()
    available = serializers.CharField()
    money_out = serializers.CharField()


class MerchantBalanceOutputSerializer(serializers.Serializer):
    """``GET /api/merchants/<id>/balance/`` in version 2026-11-01."""

    merchant_id = serializers.CharField()
    balances = BalanceOutputSerializer(many=True)


class PaymentListQuerySerializer(StrictInputSerializer):
    """The query of ``GET /api/payments/``: each filter once, each refused by name."""

    # Dates and the opaque cursor hold digit groups that are not bank numbers.
    numeric_fields = ("created_gte", "created_lt", "limit", "cursor")

    merchant = StrictCharField(max_length=64, required=False)
    state = serializers.ChoiceField(choices=PaymentState.values, required=False)
    direction = serializers.ChoiceField(choices=PaymentDirection.values, required=False)
    purpose = serializers.ChoiceField(choices=PaymentPurpose.values, required=False)
    # ISO-8601; without an offset, UTC (never the host's TIME_ZONE, which a client cannot see).
    created_gte = serializers.DateTimeField(required=False, default_timezone=UTC)
    created_lt = serializers.DateTimeField(required=False, default_timezone=UTC)
    limit = serializers.IntegerField(required=False, min_value=1, max_value=100)
    cursor = StrictCharField(max_length=512, required=False)

    def validate_merchant(self, value: str) -> str:
        if not MERCHANT_RE.fullmatch(value):
            raise serializers.ValidationError(MERCHANT_MESSAGE)
        return value

    def validate(self, attrs):
        low, high = attrs.get("created_gte"), attrs.get("created_lt")
        if low is not None and high is not None and low >= high:
            raise serializers.ValidationError({"created_lt": ["must be after created_gte"]})
        return attrs
