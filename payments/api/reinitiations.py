"""``POST /api/payments/<id>/reinitiate/``: a returned payment sent again as a new one, within
NACHA's limits (``payments.services.reinitiation``); a refusal is 409 naming the rule. Its view,
serializers and schema; the chain's shape is also the payment detail's ``reinitiation``."""

import re

from drf_spectacular.extensions import OpenApiSerializerExtension
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import serializers, status

from payments import idempotency
from payments.api.base import CreateApi, payment_in_path, refusal
from payments.api.errors import ApiError, field_errors
from payments.api.fields import StrictCharField, StrictInputSerializer
from payments.api.schema import (
    BODY_REFUSED,
    COMMON_ANSWERS,
    IDEMPOTENCY_KEY,
    KEY_REUSED,
    REQUEST_HEADERS,
    error_answer,
    path_id,
)
from payments.exceptions import PaymentNotFound, ReinitiationRefused
from payments.models import Payment
from payments.object_shapes import PaymentOutputSerializer
from payments.selectors import payment_reinitiation_chain
from payments.services import payment_reinitiate
from payments.services import reinitiation as reinitiation_rules

AUTHORIZATION_REFERENCE_RE = re.compile(r"[A-Za-z0-9_.:\-]{1,64}", re.ASCII)
AUTHORIZATION_REFERENCE_MESSAGE = "1-64 characters of A-Z, a-z, 0-9, _ . : or -"


class PaymentReinitiateInputSerializer(StrictInputSerializer):
    """The body of ``POST /api/payments/<id>/reinitiate/``: empty, or the reference of the new
    authorization a reinitiation after an unauthorized return (R05, R07, R08, R10, R29, R51)
    is made under (the client's own id of the signed or recorded authorization)."""

    authorization_reference = StrictCharField(max_length=64, required=False)

    def validate_authorization_reference(self, value: str) -> str:
        if not AUTHORIZATION_REFERENCE_RE.fullmatch(value):
            raise serializers.ValidationError(AUTHORIZATION_REFERENCE_MESSAGE)
        return value


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


class PaymentReinitiateInputExtension(OpenApiSerializerExtension):
    """The reinitiate body: the reference's pattern, and no other field."""

    target_class = PaymentReinitiateInputSerializer

    def map_serializer(self, auto_schema, direction):
        schema = auto_schema._map_serializer(self.target, direction, bypass_extensions=True)
        schema["properties"]["authorization_reference"].update(
            pattern=f"^{AUTHORIZATION_REFERENCE_RE.pattern}$",
            description=(
                "Your reference of the new authorization the customer gave: required to "
                "reinitiate after an R05, R07, R08, R10, R29 or R51 return. "
                + AUTHORIZATION_REFERENCE_MESSAGE
            ),
        )
        schema["additionalProperties"] = False
        return schema


@extend_schema_view(
    post=extend_schema(
        operation_id="payment_reinitiate",
        request=PaymentReinitiateInputSerializer,
        parameters=[path_id("payment_id"), IDEMPOTENCY_KEY, *REQUEST_HEADERS],
        responses={
            201: OpenApiResponse(
                PaymentReinitiatedOutputSerializer,
                description="The new payment (same merchant, amount and token), linked to "
                "the original entry, with the chain.",
            ),
            400: BODY_REFUSED,
            404: error_answer("No such payment, or one of a merchant you may not act for."),
            409: error_answer(
                "NACHA's rules refuse it; code names the rule: "
                + ", ".join(reinitiation_rules.RULES)
                + ". Or a request with this Idempotency-Key is still being processed."
            ),
            422: KEY_REUSED,
            **COMMON_ANSWERS,
        },
    )
)
class PaymentReinitiateApi(CreateApi):
    """``POST /api/payments/<id>/reinitiate/``: a returned payment sent again as a new one,
    within NACHA's limits (``payments.services.reinitiation``); a refusal is 409 naming the
    rule. The Idempotency-Key works as on create, its request being this payment and body."""

    key_scope = "reinitiate"

    def parent_of(self, request, payment_id):
        return payment_in_path(request, payment_id)

    def create_answer(self, request, data, parent: Payment) -> idempotency.Answer:
        serializer = PaymentReinitiateInputSerializer(data=data)
        if not serializer.is_valid():
            return refusal(field_errors(serializer.errors))
        try:
            created = payment_reinitiate(
                payment_id=parent.id,
                authorization_reference=serializer.validated_data.get(
                    "authorization_reference", ""
                ),
                caused_by=f"api:{request.user.get_username()}",
            )
        except ReinitiationRefused as exc:
            # Nothing was written: the key is released, so the same request may be made again
            # once the rule allows it (a NOC applied, say).
            return refusal(
                ApiError(
                    status.HTTP_409_CONFLICT,
                    exc.rule,
                    str(exc),
                    param=exc.param or "payment_id",
                    errors={exc.param or "payment_id": [str(exc)]},
                )
            )
        except PaymentNotFound:
            return refusal(ApiError(404, "resource_missing", "no such payment", param="payment_id"))
        body = dict(PaymentOutputSerializer(created).data)
        body["reinitiation"] = ReinitiationOutputSerializer(
            payment_reinitiation_chain(created)
        ).data
        return idempotency.Answer(201, body)
