"""REST API for payments: thin views that parse input, call one service and format the result.

Every view pins every DRF policy it relies on (authentication, permission, parser, renderer,
content negotiation, versioning, throttle, metadata, schema, exception handling; the list its
own pagination), so a host project's ``REST_FRAMEWORK`` defaults (``IsAdminUser``, a JWT class,
``URLPathVersioning``, a custom pagination or error format) change nothing here. Every error is
the envelope of ``payments.api_errors`` and every answer carries ``Request-Id``. Each user acts
only for the merchants the access policy grants it (``payments.access``): another merchant's
payment or balance answers 404, as if it did not exist; creating or listing payments for it
answers 403 naming the merchant.
"""

import base64
import logging
import uuid
from urllib import parse

from django.core.exceptions import ValidationError as DjangoValidationError
from django.utils.cache import patch_vary_headers
from drf_spectacular.openapi import AutoSchema
from rest_framework import status
from rest_framework.authentication import SessionAuthentication, TokenAuthentication
from rest_framework.exceptions import NotFound
from rest_framework.metadata import SimpleMetadata
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.pagination import Cursor, CursorPagination
from rest_framework.permissions import IsAuthenticated
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.utils.urls import replace_query_param
from rest_framework.views import APIView

from payments import conf as payments_conf
from payments import idempotency
from payments.access import merchant_access_allowed, merchants_listed
from payments.api_access_classes import authentication_classes, permission_classes
from payments.api_errors import (
    DATABASE_RETRY_AFTER_SECONDS,
    DATABASE_UNAVAILABLE_MESSAGE,
    ApiError,
    ErrorType,
    ModuleErrorsMixin,
    field_errors,
    request_id_of,
)
from payments.api_throttling import ModuleScopedThrottle
from payments.api_versions import (
    V2026_12_01,
    VERSION_HEADER,
    error_for_version,
    requested_version,
    version_of,
)
from payments.exceptions import (
    AccountBlocked,
    AccountNotValidated,
    CancelRefused,
    ExposureLimitExceeded,
    MoneyOutRefused,
    NocPastDeadline,
    PaymentNotFound,
    ReinitiationRefused,
    SecCodeNotAllowed,
)
from payments.http_limits import read_body_limited
from payments.kernel import propagation
from payments.models import Payment, ReviewStatus
from payments.selectors import (
    merchant_balance,
    merchant_balances,
    payment_attempts_public,
    payment_detail_extensions,
    payment_errors_public,
    payment_get,
    payment_refunds,
    payment_reinitiation_chain,
    payouts_last4,
)
from payments.serializers import (
    MERCHANT_MESSAGE,
    MERCHANT_RE,
    BalanceObjectOutputSerializer,
    MerchantBalanceOutputSerializer,
    PaymentCancelInputSerializer,
    PaymentCreateInputSerializer,
    PaymentEventOutputSerializer,
    PaymentListQuerySerializer,
    PaymentOutputSerializer,
    PaymentReinitiateInputSerializer,
    PayoutCreateInputSerializer,
    PayoutOutputSerializer,
    ProcessorAttemptOutputSerializer,
    RefundCreateInputSerializer,
    RefundOutputSerializer,
    ReinitiationOutputSerializer,
)
from payments.services import (
    BANK_NUMBER_MESSAGE,
    looks_like_bank_number,
    noc_warning,
    payment_cancel,
    payment_create,
    payment_reinitiate,
)
from payments.services.payouts import payout_create
from payments.services.refunds import REFUND_EXCEEDS_REFUNDABLE, refund_create, refundable_amount
from payments.strictjson import StrictJSONParser

logger = logging.getLogger(__name__)

__all__ = [
    "DATABASE_RETRY_AFTER_SECONDS",
    "DATABASE_UNAVAILABLE_MESSAGE",
    "MerchantBalanceApi",
    "PaymentCancelApi",
    "PaymentDetailApi",
    "PaymentListCreateApi",
    "PaymentReinitiateApi",
]


