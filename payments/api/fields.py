"""The fields every request of the API is read with: strict input (unknown fields, JSON numbers
for amounts, bank numbers anywhere and ill-formed metadata are refused by name), the merchant id
and account token rules, and the schema of what inference cannot see in them."""

import re
from collections.abc import Mapping
from decimal import Decimal

from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from rest_framework import serializers

from payments.services import BANK_NUMBER_MESSAGE, looks_like_bank_number, validate_source_token

MERCHANT_RE = re.compile(r"[A-Za-z0-9_.:\-]{1,64}", re.ASCII)
MERCHANT_MESSAGE = "1-64 characters of A-Z, a-z, 0-9, _ . : or -"
# The callback contract's grammar: ASCII digits, one dot, two decimals, at most 12 integer
# digits (NUMERIC(14, 2)). No sign, exponent, underscore, space or non-ASCII digit.
AMOUNT_RE = re.compile(r"(0|[1-9][0-9]{0,11})\.[0-9]{2}", re.ASCII)
AMOUNT_MESSAGE = 'must be a decimal string with two decimals, such as "12.34"'


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


class MetadataFieldSchema(OpenApiSerializerFieldExtension):
    """Stripe's bounds on ``metadata`` (``MetadataField``), so a client built from the schema
    sends what is taken."""

    target_class = MetadataField

    def map_serializer_field(self, auto_schema, direction):
        return {
            "type": "object",
            "maxProperties": METADATA_MAX_KEYS,
            "additionalProperties": {
                "type": "string",
                "maxLength": METADATA_MAX_VALUE_CHARS,
                "pattern": r"^[^\u0000]*$",
            },
            # OpenAPI 3.0 cannot bound the keys (no propertyNames): the description does.
            "description": (
                f"Your own keys and strings: at most {METADATA_MAX_KEYS} keys of "
                f"1-{METADATA_MAX_KEY_CHARS} characters (no control character, no "
                "bank number), each value a string of "
                f"at most {METADATA_MAX_VALUE_CHARS}. Refused by name "
                "(metadata[<key>]) otherwise."
            ),
        }
