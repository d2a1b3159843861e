"""REST API for payments: thin views that parse input, call one service and format the result."""

import re
from decimal import Decimal

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import transaction
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from payments import idempotency
from payments.models import Payment
from payments.selectors import merchant_balance, payment_detail_extensions, payment_get
from payments.services import payment_create, validate_source_token

_MERCHANT_RE = re.compile(r"^[A-Za-z0-9_.:\-]{1,64}$")


def _errors_response(errors: dict) -> Response:
    return Response({"errors": errors}, status=status.HTTP_400_BAD_REQUEST)


class DecimalStringField(serializers.DecimalField):
    """A decimal given as a JSON string ("12.34"): JSON numbers are floats and lose cents."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("not_string")
        return super().to_internal_value(data)

    default_error_messages = {
        **serializers.DecimalField.default_error_messages,
        "not_string": 'must be a decimal string such as "12.34", not a JSON number',
    }


class PaymentCreateInput(serializers.Serializer):
    merchant_id = serializers.CharField(max_length=64)
    amount = DecimalStringField(max_digits=14, decimal_places=2, min_value=Decimal("0.01"))
    currency = serializers.ChoiceField(choices=["USD"], default="USD")
    source_token = serializers.CharField(max_length=128)
    description = serializers.CharField(max_length=255, required=False, allow_blank=True)

    def validate_merchant_id(self, value: str) -> str:
        if not _MERCHANT_RE.match(value):
            raise serializers.ValidationError("1-64 characters of A-Z, a-z, 0-9, _ . : or -")
        return value

    def validate_source_token(self, value: str) -> str:
        try:
            validate_source_token(value)
        except DjangoValidationError as exc:
            raise serializers.ValidationError(exc.messages) from None
        return value


class PaymentOutput(serializers.ModelSerializer):
    class Meta:
        model = Payment
        fields = [
            "id",
            "state",
            "idempotency_key",
            "merchant_id",
            "amount",
            "currency",
            "description",
            "processor_id",
            "created_at",
            "updated_at",
        ]


class PaymentListCreateApi(APIView):
    def post(self, request):
        serializer = PaymentCreateInput(data=request.data)
        key = request.headers.get("Idempotency-Key")
        if key is not None and not 1 <= len(key) <= 255:
            return _errors_response({"Idempotency-Key": ["must be 1-255 characters"]})
        record = None
        if key is not None:
            claim = idempotency.idempotency_key_claim(
                user=request.user,
                key=key,
                fingerprint=idempotency.request_fingerprint(request.data),
            )
            if isinstance(claim, idempotency.Replay):
                return _replay_response(claim)
            record = claim
        try:
            with transaction.atomic():
                if not serializer.is_valid():
                    answer = Response({"errors": serializer.errors}, status=400)
                else:
                    try:
                        payment = payment_create(
                            **serializer.validated_data, caused_by=f"api:{request.user.username}"
                        )
                    except DjangoValidationError as exc:
                        answer = _errors_response(exc.message_dict)
                    else:
                        answer = Response(PaymentOutput(payment).data, status=201)
                if record is not None:
                    idempotency.idempotency_key_complete(
                        record=record, status=answer.status_code, body=answer.data
                    )
        except BaseException:
            if record is not None:
                idempotency.idempotency_key_release(record=record)
            raise
        return answer


def _replay_response(claim: idempotency.Replay) -> Response:
    if claim.reason == "mismatch":
        return Response(
            {"errors": {"Idempotency-Key": ["was already used with a different request body"]}},
            status=422,
        )
    if claim.reason == "in_flight":
        return Response(
            {"errors": {"Idempotency-Key": ["a request with this key is still being processed"]}},
            status=409,
            headers={"Retry-After": "1"},
        )
    response = Response(claim.body, status=claim.status)
    response["Idempotent-Replayed"] = "true"
    return response


class PaymentDetailApi(APIView):
    def get(self, request, payment_id):
        try:
            payment = payment_get(payment_id=payment_id)
        except Payment.DoesNotExist:
            return Response({"errors": {"payment_id": ["not found"]}}, status=404)
        data = dict(PaymentOutput(payment).data)
        data["events"] = [
            {
                "kind": e.kind,
                "outcome": e.outcome,
                "event_type": e.event_type,
                "processor_event_id": e.processor_event_id,
                "from_state": e.from_state,
                "to_state": e.to_state,
                "caused_by": e.caused_by,
                "created_at": e.created_at,
            }
            for e in payment.events.all()
        ]
        data["attempts"] = [
            {
                "attempt_number": a.attempt_number,
                "operation": a.operation,
                "outcome": a.outcome,
                "http_status": a.http_status,
                "error_kind": a.error_kind,
                "error": a.error,
                "latency_ms": a.latency_ms,
                "started_at": a.started_at,
            }
            for a in payment.attempts.all()
        ]
        data["errors"] = [
            {"source": "processor", "attempt_number": a["attempt_number"], "error": a["error"]}
            for a in data["attempts"]
            if a["error"]
        ]
        for extension in payment_detail_extensions:
            for name, value in extension(payment).items():
                if name == "errors":
                    data["errors"].extend(value)
                else:
                    data[name] = value
        return Response(data)


class MerchantBalanceApi(APIView):
    def get(self, request, merchant_id):
        if not _MERCHANT_RE.match(merchant_id):
            return _errors_response(
                {"merchant_id": ["1-64 characters of A-Z, a-z, 0-9, _ . : or -"]}
            )
        return Response(merchant_balance(merchant_id=merchant_id))
