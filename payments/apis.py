"""REST API for payments: thin views that parse input, call one service and format the result.

Every view declares its own authentication, permission, parser, renderer, throttle and exception
handling, so a host project's ``REST_FRAMEWORK`` defaults (``IsAdminUser``, a JWT class, a
custom error format) change nothing here. Each user acts only for the merchants the access
policy grants it (``payments.access``): another merchant's payment or balance answers 404, as if
it did not exist; creating a payment for it answers 403 naming ``merchant_id``.
"""

import logging
import re
from collections.abc import Mapping
from decimal import Decimal

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import InterfaceError, OperationalError
from rest_framework import serializers, status
from rest_framework.authentication import SessionAuthentication, TokenAuthentication
from rest_framework.permissions import IsAuthenticated
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView, exception_handler, set_rollback

from payments import conf as payments_conf
from payments import idempotency
from payments.access import merchant_access_allowed
from payments.http_limits import (
    LengthRequired,
    PayloadTooLarge,
    bounded_errors,
    read_body_limited,
)
from payments.models import Payment
from payments.selectors import (
    merchant_balance,
    payment_attempts_public,
    payment_detail_extensions,
    payment_errors_public,
    payment_get,
)
from payments.services import (
    BANK_NUMBER_MESSAGE,
    looks_like_bank_number,
    payment_create,
    validate_source_token,
)
from payments.strictjson import StrictJSONParser

logger = logging.getLogger(__name__)

_MERCHANT_RE = re.compile(r"[A-Za-z0-9_.:\-]{1,64}", re.ASCII)
MERCHANT_MESSAGE = "1-64 characters of A-Z, a-z, 0-9, _ . : or -"
# The callback contract's grammar: ASCII digits, one dot, two decimals, at most 12 integer
# digits (NUMERIC(14, 2)). No sign, exponent, underscore, space or non-ASCII digit.
AMOUNT_RE = re.compile(r"(0|[1-9][0-9]{0,11})\.[0-9]{2}", re.ASCII)
AMOUNT_MESSAGE = 'must be a decimal string with two decimals, such as "12.34"'

# Seconds a client should wait before retrying while the database cannot be reached: a restart
# or a failover takes a few seconds, and a shorter wait would only add load to the recovery.
DATABASE_RETRY_AFTER_SECONDS = 5
DATABASE_UNAVAILABLE_MESSAGE = "the database is unavailable; retry later"


def _errors_response(errors: dict, status_code: int = status.HTTP_400_BAD_REQUEST) -> Response:
    return Response({"errors": bounded_errors(errors)}, status=status_code)


def _body_limit_response(exc: PayloadTooLarge | LengthRequired) -> Response:
    if isinstance(exc, PayloadTooLarge):
        return _errors_response(
            {"body": [f"larger than {exc.limit} bytes, the limit of this API"]},
            status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
        )
    return _errors_response({"body": [str(exc.detail)]}, status.HTTP_411_LENGTH_REQUIRED)


def _api_exception_handler(exc, context):
    """DRF's handler, pinned: a host's EXCEPTION_HANDLER does not reshape this API's answers.

    A database that cannot be reached (refused, lost or closed connections, wherever they
    happen: authentication, the Idempotency-Key claim, the work) is the client's cue to retry,
    not a server bug: 503 with ``Retry-After``. Data errors (``DataError``, ``IntegrityError``)
    are bugs or bad rows and stay 500s.
    """
    if isinstance(exc, OperationalError | InterfaceError):
        return _database_unavailable_response(exc, context)
    if isinstance(exc, PayloadTooLarge | LengthRequired):
        return _body_limit_response(exc)
    return exception_handler(exc, context)


def _database_unavailable_response(exc: Exception, context) -> Response:
    # Never an idempotency.Answer: raised, not returned, so no Idempotency-Key stores it and a
    # retry with the key executes once the database is back.
    set_rollback()
    request = context["request"]
    match = getattr(request, "resolver_match", None)
    cause = exc.__cause__ or exc
    # The driver's message names the host, port and database: only the class and SQLSTATE are
    # logged, and the route's name rather than its path (a balance URL holds a merchant id).
    logger.error(
        "payments API answered 503, database unavailable: %s %s (%s%s)",
        request.method,
        match.url_name if match else type(context["view"]).__name__,
        type(cause).__name__,
        f", SQLSTATE {cause.sqlstate}" if getattr(cause, "sqlstate", None) else "",
        extra={"outcome": "database_unavailable"},
    )
    response = _errors_response(
        {"database_unavailable": [DATABASE_UNAVAILABLE_MESSAGE]},
        status.HTTP_503_SERVICE_UNAVAILABLE,
    )
    response["Retry-After"] = str(DATABASE_RETRY_AFTER_SECONDS)
    # The line above is the record; Django's request log would add a second one with the path.
    response._has_been_logged = True
    return response


