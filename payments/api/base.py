"""The two bases every view of the payments API stands on, and the tenancy they share.

``ModuleApiView`` pins every DRF policy a view relies on (authentication, permission, parser,
renderer, content negotiation, versioning, throttle, metadata, schema, exception handling; a
list its own pagination), so a host project's ``REST_FRAMEWORK`` defaults (``IsAdminUser``, a
JWT class, ``URLPathVersioning``, a custom pagination or error format) change nothing here.
Every error is the envelope of ``payments.api.errors`` and every answer carries ``Request-Id``.

On it, one base for a create (``CreateApi``: the ``Idempotency-Key`` draft's replay, 422 and
409, and a refusal that stores nothing) and one for reads (``ReadApi``: one object by its id,
or a page of them after the strict cursor, under the list's filters). Each user acts only for
the merchants the access policy grants it (``payments.access``): another merchant's object
answers 404, as if it did not exist; creating or listing for it answers 403 naming the
merchant.
"""

import base64
import logging
import threading
import uuid
from datetime import UTC
from urllib import parse

from django.core.exceptions import ValidationError as DjangoValidationError
from django.utils.cache import patch_vary_headers
from drf_spectacular.openapi import AutoSchema
from rest_framework import serializers, status
from rest_framework.authentication import SessionAuthentication
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
from payments.api.authentication import TokenAuthentication
from payments.api.errors import ApiError, ErrorType, ModuleErrorsMixin, field_errors, request_id_of
from payments.api.fields import (
    MERCHANT_MESSAGE,
    MERCHANT_RE,
    StrictCharField,
    StrictInputSerializer,
)
from payments.api_access_classes import authentication_classes, permission_classes
from payments.api_throttling import ModuleScopedThrottle
from payments.api_versions import VERSION_HEADER, error_for_version, requested_version, version_of
from payments.exceptions import ExposureLimitExceeded
from payments.http_limits import read_body_limited
from payments.kernel import propagation
from payments.kernel.reads import PreparedRead, querysets_read
from payments.models import SHOWN_PURPOSES, Payment, PaymentDirection, PaymentState
from payments.object_shapes import PaymentOutputSerializer
from payments.selectors import payment_get
from payments.services import BANK_NUMBER_MESSAGE, looks_like_bank_number
from payments.strictjson import StrictJSONParser

logger = logging.getLogger(__name__)


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


_shapers = threading.local()


def shaped(serializer_class: type[serializers.Serializer], instance, context=None) -> dict:
    """``serializer_class(instance, context=context).data``, as a dict, from one serializer
    per class and thread: a model serializer builds its fields from the model anew for each
    serializer made (a tenth of a create's CPU), and the fields keep nothing of an object they
    showed. Only the context changes between calls (DRF's fields read it from their root)."""
    made = _shapers.__dict__.setdefault("made", {})
    serializer = made.get(serializer_class)
    if serializer is None:
        serializer = made[serializer_class] = serializer_class()
    serializer._context = context or {}
    try:
        return dict(serializer.to_representation(instance))
    finally:
        serializer._context = {}


_checkers = threading.local()


def body_checked(
    serializer_class: type[serializers.Serializer], data
) -> tuple[dict | None, dict | None]:
    """``serializer_class(data=data)``'s validated data and errors, one of them None, from one
    serializer per class and thread: a serializer deep-copies its declared fields and binds the
    copies to itself for each one made (a twentieth of a create's CPU), and its fields keep
    nothing of a body they read. Nothing of the body is left on it after the call."""
    made = _checkers.__dict__.setdefault("made", {})
    serializer = made.get(serializer_class)
    if serializer is None:
        serializer = made[serializer_class] = serializer_class(data=None)
    serializer.initial_data = data
    try:
        if serializer.is_valid():
            return serializer.validated_data, None
        return None, dict(serializer.errors)
    finally:
        for name in ("initial_data", "_validated_data", "_errors", "_data"):
            serializer.__dict__.pop(name, None)


def created_shaped(serializer_class: type[serializers.Serializer], payment, context=None) -> dict:
    """A new payment as ``shaped`` shows it: the object its merchant's event carries, made by
    the same serializer with the same context as the create wrote it
    (``payments.webhooks.events.payment_shape``), else rendered here."""
    shape = getattr(payment, "created_shape", None)
    if shape is not None:
        return dict(shape)
    return shaped(serializer_class, payment, context)


def error_response(error: ApiError) -> Response:
    """``error`` answered rather than raised (a view's early return)."""
    return Response(error.body(), status=error.status_code)


