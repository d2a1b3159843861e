"""The payments API's operations as the OpenAPI schema (drf-spectacular) describes them.

The views are plain ``APIView``s, so their request and answer serializers are named here; the
schema follows whatever those serializers declare. Every error answer is the one envelope
(``payments.api_errors.ErrorOutputSerializer``) and every answer carries ``Request-Id``.
Imported by ``PaymentsConfig.ready``.
"""

from drf_spectacular.extensions import OpenApiSerializerExtension, OpenApiSerializerFieldExtension
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    PolymorphicProxySerializer,
    extend_schema,
    extend_schema_view,
    inline_serializer,
)
from rest_framework import serializers as drf_serializers

from payments import apis, limits_apis, money_out_apis, serializers, services, validation_apis
from payments.api_errors import REQUEST_ID_HEADER, ErrorOutputSerializer, ErrorType, ErrorTypeField
from payments.api_versions import VERSION_HEADER, VERSIONS
from payments.models import PaymentDirection, PaymentPurpose, PaymentState
from payments.services import cancel, payouts, refunds, reinitiation
from payments.webhooks import openapi as webhooks_openapi

# A positive amount in the contract's grammar (``AmountField``: two decimals, at least 0.01).
AMOUNT_PATTERN = r"^(?:0\.(?:0[1-9]|[1-9][0-9])|[1-9][0-9]{0,11}\.[0-9]{2})$"
MERCHANT_PATTERN = f"^{serializers.MERCHANT_RE.pattern}$"


class PaymentCreateInputExtension(OpenApiSerializerExtension):
    """The create body's rules the serializer checks in its ``validate_*`` methods, which the
    schema generator cannot see: without them the schema calls any 1-64 character merchant id
    and any token valid, and a client (or a fuzzer) built from it mostly gets 400s. The
    patterns are the validation's own regular expressions, anchored, so they cannot drift.

    Not expressible here: the bank-number rule (8 or more digits in a row, or in groups), which
    refuses some values these patterns match."""

    target_class = serializers.PaymentCreateInputSerializer

    def map_serializer(self, auto_schema, direction):
        schema = auto_schema._map_serializer(self.target, direction, bypass_extensions=True)
        properties = schema["properties"]
        properties["merchant_id"]["pattern"] = MERCHANT_PATTERN
        properties["merchant_id"]["description"] = serializers.MERCHANT_MESSAGE
        properties["source_token"].update(
            pattern=services._TOKEN_RE.pattern,
            minLength=8,
            description="The processor's token for the bank account, never a bank number.",
        )
        properties["amount"]["pattern"] = AMOUNT_PATTERN
        properties["amount"]["description"] = serializers.AMOUNT_MESSAGE
        # Unknown fields are refused with 400 naming them (StrictInputSerializer).
        schema["additionalProperties"] = False
        return schema


class PaymentReinitiateInputExtension(OpenApiSerializerExtension):
    """The reinitiate body: the reference's pattern, and no other field."""

    target_class = serializers.PaymentReinitiateInputSerializer

    def map_serializer(self, auto_schema, direction):
        schema = auto_schema._map_serializer(self.target, direction, bypass_extensions=True)
        schema["properties"]["authorization_reference"].update(
            pattern=f"^{serializers.AUTHORIZATION_REFERENCE_RE.pattern}$",
            description=(
                "Your reference of the new authorization the customer gave: required to "
                "reinitiate after an R05, R07, R08, R10, R29 or R51 return. "
                + serializers.AUTHORIZATION_REFERENCE_MESSAGE
            ),
        )
        schema["additionalProperties"] = False
        return schema


class MetadataFieldSchema(OpenApiSerializerFieldExtension):
    """Stripe's bounds on ``metadata`` (``serializers.MetadataField``), so a client built from
    the schema sends what is taken."""

    target_class = serializers.MetadataField

    def map_serializer_field(self, auto_schema, direction):
        return {
            "type": "object",
            "maxProperties": serializers.METADATA_MAX_KEYS,
            "additionalProperties": {
                "type": "string",
                "maxLength": serializers.METADATA_MAX_VALUE_CHARS,
                "pattern": r"^[^\u0000]*$",
            },
            # OpenAPI 3.0 cannot bound the keys (no propertyNames): the description does.
            "description": (
                f"Your own keys and strings: at most {serializers.METADATA_MAX_KEYS} keys of "
                f"1-{serializers.METADATA_MAX_KEY_CHARS} characters (no control character, no "
                "bank number), each value a string of "
                f"at most {serializers.METADATA_MAX_VALUE_CHARS}. Refused by name "
                "(metadata[<key>]) otherwise."
            ),
        }