class ModuleApiView(APIView):
    authentication_classes = [TokenAuthentication, SessionAuthentication]
    permission_classes = [IsAuthenticated]
    parser_classes = [StrictJSONParser]
    renderer_classes = [JSONRenderer]
    throttle_classes: list = []

    def get_exception_handler(self):
        return _api_exception_handler

    def initial(self, request, *args, **kwargs):
        # Size first, before authentication: read at most one byte past the limit whatever
        # Content-Length says, so a 10 MB body costs 64 KiB and gets this API's JSON 413, not
        # Django's HTML 400 (RequestDataTooBig).
        read_body_limited(request._request, payments_conf.PAYMENTS_API_MAX_BODY_BYTES)
        super().initial(request, *args, **kwargs)


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


class StrictInputSerializer(serializers.Serializer):
    """Refuses unknown fields by name, and any text that looks like a bank number.

    A bank number found in a field replaces the field's other errors: DRF's messages may quote
    the value (``"..." is not a valid choice``), and a refused value is never echoed, stored in
    the idempotency record, or logged.
    """

    # Fields holding a number, which the bank-number rule does not apply to.
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
        try:
            value = super().to_internal_value(data)
        except serializers.ValidationError as exc:
            for name, messages in exc.detail.items():
                if name not in bank_fields:
                    errors.setdefault(name, []).extend(str(m) for m in messages)
        for name in bank_fields:
            errors[name] = [BANK_NUMBER_MESSAGE]
        if errors:
            raise serializers.ValidationError(errors)
        return value


class PaymentCreateInputSerializer(StrictInputSerializer):
    numeric_fields = ("amount",)

    merchant_id = StrictCharField(max_length=64)
    amount = AmountField()
    currency = serializers.ChoiceField(choices=["USD"], default="USD")
    source_token = StrictCharField(max_length=128)
    description = StrictCharField(max_length=255, required=False, allow_blank=True)

    def validate_merchant_id(self, value: str) -> str:
        if not _MERCHANT_RE.fullmatch(value):
            raise serializers.ValidationError(MERCHANT_MESSAGE)
        return value

    def validate_source_token(self, value: str) -> str:
        try:
            validate_source_token(value)
        except DjangoValidationError as exc:
            raise serializers.ValidationError(exc.messages) from None
        return value


# --- Output -----------------------------------------------------------------------------------


class PaymentOutputSerializer(serializers.ModelSerializer):
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

    class Meta(PaymentOutputSerializer.Meta):
        fields = [*PaymentOutputSerializer.Meta.fields, "events", "attempts", "errors", "hold"]


class BalanceOutputSerializer(serializers.Serializer):
    """One currency of a merchant's ledger: credits from confirmations, reversals from returns
    after settlement, the net of the two, and the payments behind them."""

    currency = serializers.CharField()
    credits = serializers.CharField()
    reversals = serializers.CharField()
    net = serializers.CharField()
    confirmed_count = serializers.IntegerField()
    returned_count = serializers.IntegerField()
    returned_total = serializers.CharField()
    # Kept from the first version of this answer: ``balance`` equals ``net``.
    balance = serializers.CharField()
    entries = serializers.IntegerField()
    confirmed_total = serializers.CharField()


class MerchantBalanceOutputSerializer(serializers.Serializer):
    merchant_id = serializers.CharField()
    balances = BalanceOutputSerializer(many=True)


class ErrorsOutputSerializer(serializers.Serializer):
    """The shape of this API's 4xx answers and of its 503 while the database cannot be reached
    (``{"errors": {"database_unavailable": [...]}}``), for the OpenAPI schema.

    Bounded (``payments.http_limits.bounded_errors``): at most 10 names, 10 messages each, and
    ``more_errors`` counting what was left out."""

    errors = serializers.DictField(child=serializers.ListField(child=serializers.CharField()))


# --- Views ------------------------------------------------------------------------------------