class ModuleApiView(ModuleErrorsMixin, APIView):
    # PAYMENTS["API_AUTHENTICATION_CLASSES"] and ["API_PERMISSION_CLASSES"], read per request
    # (get_authenticators, get_permissions); these are their defaults.
    authentication_classes = [TokenAuthentication, SessionAuthentication]
    permission_classes = [IsAuthenticated]
    parser_classes = [StrictJSONParser]
    renderer_classes = [JSONRenderer]
    content_negotiation_class = DefaultContentNegotiation
    # The module's URLs carry no version (a host's URLPathVersioning would refuse them all): it
    # is a header, read by determine_version.
    versioning_class = None
    throttle_classes = [ModuleScopedThrottle]
    metadata_class = SimpleMetadata
    schema = AutoSchema()

    def get_authenticators(self):
        classes = authentication_classes(payments_conf.API_AUTHENTICATION_CLASSES)
        return [auth() for auth in classes]

    def get_permissions(self):
        classes = permission_classes(payments_conf.API_PERMISSION_CLASSES)
        return [permission() for permission in classes]

    def initial(self, request, *args, **kwargs):
        # Size first, before authentication: read at most one byte past the limit whatever
        # Content-Length says, so a 10 MB body costs 64 KiB and gets this API's JSON 413, not
        # Django's HTML 400 (RequestDataTooBig).
        read_body_limited(request._request, payments_conf.PAYMENTS_API_MAX_BODY_BYTES)
        super().initial(request, *args, **kwargs)

    def determine_version(self, request, *args, **kwargs):
        """``request.version``: the ``Payments-Version`` asked for, or the host's pin
        (``payments.api_versions``); read before authentication, so every answer has one."""
        return requested_version(request, payments_conf.API_VERSION), None

    def finalize_response(self, request, response, *args, **kwargs):
        """Every answer names the version it was served in; an error's code and type are the
        ones that version knows (``payments.api_versions.error_for_version``)."""
        version = version_of(request, payments_conf.API_VERSION)
        data = getattr(response, "data", None)
        if isinstance(data, dict) and isinstance(data.get("error"), dict):
            error_for_version(data["error"], version, type(self).__name__)
        response = super().finalize_response(request, response, *args, **kwargs)
        response[VERSION_HEADER] = version
        # The same URL answers in each version's shape: a cache must keep them apart.
        patch_vary_headers(response, [VERSION_HEADER])
        return response


def _error_response(error: ApiError) -> Response:
    return Response(error.body(), status=error.status_code)


def not_found(param: str) -> Response:
    message = f"no such {param.removesuffix('_id')}"
    return _error_response(
        ApiError(404, "resource_missing", message, param=param, errors={param: [message]})
    )


def _forbidden(param: str) -> ApiError:
    return ApiError(
        status.HTTP_403_FORBIDDEN,
        "merchant_forbidden",
        "you are not granted access to this merchant",
        param=param,
        errors={param: ["you are not granted access to this merchant"]},
    )


class PaymentPagination(CursorPagination):
    """Newest first, one page after an opaque cursor: stable while payments are created, which
    an offset is not. ``created_at`` orders; ties (one transaction's rows) keep their order by
    the cursor's offset.

    A cursor is only ever one this API wrote: it is read back and written again, and anything
    that does not come out the same is a 400 naming ``cursor``. DRF's own reading is lenient
    (``b64decode`` drops characters outside the alphabet, so ``!!!***`` reads as nothing; a
    query string of unknown keys reads as no keys; an offset past the cutoff is cut down), and a
    lenient reading of a forged cursor is the first page, silently. The cursor carries a
    creation time and an offset, nothing of a merchant: whoever holds it lists only the
    payments they may read. An empty cursor is refused too (the API never writes one; the
    first page is the request without ``cursor``)."""

    ordering = ("-created_at", "-id")
    page_size = 25
    page_size_query_param = "limit"
    max_page_size = 100

    def get_paginated_response(self, data) -> Response:
        """The page in the list shape every list answers with: ``object`` ``list``, the cursor
        links, and ``has_more`` (whether a page follows this one, the way it was read)."""
        return Response(
            {
                "object": "list",
                "next": self.get_next_link(),
                "previous": self.get_previous_link(),
                "has_more": self.has_next,
                "results": data,
            }
        )

    def encode_cursor(self, cursor: Cursor) -> str:
        return replace_query_param(self.base_url, self.cursor_query_param, _cursor_text(cursor))

    def decode_cursor(self, request) -> Cursor | None:
        encoded = request.query_params.get(self.cursor_query_param)
        if encoded is None:
            return None
        try:
            cursor = super().decode_cursor(request)
        except NotFound:
            # DRF answers 404 for a cursor it cannot read; it is a bad parameter, not a resource.
            raise field_errors({"cursor": [NOT_OUR_CURSOR]}) from None
        if _cursor_text(cursor) != encoded or not _position_ours(cursor.position):
            raise field_errors({"cursor": [NOT_OUR_CURSOR]})
        return cursor


