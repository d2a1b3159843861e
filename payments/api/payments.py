"""Payments: ``/api/payments/`` (list, create a debit), ``/api/payments/<id>/`` and
``/api/payments/<id>/cancel/``, their views, serializers and schema. A payment is created pending
with its own idempotency key and its submit command in one transaction; a worker submits it."""

from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.extensions import OpenApiSerializerExtension
from drf_spectacular.utils import (
    OpenApiResponse,
    extend_schema,
    extend_schema_field,
    extend_schema_view,
)
from rest_framework import serializers, status
from rest_framework.response import Response

from payments import idempotency, originator
from payments.access import merchant_access_allowed
from payments.api.base import (
    CreateApi,
    ModuleApiView,
    ReadApi,
    body_checked,
    carried,
    created_shaped,
    error_response,
    exposure_conflict,
    forbidden,
    not_found,
    payment_of_user,
    refusal,
)
from payments.api.errors import ApiError, field_errors
from payments.api.fields import (
    AMOUNT_MESSAGE,
    MERCHANT_MESSAGE,
    AmountField,
    MetadataField,
    StrictCharField,
    StrictInputSerializer,
    account_token_checked,
    merchant_id_checked,
)
from payments.api.reinitiations import ReinitiationOutputSerializer
from payments.api.schema import (
    AMOUNT_PATTERN,
    BODY_REFUSED,
    COMMON_ANSWERS,
    IDEMPOTENCY_KEY,
    KEY_REUSED,
    LIST_FORBIDDEN,
    LIST_PARAMETERS,
    LIST_REFUSED,
    MERCHANT_PATTERN,
    REQUEST_HEADERS,
    error_answer,
    list_of,
    path_id,
    retrieve_schema,
)
from payments.exceptions import (
    AccountBlocked,
    AccountNotValidated,
    CancelRefused,
    ExposureLimitExceeded,
    NocPastDeadline,
    PaymentNotFound,
    SecCodeNotAllowed,
)
from payments.models import Payment, ReviewStatus
from payments.object_shapes import PaymentOutputSerializer, RefundOutputSerializer
from payments.selectors import (
    payment_attempts_public,
    payment_detail_extensions,
    payment_errors_public,
    payment_get,
    payment_refunds,
    payment_reinitiation_chain,
)
from payments.services import (
    _TOKEN_RE,
    cancel,
    noc_warning,
    payment_cancel,
    payment_create,
)
from payments.services.refunds import refundable_amount

# --- Serializers ------------------------------------------------------------------------------

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


class PaymentCancelInputSerializer(StrictInputSerializer):
    """The body of ``POST /api/payments/<id>/cancel/``: none, or an empty object. Any field is
    refused by name, so a client that meant something by it hears so."""


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


class PaymentCreateInputExtension(OpenApiSerializerExtension):
    """The create body's rules the serializer checks in its ``validate_*`` methods, which the
    schema generator cannot see: without them the schema calls any 1-64 character merchant id
    and any token valid, and a client (or a fuzzer) built from it mostly gets 400s. The
    patterns are the validation's own regular expressions, anchored, so they cannot drift.

    Not expressible here: the bank-number rule (8 or more digits in a row, or in groups), which
    refuses some values these patterns match."""

    target_class = PaymentCreateInputSerializer

    def map_serializer(self, auto_schema, direction):
        schema = auto_schema._map_serializer(self.target, direction, bypass_extensions=True)
        properties = schema["properties"]
        properties["merchant_id"]["pattern"] = MERCHANT_PATTERN
        properties["merchant_id"]["description"] = MERCHANT_MESSAGE
        properties["source_token"].update(
            pattern=_TOKEN_RE.pattern,
            minLength=8,
            description="The processor's token for the bank account, never a bank number.",
        )
        properties["amount"]["pattern"] = AMOUNT_PATTERN
        properties["amount"]["description"] = AMOUNT_MESSAGE
        # Unknown fields are refused with 400 naming them (StrictInputSerializer).
        schema["additionalProperties"] = False
        return schema