class PaymentListCreateApi(ModuleApiView):
    def post(self, request):
        data = request.data
        key = request.headers.get("Idempotency-Key")
        if key is not None and not 1 <= len(key) <= 255:
            return _errors_response({"Idempotency-Key": ["must be 1-255 characters"]})
        result = idempotency.idempotency_key_run(
            user=request.user,
            key=key,
            request_data=data,
            work=lambda: _payment_create_answer(request.user, data),
        )
        return _idempotent_response(result)


def _refusal(status_code: int, errors: dict) -> idempotency.Answer:
    """A refusal before the request began to execute: not stored under the key, so the client's
    corrected (or, once granted, the same) request with the key executes."""
    return idempotency.Answer(status_code, {"errors": bounded_errors(errors)}, store=False)


def _payment_create_answer(user, data) -> idempotency.Answer:
    """Validate and create; only a create that executed is what the key replays."""
    serializer = PaymentCreateInputSerializer(data=data)
    if not serializer.is_valid():
        return _refusal(status.HTTP_400_BAD_REQUEST, serializer.errors)
    merchant_id = serializer.validated_data["merchant_id"]
    if not merchant_access_allowed(user=user, merchant_id=merchant_id):
        return _refusal(
            status.HTTP_403_FORBIDDEN,
            {"merchant_id": ["you are not granted access to this merchant"]},
        )
    try:
        payment = payment_create(
            **serializer.validated_data, caused_by=f"api:{user.get_username()}"
        )
    except DjangoValidationError as exc:
        # The service's own validation: nothing was written (its transaction rolls back).
        return _refusal(status.HTTP_400_BAD_REQUEST, exc.message_dict)
    return idempotency.Answer(201, PaymentOutputSerializer(payment).data)


def _idempotent_response(result: idempotency.IdempotentResult) -> Response:
    if result.outcome == idempotency.IdempotentOutcome.MISMATCH:
        return Response(
            {"errors": {"Idempotency-Key": ["was already used with a different request body"]}},
            status=422,
        )
    if result.outcome == idempotency.IdempotentOutcome.IN_FLIGHT:
        return Response(
            {"errors": {"Idempotency-Key": ["a request with this key is still being processed"]}},
            status=409,
            headers={"Retry-After": "1"},
        )
    response = Response(result.answer.body, status=result.answer.status)
    if result.outcome == idempotency.IdempotentOutcome.REPLAYED:
        response["Idempotent-Replayed"] = "true"
    return response


def _payment_not_found() -> Response:
    return _errors_response({"payment_id": ["not found"]}, status.HTTP_404_NOT_FOUND)


class PaymentDetailApi(ModuleApiView):
    def get(self, request, payment_id):
        try:
            payment = payment_get(payment_id=payment_id)
        except Payment.DoesNotExist:
            return _payment_not_found()
        # Another merchant's payment is answered exactly like a missing one: no existence leak.
        if not merchant_access_allowed(user=request.user, merchant_id=payment.merchant_id):
            return _payment_not_found()
        data = dict(PaymentOutputSerializer(payment).data)
        data["events"] = PaymentEventOutputSerializer(payment.events.all(), many=True).data
        data["attempts"] = ProcessorAttemptOutputSerializer(
            payment_attempts_public(payment), many=True
        ).data
        data["errors"] = payment_errors_public(payment)
        for extension in payment_detail_extensions:
            for name, value in extension(payment).items():
                if name == "errors":
                    data["errors"].extend(value)
                else:
                    data[name] = value
        return Response(data)


class MerchantBalanceApi(ModuleApiView):
    def get(self, request, merchant_id):
        if looks_like_bank_number(merchant_id):
            response = _errors_response({"merchant_id": [BANK_NUMBER_MESSAGE]})
            # Django's request log would write the path, and with it the number.
            response._has_been_logged = True
            logger.warning("Bad Request: a bank number in a merchant balance URL (not logged)")
            return response
        if not _MERCHANT_RE.fullmatch(merchant_id):
            return _errors_response({"merchant_id": [MERCHANT_MESSAGE]})
        if not merchant_access_allowed(user=request.user, merchant_id=merchant_id):
            return _errors_response({"merchant_id": ["not found"]}, status.HTTP_404_NOT_FOUND)
        return Response(
            MerchantBalanceOutputSerializer(merchant_balance(merchant_id=merchant_id)).data
        )
