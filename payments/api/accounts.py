"""``/api/accounts/<token>/validation/`` and ``/api/accounts/<token>/verify/``: an account's
validation before its first WEB debit (``payments.services.validation``), its views, serializers
and schema side by side.

A validation is its merchant's alone: another merchant's token, a made-up one and a malformed
one are the same 404. ``POST .../validation/`` starts one (``merchant_id`` and ``method`` in the
body); ``GET`` reads it; ``POST .../verify/`` takes the micro-entries' amounts, which no answer,
log line or stored row ever repeats.
"""

from __future__ import annotations

import logging

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response

from payments.access import merchant_access_allowed
from payments.api.base import ModuleApiView, error_response, forbidden, not_found
from payments.api.errors import ApiError, field_errors
from payments.api.fields import MERCHANT_MESSAGE, MERCHANT_RE, StrictInputSerializer
from payments.api.schema import COMMON_ANSWERS, REQUEST_HEADERS, error_answer
from payments.exceptions import AmountsInvalid, ValidationRefused
from payments.kernel.bank_numbers import BANK_NUMBER_MESSAGE, looks_like_bank_number
from payments.models import AccountValidation, ValidationMethod
from payments.object_shapes import AccountValidationOutputSerializer
from payments.processor.backend import get_backend
from payments.services.create import _TOKEN_RE
from payments.services.validation import (
    account_validation_start,
    micro_entries_verify,
)

logger = logging.getLogger(__name__)

__all__ = ["AccountValidationApi", "AccountVerifyApi"]

TOKEN_PARAM = "account_token"


class AccountValidationStartInputSerializer(StrictInputSerializer):
    merchant_id = serializers.CharField(max_length=64)
    method = serializers.ChoiceField(choices=ValidationMethod.choices)

    def validate_merchant_id(self, value: str) -> str:
        if not MERCHANT_RE.fullmatch(value):
            raise serializers.ValidationError(MERCHANT_MESSAGE)
        return value


class AccountVerifyInputSerializer(StrictInputSerializer):
    # Read as it came and parsed by the service, which never repeats a value it refuses.
    amounts = serializers.JSONField(
        help_text="The one or two micro-entry credits the statement shows, as strings: "
        '["0.07", "0.32"], in any order.'
    )
    numeric_fields = ("amounts",)


_TOKEN = OpenApiParameter(
    TOKEN_PARAM,
    {"type": "string", "pattern": _TOKEN_RE.pattern},
    OpenApiParameter.PATH,
    description="The account's token (the vault's on the bank backend, else the "
    "processor's or the host's reference).",
)
_NOT_YOURS = error_answer("No validation of this token for a merchant you may act for.")


def _token_refused(token: str) -> Response | None:
    """400 for a bank number in the path (never logged), 404 for a malformed token."""
    if looks_like_bank_number(token):
        response = error_response(field_errors({TOKEN_PARAM: [BANK_NUMBER_MESSAGE]}))
        # Django's request log would write the path, and with it the number.
        response._has_been_logged = True
        logger.warning("Bad Request: a bank number in an account URL (not logged)")
        return response
    if not _TOKEN_RE.fullmatch(token):
        return not_found(TOKEN_PARAM)
    return None


def _validation_of_user(user, token: str) -> AccountValidation | None:
    validation = AccountValidation.objects.filter(account_token=token).first()
    if validation is None:
        return None
    if not merchant_access_allowed(user=user, merchant_id=validation.merchant_id):
        return None
    return validation


def _param(exc: ValidationRefused) -> str:
    return exc.param or TOKEN_PARAM


def _body(validation: AccountValidation) -> dict:
    return dict(AccountValidationOutputSerializer(validation).data)