# --- Views ------------------------------------------------------------------------------------


@extend_schema_view(
    post=extend_schema(
        operation_id="payment_create",
        request=PaymentCreateInputSerializer,
        parameters=[IDEMPOTENCY_KEY, *REQUEST_HEADERS],
        responses={
            201: OpenApiResponse(
                PaymentCreatedOutputSerializer,
                description="The payment; warnings when the token has an open notification "
                "of change within its deadline.",
            ),
            400: BODY_REFUSED,
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
            422: KEY_REUSED,
            **COMMON_ANSWERS,
        },
    )
)
class PaymentListCreateApi(CreateApi, ReadApi):
    """Create a debit: the payment (pending, with its own idempotency key) and its submit
    command in one transaction; a worker submits it. With an ``Idempotency-Key`` header the
    same body replays the first answer, another body answers 422, and a request still running
    with the key answers 409."""

    @extend_schema(
        operation_id="payment_list",
        parameters=[*LIST_PARAMETERS, *REQUEST_HEADERS],
        responses={
            200: OpenApiResponse(
                list_of("PaymentList", PaymentOutputSerializer),
                description="Newest first, one page after the cursor.",
            ),
            400: LIST_REFUSED,
            403: LIST_FORBIDDEN,
            **COMMON_ANSWERS,
        },
    )
    def get(self, request):
        """The payments of every merchant the caller may act for, newest first, in cursor pages;
        filtered by ``merchant``, ``state``, ``direction``, ``purpose``, ``created_gte`` and
        ``created_lt``."""
        return self.list_page(request)

    def create_answer(self, request, data, parent: Payment | None) -> idempotency.Answer:
        """Validate and create; only a create that executed is what the key replays."""
        user = request.user
        values, errors = body_checked(PaymentCreateInputSerializer, data)
        if errors is not None:
            return refusal(field_errors(errors))
        merchant_id = values["merchant_id"]
        if not merchant_access_allowed(user=user, merchant_id=merchant_id):
            return refusal(forbidden("merchant_id"))
        try:
            payment = payment_create(
                **values,
                caused_by=f"api:{user.get_username()}",
                carried=carried(request),
            )
        except DjangoValidationError as exc:
            # The service's own validation: nothing was written (its transaction rolls back).
            return refusal(field_errors(exc.message_dict))
        except ExposureLimitExceeded as exc:
            return refusal(exposure_conflict(exc))
        except (NocPastDeadline, AccountBlocked, AccountNotValidated, SecCodeNotAllowed) as exc:
            return refusal(_create_conflict(exc))
        return idempotency.Answer(201, _created_body(payment))


def _create_conflict(exc: Exception) -> ApiError:
    """The 409 of a rule the create refuses by, naming the field at fault."""
    if isinstance(exc, NocPastDeadline):
        # Naming the NOC and its code; its corrected data stays with the operators.
        return ApiError(
            status.HTTP_409_CONFLICT,
            "notification_of_change_past_deadline",
            f"source_token: {exc}",
            param="source_token",
            errors={"source_token": [str(exc)]},
        )
    if isinstance(exc, AccountBlocked):
        return ApiError(
            status.HTTP_409_CONFLICT,
            "account_blocked",
            str(exc),
            param="source_token",
            errors={"source_token": [str(exc)]},
        )
    if isinstance(exc, AccountNotValidated):
        return ApiError(
            status.HTTP_409_CONFLICT,
            "account_not_validated",
            f"source_token: {exc}",
            param="source_token",
            errors={"source_token": [str(exc)]},
        )
    return ApiError(
        status.HTTP_409_CONFLICT,
        "sec_code_not_allowed",
        str(exc),
        param="sec_code",
        errors={"sec_code": [str(exc)]},
    )


