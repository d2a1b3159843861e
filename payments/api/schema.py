"""What every operation's schema shares, and what drf-spectacular cannot infer anywhere: the
headers (``Payments-Version``, ``Request-Id``, ``Retry-After``, ``Idempotency-Key``), the error
answers any operation may give (the one envelope, ``payments.api.errors``), a list's page and
its filters, a retrieve by id. Each resource's module states its own operations with these,
beside its view (``extend_schema``); the request and answer bodies come from its serializers."""

from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    inline_serializer,
)
from rest_framework import serializers

from payments.api.errors import REQUEST_ID_HEADER, ErrorOutputSerializer
from payments.api.fields import MERCHANT_RE
from payments.api_versions import VERSION_HEADER, VERSIONS
from payments.models import SHOWN_PURPOSES, PaymentDirection, PaymentState
from payments.object_shapes import object_field

# A positive amount in the contract's grammar (``AmountField``: two decimals, at least 0.01).
AMOUNT_PATTERN = r"^(?:0\.(?:0[1-9]|[1-9][0-9])|[1-9][0-9]{0,11}\.[0-9]{2})$"
MERCHANT_PATTERN = f"^{MERCHANT_RE.pattern}$"


def error_answer(description: str) -> OpenApiResponse:
    return OpenApiResponse(ErrorOutputSerializer, description=description)


def path_id(param: str) -> OpenApiParameter:
    """An object's id in the path (the view answers any other text with its 404)."""
    return OpenApiParameter(param, OpenApiTypes.UUID, OpenApiParameter.PATH)


IDEMPOTENCY_KEY = OpenApiParameter(
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
# Every operation may answer these (payments.api.base, payments.api.errors).
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
# The list query (``payments.api.base.PaymentListQuerySerializer``): its descriptions and
# bounds, which a client builds its requests from.
LIST_PARAMETERS = [
    OpenApiParameter(
        "merchant",
        {"type": "string", "pattern": MERCHANT_PATTERN},
        description="Only this merchant's payments (403 if you may not act for it). Without it, "
        "every merchant you may act for.",
    ),
    OpenApiParameter("state", {"type": "string", "enum": list(PaymentState.values)}),
    OpenApiParameter("direction", {"type": "string", "enum": list(PaymentDirection.values)}),
    OpenApiParameter("purpose", {"type": "string", "enum": list(SHOWN_PURPOSES)}),
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
LIST_REFUSED = error_answer("A refused filter, named in param.")
LIST_FORBIDDEN = error_answer("You may not act for the merchant filtered on.")
KEY_REUSED = error_answer("This Idempotency-Key was used with another body.")
BODY_REFUSED = error_answer("What was refused, by field.")


def list_of(name: str, serializer) -> serializers.Serializer:
    """A page of a list: the cursor links and the results."""
    return inline_serializer(
        name,
        {
            "object": object_field("list"),
            "next": serializers.URLField(allow_null=True),
            "previous": serializers.URLField(allow_null=True),
            "has_more": serializers.BooleanField(),
            "results": serializer(many=True),
        },
    )


def retrieve_schema(operation_id: str, param: str, serializer, description: str):
    """A GET of one object by its id in the path, 404 alike for unknown and not yours."""
    return extend_schema(
        operation_id=operation_id,
        parameters=[path_id(param), *REQUEST_HEADERS],
        responses={
            200: OpenApiResponse(serializer, description=description),
            400: error_answer("Payments-Version is not a version of this API."),
            404: error_answer(
                f"No such {param.removesuffix('_id')}, or one of a merchant you may not act for."
            ),
            **COMMON_ANSWERS,
        },
    )


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