NOT_OUR_CURSOR = "not a cursor this API gave"


def _cursor_text(cursor: Cursor) -> str:
    """The one way a cursor is written (DRF's encoding, held here so that reading can compare
    with it): base64 of a query string of ``o`` (offset, when not 0), ``r`` (1, when
    reversed) and ``p`` (the position)."""
    tokens = {}
    if cursor.offset != 0:
        tokens["o"] = str(cursor.offset)
    if cursor.reverse:
        tokens["r"] = "1"
    if cursor.position is not None:
        tokens["p"] = cursor.position
    return base64.b64encode(parse.urlencode(tokens).encode("ascii")).decode("ascii")


def _position_ours(position: str | None) -> bool:
    """A position is the text of a payment's ``created_at`` as DRF writes it (``str`` of an
    aware UTC datetime): DRF filters on any text it is given, so a forged one would fail in
    the query, or page from a moment the API never named."""
    if position is None:
        return True
    try:
        moment = Payment._meta.get_field("created_at").to_python(position)
    except DjangoValidationError:
        return False
    return (
        moment is not None
        and moment.utcoffset() is not None
        and not moment.utcoffset()
        and str(moment) == position
    )


# --- Views ------------------------------------------------------------------------------------


class PaymentListCreateApi(ModuleApiView):
    def get(self, request):
        """The payments of every merchant the caller may act for, newest first, in cursor pages;
        filtered by ``merchant``, ``state``, ``direction``, ``purpose``, ``created_gte`` and
        ``created_lt``."""
        payments = payments_listed(request.user, query_checked(request), Payment.objects.all())
        paginator = PaymentPagination()
        page = paginator.paginate_queryset(payments, request, view=self)
        return paginator.get_paginated_response(PaymentOutputSerializer(page, many=True).data)

    def post(self, request):
        """Create a debit: the payment (pending, with its own idempotency key) and its submit
        command in one transaction; a worker submits it. With an ``Idempotency-Key`` header the
        same body replays the first answer, another body answers 422, and a request still running
        with the key answers 409."""
        data = request.data
        key = idempotency_key_header(request)
        result = idempotency.idempotency_key_run(
            user=request.user,
            key=key,
            request_data=data,
            work=lambda: _payment_create_answer(request, data),
        )
        return _idempotent_response(result)


def _carried(request) -> dict[str, str]:
    """What a payment made by ``request`` carries to the worker: its request id and trace."""
    return propagation.outgoing_values(request_id=request_id_of(request), headers=request.headers)


def idempotency_key_header(request) -> str | None:
    """The request's ``Idempotency-Key`` (None without one); 400 for one of the wrong size."""
    key = request.headers.get("Idempotency-Key")
    if key is not None and not 1 <= len(key) <= 255:
        raise field_errors({"Idempotency-Key": ["must be 1-255 characters"]})
    return key


def query_checked(request, serializer_class=PaymentListQuerySerializer) -> dict:
    """A GET's query as ``serializer_class`` reads it (a list's, by default), each parameter
    once; 400 naming what is refused."""
    params = request.query_params
    repeated = [name for name in params if len(params.getlist(name)) > 1]
    if repeated:
        raise field_errors({name: ["given more than once"] for name in repeated})
    query = serializer_class(data=params.dict())
    if not query.is_valid():
        raise field_errors(query.errors)
    return query.validated_data


def payments_listed(user, query: dict, payments, purpose: str | None = None):
    """``payments`` (of ``purpose``, when given) of the merchants the user may act for, under
    the query's filters; merchants it may not act for are never read."""
    merchant = query.get("merchant")
    if merchant is not None:
        if not merchant_access_allowed(user=user, merchant_id=merchant):
            raise _forbidden("merchant")
        merchants = [merchant]
    else:
        merchants = merchants_listed(user=user)
        if merchants is None:
            raise field_errors(
                {"merchant": ["required: the merchant access policy cannot list your merchants"]}
            )
    payments = payments.filter(merchant_id__in=merchants)
    if purpose is not None:
        payments = payments.filter(purpose=purpose)
    for name in ("state", "direction", "purpose"):
        if name in query:
            payments = payments.filter(**{name: query[name]})
    if "created_gte" in query:
        payments = payments.filter(created_at__gte=query["created_gte"])
    if "created_lt" in query:
        payments = payments.filter(created_at__lt=query["created_lt"])
    return payments