def _created_body(payment: Payment) -> dict:
    """The create's answer: the payment, and the warnings it was created with."""
    body = created_shaped(PaymentOutputSerializer, payment)
    warnings = [noc_warning(noc) for noc in payment.nocs_open]
    if payment.review_status == ReviewStatus.HELD:
        # Past a limit (OVER_LIMIT = "hold") or flagged by a fraud rule: created, and sent only
        # once a person approves it.
        warnings.append({"code": "held_for_review", "message": payment.review_reason})
    if payment.review_status == ReviewStatus.VALIDATION:
        # PAYMENTS["UNVALIDATED_WEB_DEBITS"] = "hold": sent once its account is validated.
        warnings.append({"code": "held_for_validation", "message": payment.review_reason})
    if warnings:
        body["warnings"] = warnings
    return body


class PaymentDetailApi(ReadApi):
    @retrieve_schema(
        "payment_retrieve",
        "payment_id",
        PaymentDetailOutputSerializer,
        "The payment with its events, attempts and errors.",
    )
    def get(self, request, payment_id):
        """One payment with its events, processor attempts, errors (each by a stable code), its
        hold and its reinitiation chain; 404 for an unknown payment and for another merchant's
        alike."""
        return self.retrieve(request, payment_id)

    def represent(self, found: Payment) -> dict:
        return payment_detail(found)


def payment_detail(payment: Payment) -> dict:
    """``GET /api/payments/<id>/``'s representation of the payment, also the cancel's answer."""
    data = dict(PaymentOutputSerializer(payment).data)
    data["events"] = PaymentEventOutputSerializer(payment.events.all(), many=True).data
    data["attempts"] = ProcessorAttemptOutputSerializer(
        payment_attempts_public(payment), many=True
    ).data
    data["errors"] = payment_errors_public(payment)
    chain = payment_reinitiation_chain(payment)
    data["reinitiation"] = ReinitiationOutputSerializer(chain).data if chain else None
    data["refunds"] = RefundOutputSerializer(payment_refunds(payment), many=True).data
    data["refundable_amount"] = f"{refundable_amount(payment):.2f}"
    data["refund_of"] = str(payment.refund_of_id) if payment.refund_of_id else None
    for extension in payment_detail_extensions:
        for name, value in extension(payment).items():
            if name == "errors":
                data["errors"].extend(value)
            else:
                data[name] = value
    return data


class PaymentCancelApi(ModuleApiView):
    """``POST /api/payments/<id>/cancel/``: a payment not yet at the processor or in a bank
    file canceled (``payments.services.cancel``), answered 200 with the payment as ``GET``
    shows it. A payment already canceled gets the same answer again (a cancel is idempotent by
    itself, so no Idempotency-Key is read). A refusal is 409 naming the rule; another
    merchant's payment is 404, as on ``GET``."""

    @extend_schema(
        operation_id="payment_cancel",
        request=PaymentCancelInputSerializer,
        parameters=[path_id("payment_id"), *REQUEST_HEADERS],
        responses={
            200: OpenApiResponse(
                PaymentDetailOutputSerializer,
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
    def post(self, request, payment_id):
        payment = payment_of_user(request.user, payment_id)
        if payment is None:
            return not_found("payment_id")
        serializer = PaymentCancelInputSerializer(data=request.data)
        if not serializer.is_valid():
            raise field_errors(serializer.errors)
        try:
            result = payment_cancel(
                payment_id=payment.id, caused_by=f"api:{request.user.get_username()}"
            )
        except CancelRefused as exc:
            return error_response(
                ApiError(
                    status.HTTP_409_CONFLICT,
                    exc.rule,
                    str(exc),
                    param="payment_id",
                    errors={"payment_id": [str(exc)]},
                )
            )
        except PaymentNotFound:
            return not_found("payment_id")
        return Response(payment_detail(payment_get(payment_id=result.payment.id)))
