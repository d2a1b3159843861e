"""Refunds: ``/api/payments/<id>/refunds/`` (``POST`` refunds part or all of a confirmed debit,
``GET`` lists the debit's refunds) and ``/api/refunds/<id>/``, their view, serializer and schema.
A refund is an ACH credit to the account the debit came from (``payments.services.refunds``),
read in one shape wherever it appears (``payments.object_shapes.RefundOutputSerializer``)."""

from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import serializers, status

from payments import idempotency
from payments.api.base import (
    CreateApi,
    ReadApi,
    body_checked,
    carried,
    created_shaped,
    exposure_conflict,
    not_found,
    payment_in_path,
    payment_of_user,
    query_checked,
    refusal,
)
from payments.api.errors import ApiError, field_errors
from payments.api.fields import AmountField, MetadataField, StrictCharField, StrictInputSerializer
from payments.api.schema import (
    BODY_REFUSED,
    COMMON_ANSWERS,
    IDEMPOTENCY_KEY,
    KEY_REUSED,
    LIST_FORBIDDEN,
    LIST_PARAMETERS,
    LIST_REFUSED,
    REQUEST_HEADERS,
    error_answer,
    list_of,
    path_id,
    retrieve_schema,
)
from payments.exceptions import ExposureLimitExceeded, MoneyOutRefused, PaymentNotFound
from payments.models import Payment, PaymentPurpose
from payments.object_shapes import RefundOutputSerializer
from payments.services import BANK_NUMBER_MESSAGE, looks_like_bank_number
from payments.services import refunds as refund_rules
from payments.services.refunds import REFUND_EXCEEDS_REFUNDABLE, refund_create


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


@extend_schema_view(
    post=extend_schema(
        operation_id="payment_refund_create",
        request=RefundCreateInputSerializer,
        parameters=[path_id("payment_id"), IDEMPOTENCY_KEY, *REQUEST_HEADERS],
        responses={
            201: OpenApiResponse(
                RefundOutputSerializer,
                description="The refund: an ACH credit to the account the debit came from, "
                "pending, with its own idempotency key.",
            ),
            400: BODY_REFUSED,
            404: error_answer("No such payment, or one of a merchant you may not act for."),
            409: error_answer(
                "The refund rules refuse it; code names the rule: "
                + ", ".join(refund_rules.RULES)
                + "; or exposure_limit_exceeded (param naming the credit limit). Or a "
                "request with this Idempotency-Key is still being processed."
            ),
            422: KEY_REUSED,
            **COMMON_ANSWERS,
        },
    )
)
class RefundListCreateApi(CreateApi, ReadApi):
    """``/api/payments/<id>/refunds/``: ``POST`` refunds the debit; ``GET`` lists
    the debit's refunds, newest first, filtered by ``state``, ``created_gte`` and
    ``created_lt``."""

    # The Idempotency-Key works as on create, its request being this payment and body.
    key_scope = "refund"
    purpose = PaymentPurpose.REFUND
    output_serializer = RefundOutputSerializer

    @extend_schema(
        operation_id="payment_refund_list",
        parameters=[path_id("payment_id"), *LIST_PARAMETERS, *REQUEST_HEADERS],
        responses={
            200: OpenApiResponse(
                list_of("RefundList", RefundOutputSerializer),
                description="The debit's refunds, newest first, one page after the cursor.",
            ),
            400: LIST_REFUSED,
            403: LIST_FORBIDDEN,
            404: error_answer("No such debit, or one of a merchant you may not act for."),
            **COMMON_ANSWERS,
        },
    )
    def get(self, request, payment_id):
        query = query_checked(request)
        debit = payment_of_user(request.user, payment_id)
        if debit is None or debit.purpose != PaymentPurpose.COLLECTION:
            return not_found("payment_id")
        refunds = Payment.objects.filter(refund_of=debit).select_related("double_loss")
        return self.list_page(request, refunds, query)

    def parent_of(self, request, payment_id):
        return payment_in_path(request, payment_id)

    def create_answer(self, request, data, parent: Payment) -> idempotency.Answer:
        values, errors = body_checked(RefundCreateInputSerializer, data)
        if errors is not None:
            return refusal(field_errors(errors))
        try:
            refund = refund_create(
                payment_id=parent.id,
                amount=values["amount"],
                reason=values.get("reason", ""),
                metadata=values.get("metadata"),
                caused_by=f"api:{request.user.get_username()}",
                carried=carried(request),
            )
        except ExposureLimitExceeded as exc:
            return refusal(exposure_conflict(exc))
        except MoneyOutRefused as exc:
            # Nothing was written: the key is released, so the request may be made again once
            # the rule allows it (the debit settled, say).
            param = "amount" if exc.rule == REFUND_EXCEEDS_REFUNDABLE else "payment_id"
            return refusal(
                ApiError(
                    status.HTTP_409_CONFLICT,
                    exc.rule,
                    str(exc),
                    param=param,
                    errors={param: [str(exc)]},
                )
            )
        except PaymentNotFound:
            return refusal(ApiError(404, "resource_missing", "no such payment", param="payment_id"))
        return idempotency.Answer(
            201, created_shaped(RefundOutputSerializer, refund, {"created": True})
        )


class RefundDetailApi(ReadApi):
    """``GET /api/refunds/<id>/``: one refund, as its create answered and its debit lists it."""

    purpose = PaymentPurpose.REFUND
    id_param = "refund_id"
    output_serializer = RefundOutputSerializer

    @retrieve_schema(
        "refund_retrieve",
        "refund_id",
        RefundOutputSerializer,
        "The refund, in the shape its create answered with and its debit lists.",
    )
    def get(self, request, refund_id):
        return self.retrieve(request, refund_id)
