"""Payouts: ``/api/payouts/`` (``POST`` pays a merchant's available balance out to its own
account, ``GET`` lists payouts) and ``/api/payouts/<id>/``, their view, serializer and schema
(``payments.services.payouts``). A payout shows its destination as token and last four digits."""

from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import serializers, status

from payments import idempotency
from payments.access import merchant_access_allowed
from payments.api.base import (
    CreateApi,
    ReadApi,
    body_checked,
    carried,
    exposure_conflict,
    forbidden,
    refusal,
)
from payments.api.errors import ApiError, field_errors
from payments.api.fields import (
    AmountField,
    MetadataField,
    StrictCharField,
    StrictInputSerializer,
    account_token_checked,
    merchant_id_checked,
)
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
    retrieve_schema,
)
from payments.exceptions import ExposureLimitExceeded, MoneyOutRefused
from payments.models import Payment, PaymentPurpose
from payments.object_shapes import PayoutOutputSerializer
from payments.selectors import payouts_last4
from payments.services import BANK_NUMBER_MESSAGE, looks_like_bank_number
from payments.services import payouts as payout_rules
from payments.services.payouts import payout_create


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


class PayoutReadApi(ReadApi):
    """Payouts as every answer shows them: their destinations' last four digits read once per
    page."""

    purpose = PaymentPurpose.PAYOUT
    id_param = "payout_id"
    output_serializer = PayoutOutputSerializer

    def context_of(self, objects) -> dict:
        return {"last4": payouts_last4(objects)}


@extend_schema_view(
    post=extend_schema(
        operation_id="payout_create",
        request=PayoutCreateInputSerializer,
        parameters=[IDEMPOTENCY_KEY, *REQUEST_HEADERS],
        responses={
            201: OpenApiResponse(
                PayoutOutputSerializer,
                description="The payout: an ACH credit of the merchant's available balance "
                "to its own account, pending, with its own idempotency key.",
            ),
            400: BODY_REFUSED,
            403: error_answer("You may not act for merchant_id."),
            409: error_answer(
                "The payout rules refuse it; code names the rule: "
                + ", ".join(payout_rules.RULES)
                + "; or exposure_limit_exceeded (param naming the credit limit). Or a "
                "request with this Idempotency-Key is still being processed."
            ),
            422: KEY_REUSED,
            **COMMON_ANSWERS,
        },
    )
)
class PayoutListCreateApi(CreateApi, PayoutReadApi):
    """``/api/payouts/``: ``POST`` pays out; ``GET`` lists the payouts of
    every merchant the caller may act for (or of ``merchant``), newest first, with the payments
    list's filters."""

    # The create path's Idempotency-Key; 409 insufficient_available_balance when the balance,
    # checked and held in one transaction, does not cover the payout.
    key_scope = "payout"

    @extend_schema(
        operation_id="payout_list",
        parameters=[*LIST_PARAMETERS, *REQUEST_HEADERS],
        responses={
            200: OpenApiResponse(
                list_of("PayoutList", PayoutOutputSerializer),
                description="Payouts, newest first, one page after the cursor.",
            ),
            400: LIST_REFUSED,
            403: LIST_FORBIDDEN,
            **COMMON_ANSWERS,
        },
    )
    def get(self, request):
        return self.list_page(request)

    def create_answer(self, request, data, parent: Payment | None) -> idempotency.Answer:
        values, errors = body_checked(PayoutCreateInputSerializer, data)
        if errors is not None:
            return refusal(field_errors(errors))
        if not merchant_access_allowed(user=request.user, merchant_id=values["merchant_id"]):
            return refusal(forbidden("merchant_id"))
        try:
            payout = payout_create(
                **values,
                caused_by=f"api:{request.user.get_username()}",
                carried=carried(request),
            )
        except DjangoValidationError as exc:
            return refusal(field_errors(exc.message_dict))
        except ExposureLimitExceeded as exc:
            return refusal(exposure_conflict(exc))
        except MoneyOutRefused as exc:
            return refusal(
                ApiError(
                    status.HTTP_409_CONFLICT,
                    exc.rule,
                    str(exc),
                    param="amount",
                    errors={"amount": [str(exc)]},
                )
            )
        return idempotency.Answer(201, self.represent(payout))


class PayoutDetailApi(PayoutReadApi):
    """``GET /api/payouts/<id>/``: one payout, its destination as token and last four."""

    @retrieve_schema(
        "payout_retrieve",
        "payout_id",
        PayoutOutputSerializer,
        "The payout, its destination as token and last four digits.",
    )
    def get(self, request, payout_id):
        return self.retrieve(request, payout_id)
