"""The payments API's operations as the OpenAPI schema (drf-spectacular) describes them.

The views are plain ``APIView``s, so their request and answer serializers are named here; the
schema follows whatever those serializers declare. Imported by ``PaymentsConfig.ready``.
"""

from drf_spectacular.extensions import OpenApiSerializerExtension
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_view,
)

from payments import apis, services

# A positive amount in the contract's grammar (``AmountField``: two decimals, at least 0.01).
AMOUNT_PATTERN = r"^(?:0\.(?:0[1-9]|[1-9][0-9])|[1-9][0-9]{0,11}\.[0-9]{2})$"


class PaymentCreateInputExtension(OpenApiSerializerExtension):
    """The create body's rules the serializer checks in its ``validate_*`` methods, which the
    schema generator cannot see: without them the schema calls any 1-64 character merchant id
    and any token valid, and a client (or a fuzzer) built from it mostly gets 400s. The
    patterns are the validation's own regular expressions, anchored, so they cannot drift.

    Not expressible here: the bank-number rule (8 or more digits in a row, or in groups), which
    refuses some values these patterns match."""

    target_class = apis.PaymentCreateInputSerializer

    def map_serializer(self, auto_schema, direction):
        schema = auto_schema._map_serializer(self.target, direction, bypass_extensions=True)
        properties = schema["properties"]
        properties["merchant_id"]["pattern"] = f"^{apis._MERCHANT_RE.pattern}$"
        properties["merchant_id"]["description"] = apis.MERCHANT_MESSAGE
        properties["source_token"].update(
            pattern=services._TOKEN_RE.pattern,
            minLength=8,
            description="The processor's token for the bank account, never a bank number.",
        )
        properties["amount"]["pattern"] = AMOUNT_PATTERN
        properties["amount"]["description"] = apis.AMOUNT_MESSAGE
        # Unknown fields are refused with 400 naming them (StrictInputSerializer).
        schema["additionalProperties"] = False
        return schema


# Error answers carry {"errors": {field: [...]}} (or DRF's {"detail": ...} for authentication).
_ERROR = OpenApiResponse(OpenApiTypes.OBJECT, description="What was refused, by field.")
_ERRORS_BY_FIELD = OpenApiResponse(
    apis.ErrorsOutputSerializer, description="What was refused, by field."
)
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
# Every operation answers 503 while the database cannot be reached (payments.apis).
_UNAVAILABLE = OpenApiResponse(
    apis.ErrorsOutputSerializer,
    description="The database cannot be reached; retry after Retry-After seconds.",
)
_RETRY_AFTER = OpenApiParameter(
    "Retry-After",
    OpenApiTypes.INT,
    OpenApiParameter.HEADER,
    response=[503],
    description="Seconds to wait before retrying.",
)


# Every operation reads at most PAYMENTS_API_MAX_BODY_BYTES (64 KiB by default) of a body.
_TOO_LARGE = OpenApiResponse(
    apis.ErrorsOutputSerializer,
    description="The body is larger than the limit, named in errors.body.",
)


def describe() -> None:
    extend_schema_view(
        post=extend_schema(
            operation_id="payment_create",
            request=apis.PaymentCreateInputSerializer,
            parameters=[_IDEMPOTENCY_KEY, _RETRY_AFTER],
            responses={
                201: apis.PaymentOutputSerializer,
                400: _ERRORS_BY_FIELD,
                401: _ERROR,
                403: _ERRORS_BY_FIELD,
                409: _ERROR,
                422: _ERROR,
                413: _TOO_LARGE,
                503: _UNAVAILABLE,
            },
        )
    )(apis.PaymentListCreateApi)
    extend_schema_view(
        get=extend_schema(
            operation_id="payment_retrieve",
            parameters=[_RETRY_AFTER],
            responses={
                200: OpenApiResponse(
                    apis.PaymentDetailOutputSerializer,
                    description="The payment with its events, attempts and errors.",
                ),
                401: _ERROR,
                404: _ERROR,
                413: _TOO_LARGE,
                503: _UNAVAILABLE,
            },
        )
    )(apis.PaymentDetailApi)
    extend_schema_view(
        get=extend_schema(
            operation_id="merchant_balance",
            parameters=[_RETRY_AFTER],
            responses={
                200: OpenApiResponse(
                    apis.MerchantBalanceOutputSerializer,
                    description="Per currency: credits, reversals, net.",
                ),
                400: _ERROR,
                401: _ERROR,
                404: _ERROR,
                413: _TOO_LARGE,
                503: _UNAVAILABLE,
            },
        )
    )(apis.MerchantBalanceApi)