class CorrectedDataFieldSchema(OpenApiSerializerFieldExtension):
    """A NOC's ``corrected_data`` (``payments.change_codes``): a flat object of the table's
    fields, each a string of its stated form; which of them a code takes, the description says."""

    target_class = "payments.processor.contract.CorrectedDataField"

    def map_serializer_field(self, auto_schema, direction):
        from payments.change_codes import CHANGE_CODES, CORRECTED_DATA_MAX_KEYS, CORRECTED_FIELDS

        by_code = "; ".join(
            f"{row.code}: {', '.join(row.fields)}" for row in CHANGE_CODES.values() if row.fields
        )
        return {
            "type": "object",
            "maxProperties": CORRECTED_DATA_MAX_KEYS,
            "additionalProperties": False,
            "properties": {
                name: {"type": "string", "pattern": f"^(?:{pattern.pattern})$", "description": form}
                for name, (pattern, form) in CORRECTED_FIELDS.items()
            },
            "description": (
                "notification_of_change only: the corrected fields the change code names, never "
                f"a whole bank number. {by_code}. C61-C69 (refused NOCs) carry none; an unknown "
                "code any of these."
            ),
        }


class ErrorTypeFieldSchema(OpenApiSerializerFieldExtension):
    """The envelope's ``type`` as a pattern: drf-spectacular would move an enum into a
    component named after the field, ``TypeEnum``, which says nothing to a client."""

    target_class = ErrorTypeField

    def map_serializer_field(self, auto_schema, direction):
        types = [t.value for t in ErrorType]
        return {
            "type": "string",
            "pattern": f"^(?:{'|'.join(types)})$",
            "description": "Who must act: " + ", ".join(types) + ".",
        }


def error_answer(description: str) -> OpenApiResponse:
    return OpenApiResponse(ErrorOutputSerializer, description=description)


_IDEMPOTENCY_KEY = OpenApiParameter(
    "Idempotency-Key",
    # The view's rule (1-255 characters), so a client built from the schema sends a key it takes.
    {"type": "string", "minLength": 1, "maxLength": 255},
    OpenApiParameter.HEADER,
    required=False,
    description=(
        "Same key and same body: the stored first answer. Same key, other body: 422. Same key "
        "while the first request still runs: 409. A refusal before the create executes (400, "
        "403) stores nothing: a corrected or later-authorised retry with the key executes."
    ),
)
_REQUEST_ID = OpenApiParameter(
    REQUEST_ID_HEADER,
    OpenApiTypes.STR,
    OpenApiParameter.HEADER,
    response=True,
    description="This request's id (req_...), also the error's request_id: quote it to support.",
)
_RETRY_AFTER = OpenApiParameter(
    "Retry-After",
    OpenApiTypes.INT,
    OpenApiParameter.HEADER,
    response=[409, 429, 503],
    description="Seconds to wait before retrying.",
)
_VERSION = OpenApiParameter(
    VERSION_HEADER,
    {"type": "string", "enum": list(VERSIONS)},
    OpenApiParameter.HEADER,
    required=False,
    description=(
        "The version whose shapes the client reads; without it, the host's pin "
        "(PAYMENTS API_VERSION). Any other value answers 400 api_version_invalid."
    ),
)
_VERSION_SERVED = OpenApiParameter(
    VERSION_HEADER,
    {"type": "string", "enum": list(VERSIONS)},
    OpenApiParameter.HEADER,
    response=True,
    description="The version this answer was served in.",
)
REQUEST_HEADERS = [_VERSION, _REQUEST_ID, _VERSION_SERVED, _RETRY_AFTER]
# Every operation may answer these (payments.apis, payments.api_errors).
COMMON_ANSWERS = {
    401: error_answer("No credentials, or credentials this API does not accept."),
    405: error_answer("The method is not one this path answers."),
    406: error_answer("The Accept header names no JSON."),
    411: error_answer("A chunked body on a server that cannot say where it ends, param body."),
    413: error_answer(
        "The body is larger than the limit (PAYMENTS_API_MAX_BODY_BYTES), param body."
    ),
    429: error_answer(
        "Past PAYMENTS_API_THROTTLE_RATES (off by default); retry after Retry-After."
    ),
    503: error_answer("The database cannot be reached; retry after Retry-After seconds."),
}
_LIST_PARAMETERS = [
    OpenApiParameter(
        "merchant",
        {"type": "string", "pattern": MERCHANT_PATTERN},
        description="Only this merchant's payments (403 if you may not act for it). Without it, "
        "every merchant you may act for.",
    ),
    OpenApiParameter("state", {"type": "string", "enum": list(PaymentState.values)}),
    OpenApiParameter("direction", {"type": "string", "enum": list(PaymentDirection.values)}),
    OpenApiParameter("purpose", {"type": "string", "enum": list(PaymentPurpose.values)}),
    OpenApiParameter(
        "created_gte", OpenApiTypes.DATETIME, description="Created at or after (ISO-8601)."
    ),
    OpenApiParameter("created_lt", OpenApiTypes.DATETIME, description="Created before (ISO-8601)."),
    OpenApiParameter(
        "limit",
        {"type": "integer", "minimum": 1, "maximum": 100},
        description="Payments per page, 25 by default.",
    ),
    OpenApiParameter(
        "cursor", OpenApiTypes.STR, description="From the previous page's next or previous URL."
    ),
]