def not_found(param: str) -> Response:
    """404 naming the path parameter: an unknown id and another merchant's answer alike."""
    message = f"no such {param.removesuffix('_id')}"
    return error_response(
        ApiError(404, "resource_missing", message, param=param, errors={param: [message]})
    )


def forbidden(param: str) -> ApiError:
    """403 naming the merchant the caller is not granted (a create's, a list's filter)."""
    return ApiError(
        status.HTTP_403_FORBIDDEN,
        "merchant_forbidden",
        "you are not granted access to this merchant",
        param=param,
        errors={param: ["you are not granted access to this merchant"]},
    )


def merchant_refused(request, merchant_id: str) -> Response | None:
    """The answer for a merchant id the caller may not read (400 for a bad one, 404 for one it
    may not act for, the same as one that does not exist), or None."""
    if looks_like_bank_number(merchant_id):
        response = error_response(field_errors({"merchant_id": [BANK_NUMBER_MESSAGE]}))
        # Django's request log would write the path, and with it the number.
        response._has_been_logged = True
        logger.warning("Bad Request: a bank number in a merchant URL (not logged)")
        return response
    if not MERCHANT_RE.fullmatch(merchant_id):
        raise field_errors({"merchant_id": [MERCHANT_MESSAGE]})
    if not merchant_access_allowed(user=request.user, merchant_id=merchant_id):
        return not_found("merchant_id")
    return None


def payment_of_user(user, payment_id: str) -> Payment | None:
    """The payment ``payment_id`` names if ``user`` may act for its merchant, else None: an id
    that is not a UUID, an unknown one and another merchant's are all answered alike (404), so
    no existence leaks. Any text in the path, so a malformed id gets this API's 404, not the
    host's page."""
    try:
        payment = payment_get(payment_id=uuid.UUID(payment_id))
    except (ValueError, Payment.DoesNotExist):
        return None
    if payment.purpose not in SHOWN_PURPOSES:
        return None
    if not merchant_access_allowed(user=user, merchant_id=payment.merchant_id):
        return None
    return payment


# --- Create with an Idempotency-Key -----------------------------------------------------------


def idempotency_key_header(request) -> str | None:
    """The request's ``Idempotency-Key`` (None without one); 400 for one of the wrong size."""
    key = request.headers.get("Idempotency-Key")
    if key is not None and not 1 <= len(key) <= 255:
        raise field_errors({"Idempotency-Key": ["must be 1-255 characters"]})
    return key


def carried(request) -> dict[str, str]:
    """What a money movement made by ``request`` carries to the worker: its request id and
    trace."""
    return propagation.outgoing_values(request_id=request_id_of(request), headers=request.headers)


def refusal(error: ApiError) -> idempotency.Answer:
    """A refusal before the request began to execute: not stored under the key, so the client's
    corrected (or, once granted, the same) request with the key executes."""
    return idempotency.Answer(error.status_code, error.body(), store=False)


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