class AccountValidationApi(ModuleApiView):
    """``GET`` the account's validation; ``POST`` starts one by ``method``."""

    @extend_schema(
        operation_id="account_validation_retrieve",
        parameters=[_TOKEN, *REQUEST_HEADERS],
        responses={
            200: OpenApiResponse(
                AccountValidationOutputSerializer, description="The account's validation."
            ),
            400: error_answer("A bank number in the path, or a refused Payments-Version."),
            404: _NOT_YOURS,
            **COMMON_ANSWERS,
        },
    )
    def get(self, request, account_token):
        """The account's validation: its state, method, tries left, expiry and evidence (never
        an amount or an account number); 404 for another merchant's token and a made-up one
        alike."""
        if (refused := _token_refused(account_token)) is not None:
            return refused
        validation = _validation_of_user(request.user, account_token)
        if validation is None:
            return not_found(TOKEN_PARAM)
        return Response(_body(validation))

    @extend_schema(
        operation_id="account_validation_start",
        request=AccountValidationStartInputSerializer,
        parameters=[_TOKEN, *REQUEST_HEADERS],
        responses={
            201: OpenApiResponse(
                AccountValidationOutputSerializer, description="Started: pending (or decided)."
            ),
            400: error_answer("What was refused, by field."),
            403: error_answer("You may not act for merchant_id."),
            404: error_answer("The token is not an account of merchant_id."),
            409: error_answer(
                "account_already_validated, account_validation_in_progress, or "
                "validation_method_unavailable (param method)."
            ),
            **COMMON_ANSWERS,
        },
    )
    def post(self, request, account_token):
        """Start validating the account by ``method`` (``prenote``, ``micro_entries`` or
        ``service``) for ``merchant_id``: pending, or decided at once by a service. Debits held
        for it are submitted once it is validated, failed when it fails."""
        if (refused := _token_refused(account_token)) is not None:
            return refused
        serializer = AccountValidationStartInputSerializer(data=request.data)
        if not serializer.is_valid():
            raise field_errors(serializer.errors)
        merchant_id = serializer.validated_data["merchant_id"]
        if not merchant_access_allowed(user=request.user, merchant_id=merchant_id):
            raise forbidden("merchant_id")
        # The backend's rule for its tokens: a vault token of another merchant is unknown here.
        if get_backend().source_token_refused(token=account_token, merchant_id=merchant_id):
            return not_found(TOKEN_PARAM)
        try:
            validation = account_validation_start(
                account_token=account_token,
                merchant_id=merchant_id,
                method=serializer.validated_data["method"],
            )
        except LookupError:
            return not_found(TOKEN_PARAM)
        except ValidationRefused as exc:
            # 409 naming the rule (payments.services.validation.RULES).
            return error_response(
                ApiError(
                    status.HTTP_409_CONFLICT,
                    exc.rule,
                    str(exc),
                    param=_param(exc),
                    errors={_param(exc): [str(exc)]},
                )
            )
        return Response(_body(validation), status=201)


class AccountVerifyApi(ModuleApiView):
    """``POST`` the micro-entries' amounts: 200 validated, 409 wrong (a try spent) or expired."""

    @extend_schema(
        operation_id="account_verify",
        request=AccountVerifyInputSerializer,
        parameters=[_TOKEN, *REQUEST_HEADERS],
        responses={
            200: OpenApiResponse(AccountValidationOutputSerializer, description="Validated."),
            400: error_answer("invalid_amounts: not one or two amounts 0.01-0.99."),
            404: _NOT_YOURS,
            409: error_answer(
                "micro_entries_mismatch (a try spent; the last fails the validation), "
                "micro_entries_expired, or validation_not_verifiable."
            ),
            **COMMON_ANSWERS,
        },
    )
    def post(self, request, account_token):
        """The micro-entries' amounts as the statement shows them, in any order: validated, or
        409 with a try spent (the last fails the validation); never repeated in an answer."""
        if (refused := _token_refused(account_token)) is not None:
            return refused
        validation = _validation_of_user(request.user, account_token)
        if validation is None:
            return not_found(TOKEN_PARAM)
        serializer = AccountVerifyInputSerializer(data=request.data)
        if not serializer.is_valid():
            raise field_errors(serializer.errors)
        try:
            validation = micro_entries_verify(
                account_token=account_token,
                merchant_id=validation.merchant_id,
                amounts=serializer.validated_data["amounts"],
            )
        except LookupError:
            return not_found(TOKEN_PARAM)
        except AmountsInvalid as exc:
            return error_response(
                ApiError(
                    400,
                    "invalid_amounts",
                    f"amounts: {exc}",
                    param="amounts",
                    errors={"amounts": [str(exc)]},
                )
            )
        except ValidationRefused as exc:
            # 409 naming the rule (payments.services.validation.RULES).
            return error_response(
                ApiError(
                    status.HTTP_409_CONFLICT,
                    exc.rule,
                    str(exc),
                    param=_param(exc),
                    errors={_param(exc): [str(exc)]},
                )
            )
        return Response(_body(validation))