def _list_of(name: str, serializer) -> drf_serializers.Serializer:
    """A page of a list: the cursor links and the results."""
    return inline_serializer(
        name,
        {
            "object": serializers.object_field("list"),
            "next": drf_serializers.URLField(allow_null=True),
            "previous": drf_serializers.URLField(allow_null=True),
            "has_more": drf_serializers.BooleanField(),
            "results": serializer(many=True),
        },
    )


_PAYMENT_LIST = _list_of("PaymentList", serializers.PaymentOutputSerializer)


def _retrieve(operation_id: str, param: str, serializer, description: str):
    """A GET of one object by its id in the path, 404 alike for unknown and not yours."""
    return extend_schema(
        operation_id=operation_id,
        parameters=[
            OpenApiParameter(param, OpenApiTypes.UUID, OpenApiParameter.PATH),
            *REQUEST_HEADERS,
        ],
        responses={
            200: OpenApiResponse(serializer, description=description),
            400: error_answer("Payments-Version is not a version of this API."),
            404: error_answer(
                f"No such {param.removesuffix('_id')}, or one of a merchant you may not act for."
            ),
            **COMMON_ANSWERS,
        },
    )


def describe() -> None:
    extend_schema_view(
        get=extend_schema(
            operation_id="payment_list",
            parameters=[*_LIST_PARAMETERS, *REQUEST_HEADERS],
            responses={
                200: OpenApiResponse(
                    _PAYMENT_LIST, description="Newest first, one page after the cursor."
                ),
                400: error_answer("A refused filter, named in param."),
                403: error_answer("You may not act for the merchant filtered on."),
                **COMMON_ANSWERS,
            },
        ),
        post=extend_schema(
            operation_id="payment_create",
            request=serializers.PaymentCreateInputSerializer,
            parameters=[_IDEMPOTENCY_KEY, *REQUEST_HEADERS],
            responses={
                201: OpenApiResponse(
                    serializers.PaymentCreatedOutputSerializer,
                    description="The payment; warnings when the token has an open notification "
                    "of change within its deadline.",
                ),
                400: error_answer("What was refused, by field."),
                403: error_answer("You may not act for merchant_id."),
                409: error_answer(
                    "A request with this Idempotency-Key is still being processed; or the "
                    "source_token has a notification of change open past its deadline (code "
                    "notification_of_change_past_deadline, naming the NOC and its change code); "
                    "or the debit would pass one of the merchant's exposure limits (code "
                    "exposure_limit_exceeded, param naming the limit, the message by how much); "
                    "or the merchant's originator profile does not allow the SEC code (code "
                    "sec_code_not_allowed, param sec_code); or a return blocked the account "
                    "(code account_blocked, param source_token)."
                ),
                422: error_answer("This Idempotency-Key was used with another body."),
                **COMMON_ANSWERS,
            },
        ),
    )(apis.PaymentListCreateApi)
    extend_schema_view(
        get=_retrieve(
            "payment_retrieve",
            "payment_id",
            serializers.PaymentDetailOutputSerializer,
            "The payment with its events, attempts and errors.",
        )
    )(apis.PaymentDetailApi)
    extend_schema_view(
        post=extend_schema(
            operation_id="payment_cancel",
            request=serializers.PaymentCancelInputSerializer,
            parameters=[
                OpenApiParameter("payment_id", OpenApiTypes.UUID, OpenApiParameter.PATH),
                *REQUEST_HEADERS,
            ],
            responses={
                200: OpenApiResponse(
                    serializers.PaymentDetailOutputSerializer,
                    description="The payment, canceled, as GET shows it; the same answer again "
                    "for a payment canceled before.",
                ),
                400: error_answer("The body is not empty: what was refused, by field."),
                404: error_answer("No such payment, or one of a merchant you may not act for."),
                409: error_answer(
                    "The payment can no longer be canceled; code names the rule: "
                    + ", ".join(cancel.RULES)
                    + " (its debit reached, or may have reached, the processor or a bank file; "
                    "or it failed)."
                ),
                **COMMON_ANSWERS,
            },
        )
    )(apis.PaymentCancelApi)
    extend_schema_view(
        post=extend_schema(
            operation_id="payment_reinitiate",
            request=serializers.PaymentReinitiateInputSerializer,
            parameters=[
                OpenApiParameter("payment_id", OpenApiTypes.UUID, OpenApiParameter.PATH),
                _IDEMPOTENCY_KEY,
                *REQUEST_HEADERS,
            ],
            responses={
                201: OpenApiResponse(
                    serializers.PaymentReinitiatedOutputSerializer,
                    description="The new payment (same merchant, amount and token), linked to "
                    "the original entry, with the chain.",
                ),
                400: error_answer("What was refused, by field."),
                404: error_answer("No such payment, or one of a merchant you may not act for."),
                409: error_answer(
                    "NACHA's rules refuse it; code names the rule: "
                    + ", ".join(reinitiation.RULES)
                    + ". Or a request with this Idempotency-Key is still being processed."
                ),
                422: error_answer("This Idempotency-Key was used with another body."),
                **COMMON_ANSWERS,
            },
        )
    )(apis.PaymentReinitiateApi)
    extend_schema_view(
        get=extend_schema(
            operation_id="payment_refund_list",
            parameters=[
                OpenApiParameter("payment_id", OpenApiTypes.UUID, OpenApiParameter.PATH),
                *_LIST_PARAMETERS,
                *REQUEST_HEADERS,
            ],
            responses={
                200: OpenApiResponse(
                    _list_of("RefundList", serializers.RefundOutputSerializer),
                    description="The debit's refunds, newest first, one page after the cursor.",
                ),
                400: error_answer("A refused filter, named in param."),
                403: error_answer("You may not act for the merchant filtered on."),
                404: error_answer("No such debit, or one of a merchant you may not act for."),
                **COMMON_ANSWERS,
            },
        ),
        post=extend_schema(
            operation_id="payment_refund_create",
            request=serializers.RefundCreateInputSerializer,
            parameters=[
                OpenApiParameter("payment_id", OpenApiTypes.UUID, OpenApiParameter.PATH),
                _IDEMPOTENCY_KEY,
                *REQUEST_HEADERS,
            ],
            responses={
                201: OpenApiResponse(
                    serializers.RefundOutputSerializer,
                    description="The refund: an ACH credit to the account the debit came from, "
                    "pending, with its own idempotency key.",
                ),
                400: error_answer("What was refused, by field."),
                404: error_answer("No such payment, or one of a merchant you may not act for."),
                409: error_answer(
                    "The refund rules refuse it; code names the rule: "
                    + ", ".join(refunds.RULES)
                    + "; or exposure_limit_exceeded (param naming the credit limit). Or a "
                    "request with this Idempotency-Key is still being processed."
                ),
                422: error_answer("This Idempotency-Key was used with another body."),
                **COMMON_ANSWERS,
            },
        ),
    )(money_out_apis.RefundListCreateApi)
    extend_schema_view(
        get=_retrieve(
            "refund_retrieve",
            "refund_id",
            serializers.RefundOutputSerializer,
            "The refund, in the shape its create answered with and its debit lists.",
        )
    )(money_out_apis.RefundDetailApi)
    extend_schema_view(
        get=extend_schema(
            operation_id="payout_list",
            parameters=[*_LIST_PARAMETERS, *REQUEST_HEADERS],
            responses={
                200: OpenApiResponse(
                    _list_of("PayoutList", serializers.PayoutOutputSerializer),
                    description="Payouts, newest first, one page after the cursor.",
                ),
                400: error_answer("A refused filter, named in param."),
                403: error_answer("You may not act for the merchant filtered on."),
                **COMMON_ANSWERS,
            },
        ),
        post=extend_schema(
            operation_id="payout_create",
            request=serializers.PayoutCreateInputSerializer,
            parameters=[_IDEMPOTENCY_KEY, *REQUEST_HEADERS],
            responses={
                201: OpenApiResponse(
                    serializers.PayoutOutputSerializer,
                    description="The payout: an ACH credit of the merchant's available balance "
                    "to its own account, pending, with its own idempotency key.",
                ),
                400: error_answer("What was refused, by field."),
                403: error_answer("You may not act for merchant_id."),
                409: error_answer(
                    "The payout rules refuse it; code names the rule: "
                    + ", ".join(payouts.RULES)
                    + "; or exposure_limit_exceeded (param naming the credit limit). Or a "
                    "request with this Idempotency-Key is still being processed."
                ),
                422: error_answer("This Idempotency-Key was used with another body."),
                **COMMON_ANSWERS,
            },
        ),
    )(money_out_apis.PayoutListCreateApi)
    extend_schema_view(
        get=_retrieve(
            "payout_retrieve",
            "payout_id",
            serializers.PayoutOutputSerializer,
            "The payout, its destination as token and last four digits.",
        )
    )(money_out_apis.PayoutDetailApi)
    extend_schema_view(
        get=extend_schema(
            operation_id="merchant_balance",
            parameters=REQUEST_HEADERS,
            responses={
                200: OpenApiResponse(
                    PolymorphicProxySerializer(
                        component_name="MerchantBalanceOfVersion",
                        serializers=[
                            serializers.BalanceObjectOutputSerializer,
                            serializers.MerchantBalanceOutputSerializer,
                        ],
                        resource_type_field_name=None,
                    ),
                    description="From 2026-12-01, a balance object: per currency pending, "
                    "posted, available, reserved and owed. In 2026-11-01, per currency: credits, "
                    "reversals, net and counts.",
                ),
                400: error_answer("The merchant id is not of the accepted form."),
                404: error_answer("A merchant you may not act for."),
                **COMMON_ANSWERS,
            },
        )
    )(apis.MerchantBalanceApi)
    extend_schema_view(
        get=extend_schema(
            operation_id="merchant_limits",
            parameters=REQUEST_HEADERS,
            responses={
                200: OpenApiResponse(
                    limits_apis.MerchantLimitsOutputSerializer,
                    description="Per direction and currency: the exposure limits, what counts "
                    "today and what is left.",
                ),
                400: error_answer("The merchant id is not of the accepted form."),
                404: error_answer("A merchant you may not act for."),
                **COMMON_ANSWERS,
            },
        )
    )(limits_apis.MerchantLimitsApi)
    _describe_account_validation()
    webhooks_openapi.describe(
        error_answer=error_answer,
        common_answers=COMMON_ANSWERS,
        request_headers=REQUEST_HEADERS,
        merchant_pattern=MERCHANT_PATTERN,
        list_of=_list_of,
    )