def _refusal(error: ApiError) -> idempotency.Answer:
    """A refusal before the request began to execute: not stored under the key, so the client's
    corrected (or, once granted, the same) request with the key executes."""
    return idempotency.Answer(error.status_code, error.body(), store=False)


def _payment_create_answer(request, data) -> idempotency.Answer:
    """Validate and create; only a create that executed is what the key replays."""
    user = request.user
    serializer = PaymentCreateInputSerializer(data=data)
    if not serializer.is_valid():
        return _refusal(field_errors(serializer.errors))
    merchant_id = serializer.validated_data["merchant_id"]
    if not merchant_access_allowed(user=user, merchant_id=merchant_id):
        return _refusal(_forbidden("merchant_id"))
    try:
        payment = payment_create(
            **serializer.validated_data,
            caused_by=f"api:{user.get_username()}",
            carried=_carried(request),
        )
    except DjangoValidationError as exc:
        # The service's own validation: nothing was written (its transaction rolls back).
        return _refusal(field_errors(exc.message_dict))
    except NocPastDeadline as exc:
        return _refusal(_noc_conflict(exc))
    except ExposureLimitExceeded as exc:
        return _refusal(exposure_conflict(exc))
    except AccountBlocked as exc:
        return _refusal(
            ApiError(
                status.HTTP_409_CONFLICT,
                "account_blocked",
                str(exc),
                param="source_token",
                errors={"source_token": [str(exc)]},
            )
        )
    except AccountNotValidated as exc:
        return _refusal(
            ApiError(
                status.HTTP_409_CONFLICT,
                "account_not_validated",
                f"source_token: {exc}",
                param="source_token",
                errors={"source_token": [str(exc)]},
            )
        )
    except SecCodeNotAllowed as exc:
        return _refusal(
            ApiError(
                status.HTTP_409_CONFLICT,
                "sec_code_not_allowed",
                str(exc),
                param="sec_code",
                errors={"sec_code": [str(exc)]},
            )
        )
    body = dict(PaymentOutputSerializer(payment).data)
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
    return idempotency.Answer(201, body)


def _noc_conflict(exc: NocPastDeadline) -> ApiError:
    """409 naming the NOC and its code; its corrected data stays with the operators."""
    return ApiError(
        status.HTTP_409_CONFLICT,
        "notification_of_change_past_deadline",
        f"source_token: {exc}",
        param="source_token",
        errors={"source_token": [str(exc)]},
    )


def exposure_conflict(exc: ExposureLimitExceeded) -> ApiError:
    """409 naming the limit in ``param`` (``debit_daily_limit``), the message by how much.
    Nothing was written, so the key is released: the same request may go once there is room."""
    return ApiError(
        status.HTTP_409_CONFLICT,
        "exposure_limit_exceeded",
        str(exc),
        param=exc.limit,
        errors={exc.limit: [str(exc)]},
    )


def _idempotent_response(result: idempotency.IdempotentResult) -> Response:
    if result.outcome == idempotency.IdempotentOutcome.MISMATCH:
        message = "was already used with a different request body"
        raise ApiError(
            422,
            "idempotency_key_reused",
            f"Idempotency-Key: {message}",
            param="Idempotency-Key",
            errors={"Idempotency-Key": [message]},
        )
    if result.outcome == idempotency.IdempotentOutcome.IN_FLIGHT:
        message = "a request with this key is still being processed"
        response = _error_response(
            ApiError(
                409,
                "idempotency_key_in_use",
                f"Idempotency-Key: {message}",
                param="Idempotency-Key",
                errors={"Idempotency-Key": [message]},
                error_type=ErrorType.IDEMPOTENCY,
            )
        )
        response["Retry-After"] = "1"
        return response
    response = Response(result.answer.body, status=result.answer.status)
    if result.outcome == idempotency.IdempotentOutcome.REPLAYED:
        response["Idempotent-Replayed"] = "true"
    return response