def idempotent_response(result: idempotency.IdempotentResult) -> Response:
    """The answer of a create run under its key: the stored first answer again (marked
    ``Idempotent-Replayed``), 422 for the key used with another body, 409 while it runs."""
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
        response = error_response(
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


def _payment_in_path_queryset(*, payment_id: uuid.UUID):
    return (
        Payment.objects.filter(pk=payment_id, purpose__in=SHOWN_PURPOSES)
        .order_by()
        .only("id", "merchant_id", "purpose")[:1]
    )


# Compiled once per process (``payments.kernel.reads``): each request gives it the path's id.
_PAYMENT_IN_PATH = PreparedRead(_payment_in_path_queryset, uuid_slots=("payment_id",))


def payment_in_path(request, payment_id: str) -> Payment | Response:
    """The payment an action names in its path (``payments/<id>/refunds/``), read for its
    merchant only; 404 for a malformed id, an unknown one and another merchant's alike."""
    try:
        read = _PAYMENT_IN_PATH.read(payment_id=uuid.UUID(payment_id))
    except ValueError:
        return not_found("payment_id")
    [found] = querysets_read([read])
    if not found:
        return not_found("payment_id")
    payment = found[0]
    if not merchant_access_allowed(user=request.user, merchant_id=payment.merchant_id):
        return not_found("payment_id")
    return payment


class CreateApi(ModuleApiView):
    """``POST``: one object made by one service, with an optional ``Idempotency-Key`` (the IETF
    draft): the same key and body replay the first answer, another body answers 422, and a
    request still running with the key answers 409. A subclass states ``create_answer`` (read
    the body, call its service, answer); an object made from a payment in the path states
    ``parent_of`` too, and the key's request is then that payment and the body."""

    # What the key's fingerprint names besides the body ("refund", "payout"); None for the body
    # alone (a payment's create, the first to take a key: its stored keys keep matching).
    key_scope: str | None = None

    def post(self, request, **path):
        parent = self.parent_of(request, **path)
        if isinstance(parent, Response):
            return parent
        data = request.data
        key = idempotency_key_header(request)
        result = idempotency.idempotency_key_run(
            user=request.user,
            key=key,
            request_data=self.key_request(data, parent),
            work=lambda: self.create_answer(request, data, parent),
        )
        return idempotent_response(result)

    def parent_of(self, request, **path) -> Payment | Response | None:
        """The object the path names that this one is made from (None: none)."""
        return None

    def key_request(self, data, parent: Payment | None):
        """What the key remembers of the request, to tell the same request from another."""
        if self.key_scope is None:
            return data
        if parent is None:
            return {self.key_scope: data}
        return {self.key_scope: str(parent.id), "body": data}

    def create_answer(self, request, data, parent: Payment | None) -> idempotency.Answer:
        """Validate ``data`` and create: a refusal with ``refusal`` (not stored under the key),
        the created object as the answer the key replays."""
        raise NotImplementedError


# --- The strict cursor -----------------------------------------------------------------------


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


# --- Retrieve and list, for the caller's merchants --------------------------------------------


class PaymentListQuerySerializer(StrictInputSerializer):
    """The query of a list (``GET /api/payments/``, refunds, payouts): each filter once, each
    refused by name."""

    # Dates and the opaque cursor hold digit groups that are not bank numbers.
    numeric_fields = ("created_gte", "created_lt", "limit", "cursor")

    merchant = StrictCharField(max_length=64, required=False)
    state = serializers.ChoiceField(choices=PaymentState.values, required=False)
    direction = serializers.ChoiceField(choices=PaymentDirection.values, required=False)
    purpose = serializers.ChoiceField(choices=SHOWN_PURPOSES, required=False)
    # ISO-8601; without an offset, UTC (never the host's TIME_ZONE, which a client cannot see).
    created_gte = serializers.DateTimeField(required=False, default_timezone=UTC)
    created_lt = serializers.DateTimeField(required=False, default_timezone=UTC)
    limit = serializers.IntegerField(required=False, min_value=1, max_value=100)
    cursor = StrictCharField(max_length=512, required=False)

    def validate_merchant(self, value: str) -> str:
        if not MERCHANT_RE.fullmatch(value):
            raise serializers.ValidationError(MERCHANT_MESSAGE)
        return value

    def validate(self, attrs):
        low, high = attrs.get("created_gte"), attrs.get("created_lt")
        if low is not None and high is not None and low >= high:
            raise serializers.ValidationError({"created_lt": ["must be after created_gte"]})
        return attrs


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
            raise forbidden("merchant")
        merchants = [merchant]
    else:
        merchants = merchants_listed(user=user)
        if merchants is None:
            raise field_errors(
                {"merchant": ["required: the merchant access policy cannot list your merchants"]}
            )
    payments = payments.filter(merchant_id__in=merchants, purpose__in=SHOWN_PURPOSES)
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


class ReadApi(ModuleApiView):
    """``GET`` one money movement by its id (``retrieve``) or a page of them (``list_page``),
    only ever of the merchants the caller may act for: another merchant's, an unknown id and a
    malformed one are the same 404, and a list never reads a merchant the caller may not act
    for. A subclass names what it reads (``purpose``), the path parameter of its id, and its
    answer's serializer."""

    purpose: str | None = None  # a PaymentPurpose; None: any money movement
    id_param = "payment_id"
    output_serializer: type[serializers.Serializer] = PaymentOutputSerializer

    def retrieve(self, request, object_id: str) -> Response:
        found = payment_of_user(request.user, object_id)
        if found is None or (self.purpose is not None and found.purpose != self.purpose):
            return not_found(self.id_param)
        return Response(self.represent(found))

    def list_page(self, request, payments=None, query: dict | None = None) -> Response:
        """A page of ``payments`` (every one, by default) under the request's query: newest
        first, after the cursor, in the list shape."""
        if query is None:
            query = query_checked(request)
        if payments is None:
            payments = Payment.objects.all()
        listed = payments_listed(request.user, query, payments, self.purpose)
        paginator = PaymentPagination()
        page = paginator.paginate_queryset(listed, request, view=self)
        data = self.output_serializer(page, many=True, context=self.context_of(page)).data
        return paginator.get_paginated_response(data)

    def represent(self, found: Payment) -> dict:
        """One object as its retrieve answers it."""
        return shaped(self.output_serializer, found, self.context_of([found]))

    def context_of(self, objects) -> dict:
        """The serializer's context for ``objects`` (what one read per page fetches)."""
        return {}