def _describe_account_validation() -> None:
    token = OpenApiParameter(
        validation_apis.TOKEN_PARAM,
        {"type": "string", "pattern": services._TOKEN_RE.pattern},
        OpenApiParameter.PATH,
        description="The account's token (the vault's on the bank backend, else the "
        "processor's or the host's reference).",
    )
    shape = validation_apis.AccountValidationOutputSerializer
    not_yours = error_answer("No validation of this token for a merchant you may act for.")
    extend_schema_view(
        get=extend_schema(
            operation_id="account_validation_retrieve",
            parameters=[token, *REQUEST_HEADERS],
            responses={
                200: OpenApiResponse(shape, description="The account's validation."),
                400: error_answer("A bank number in the path, or a refused Payments-Version."),
                404: not_yours,
                **COMMON_ANSWERS,
            },
        ),
        post=extend_schema(
            operation_id="account_validation_start",
            request=validation_apis.AccountValidationStartInputSerializer,
            parameters=[token, *REQUEST_HEADERS],
            responses={
                201: OpenApiResponse(shape, description="Started: pending (or decided)."),
                400: error_answer("What was refused, by field."),
                403: error_answer("You may not act for merchant_id."),
                404: error_answer("The token is not an account of merchant_id."),
                409: error_answer(
                    "account_already_validated, account_validation_in_progress, or "
                    "validation_method_unavailable (param method)."
                ),
                **COMMON_ANSWERS,
            },
        ),
    )(validation_apis.AccountValidationApi)
    extend_schema_view(
        post=extend_schema(
            operation_id="account_verify",
            request=validation_apis.AccountVerifyInputSerializer,
            parameters=[token, *REQUEST_HEADERS],
            responses={
                200: OpenApiResponse(shape, description="Validated."),
                400: error_answer("invalid_amounts: not one or two amounts 0.01-0.99."),
                404: not_yours,
                409: error_answer(
                    "micro_entries_mismatch (a try spent; the last fails the validation), "
                    "micro_entries_expired, or validation_not_verifiable."
                ),
                **COMMON_ANSWERS,
            },
        )
    )(validation_apis.AccountVerifyApi)