class PaymentDetailApi(ModuleApiView):
    def get(self, request, payment_id):
        """One payment with its events, processor attempts, errors (each by a stable code), its
        hold and its reinitiation chain; 404 for an unknown payment and for another merchant's
        alike."""
        payment = payment_of_user(request.user, payment_id)
        if payment is None:
            return not_found("payment_id")
        return Response(_payment_detail(payment))


def payment_of_user(user, payment_id: str) -> Payment | None:
    """The payment ``payment_id`` names if ``user`` may act for its merchant, else None: an id
    that is not a UUID, an unknown one and another merchant's are all answered alike (404), so
    no existence leaks. Any text in the path, so a malformed id gets this API's 404, not the
    host's page."""
    try:
        payment = payment_get(payment_id=uuid.UUID(payment_id))
    except (ValueError, Payment.DoesNotExist):
        return None
    if not merchant_access_allowed(user=user, merchant_id=payment.merchant_id):
        return None
    return payment


def _payment_detail(payment: Payment) -> dict:
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
            return _error_response(
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
        return Response(_payment_detail(payment_get(payment_id=result.payment.id)))


class PaymentRefundsApi(ModuleApiView):
    """``POST /api/payments/<id>/refunds/``: refund (part of) a confirmed debit, an ACH credit
    to the account it came from (``payments.services.refunds``); a refusal is 409 naming its
    rule. The Idempotency-Key works as on create, its request being this payment and body."""

    def post(self, request, payment_id):
        try:
            payment = Payment.objects.only("id", "merchant_id").get(pk=uuid.UUID(payment_id))
        except (ValueError, Payment.DoesNotExist):
            return not_found("payment_id")
        if not merchant_access_allowed(user=request.user, merchant_id=payment.merchant_id):
            return not_found("payment_id")
        data = request.data
        key = idempotency_key_header(request)
        result = idempotency.idempotency_key_run(
            user=request.user,
            key=key,
            request_data={"refund": str(payment.id), "body": data},
            work=lambda: _refund_create_answer(request, payment, data),
        )
        return _idempotent_response(result)


def _refund_create_answer(request, payment: Payment, data) -> idempotency.Answer:
    serializer = RefundCreateInputSerializer(data=data)
    if not serializer.is_valid():
        return _refusal(field_errors(serializer.errors))
    values = serializer.validated_data
    try:
        refund = refund_create(
            payment_id=payment.id,
            amount=values["amount"],
            reason=values.get("reason", ""),
            metadata=values.get("metadata"),
            caused_by=f"api:{request.user.get_username()}",
            carried=_carried(request),
        )
    except ExposureLimitExceeded as exc:
        return _refusal(exposure_conflict(exc))
    except MoneyOutRefused as exc:
        # Nothing was written: the key is released, so the request may be made again once the
        # rule allows it (the debit settled, say).
        return _refusal(
            ApiError(
                status.HTTP_409_CONFLICT,
                exc.rule,
                str(exc),
                param="payment_id" if exc.rule != REFUND_EXCEEDS_REFUNDABLE else "amount",
                errors={
                    "payment_id" if exc.rule != REFUND_EXCEEDS_REFUNDABLE else "amount": [str(exc)]
                },
            )
        )
    except PaymentNotFound:
        return _refusal(ApiError(404, "resource_missing", "no such payment", param="payment_id"))
    body = RefundOutputSerializer(refund, context={"created": True}).data
    return idempotency.Answer(201, dict(body))


class PayoutCreateApi(ModuleApiView):
    """``POST /api/payouts/``: a merchant's available balance paid out to its own account
    (``payments.services.payouts``), with the create path's Idempotency-Key; ``409
    insufficient_available_balance`` when the balance, checked and held in one transaction,
    does not cover it."""

    def post(self, request):
        key = idempotency_key_header(request)
        result = idempotency.idempotency_key_run(
            user=request.user,
            key=key,
            request_data={"payout": request.data},
            work=lambda: _payout_create_answer(request, request.data),
        )
        return _idempotent_response(result)


def _payout_create_answer(request, data) -> idempotency.Answer:
    serializer = PayoutCreateInputSerializer(data=data)
    if not serializer.is_valid():
        return _refusal(field_errors(serializer.errors))
    values = serializer.validated_data
    if not merchant_access_allowed(user=request.user, merchant_id=values["merchant_id"]):
        return _refusal(_forbidden("merchant_id"))
    try:
        payout = payout_create(
            **values,
            caused_by=f"api:{request.user.get_username()}",
            carried=_carried(request),
        )
    except DjangoValidationError as exc:
        return _refusal(field_errors(exc.message_dict))
    except ExposureLimitExceeded as exc:
        return _refusal(exposure_conflict(exc))
    except MoneyOutRefused as exc:
        return _refusal(
            ApiError(
                status.HTTP_409_CONFLICT,
                exc.rule,
                str(exc),
                param="amount",
                errors={"amount": [str(exc)]},
            )
        )
    return idempotency.Answer(201, payout_body(payout))


def payout_body(payout: Payment) -> dict:
    """One payout as every answer shows it."""
    return dict(PayoutOutputSerializer(payout, context={"last4": payouts_last4([payout])}).data)


class PaymentReinitiateApi(ModuleApiView):
    """``POST /api/payments/<id>/reinitiate/``: a returned payment sent again as a new one,
    within NACHA's limits (``payments.services.reinitiation``); a refusal is 409 naming the
    rule. The Idempotency-Key works as on create, its request being this payment and body."""

    def post(self, request, payment_id):
        try:
            payment = Payment.objects.only("id", "merchant_id").get(pk=uuid.UUID(payment_id))
        except (ValueError, Payment.DoesNotExist):
            return not_found("payment_id")
        if not merchant_access_allowed(user=request.user, merchant_id=payment.merchant_id):
            return not_found("payment_id")
        data = request.data
        key = idempotency_key_header(request)
        result = idempotency.idempotency_key_run(
            user=request.user,
            key=key,
            request_data={"reinitiate": str(payment.id), "body": data},
            work=lambda: _payment_reinitiate_answer(request.user, payment, data),
        )
        return _idempotent_response(result)


def _payment_reinitiate_answer(user, payment: Payment, data) -> idempotency.Answer:
    serializer = PaymentReinitiateInputSerializer(data=data)
    if not serializer.is_valid():
        return _refusal(field_errors(serializer.errors))
    try:
        created = payment_reinitiate(
            payment_id=payment.id,
            authorization_reference=serializer.validated_data.get("authorization_reference", ""),
            caused_by=f"api:{user.get_username()}",
        )
    except ReinitiationRefused as exc:
        # Nothing was written: the key is released, so the same request may be made again
        # once the rule allows it (a NOC applied, say).
        return _refusal(
            ApiError(
                status.HTTP_409_CONFLICT,
                exc.rule,
                str(exc),
                param=exc.param or "payment_id",
                errors={exc.param or "payment_id": [str(exc)]},
            )
        )
    except PaymentNotFound:
        return _refusal(ApiError(404, "resource_missing", "no such payment", param="payment_id"))
    body = dict(PaymentOutputSerializer(created).data)
    body["reinitiation"] = ReinitiationOutputSerializer(payment_reinitiation_chain(created)).data
    return idempotency.Answer(201, body)


def merchant_refused(request, merchant_id: str) -> Response | None:
    """The answer for a merchant id the caller may not read (400 for a bad one, 404 for one it
    may not act for, the same as one that does not exist), or None."""
    if looks_like_bank_number(merchant_id):
        response = _error_response(field_errors({"merchant_id": [BANK_NUMBER_MESSAGE]}))
        # Django's request log would write the path, and with it the number.
        response._has_been_logged = True
        logger.warning("Bad Request: a bank number in a merchant URL (not logged)")
        return response
    if not MERCHANT_RE.fullmatch(merchant_id):
        raise field_errors({"merchant_id": [MERCHANT_MESSAGE]})
    if not merchant_access_allowed(user=request.user, merchant_id=merchant_id):
        return not_found("merchant_id")
    return None


class MerchantBalanceApi(ModuleApiView):
    def get(self, request, merchant_id):
        """The merchant's balance per currency: pending, posted, available, reserved and owed
        (version 2026-11-01: credits, reversals, re-credits, net, and the confirmed and returned
        counts)."""
        if (refused := merchant_refused(request, merchant_id)) is not None:
            return refused
        if request.version >= V2026_12_01:
            balance = merchant_balances(merchant_id=merchant_id)
            return Response(BalanceObjectOutputSerializer(balance).data)
        return Response(
            MerchantBalanceOutputSerializer(merchant_balance(merchant_id=merchant_id)).data
        )
