"""``POST /api/vault/accounts/``: the one request of the API that may carry bank numbers.

Every other field of every other request refuses anything that looks like one; here the two
fields that hold them (``routing_number``, ``account_number``) take them, the vault seals them,
and the answer carries the token and the last 4 digits only. A refusal names the field and
never echoes it. There is no Idempotency-Key: a retried store mints a second token for the
same account, which costs nothing and moves no money.
"""

import logging

from django.core.exceptions import ImproperlyConfigured
from rest_framework import serializers
from rest_framework.response import Response

from payments.access import merchant_access_allowed
from payments.api_errors import ApiError, field_errors
from payments.apis import ModuleApiView, _error_response, _forbidden
from payments.serializers import (
    MERCHANT_MESSAGE,
    MERCHANT_RE,
    StrictCharField,
    StrictInputSerializer,
)
from payments.vault.models import AccountType, SecCode
from payments.vault.services import VaultInputError, vault_account_store

logger = logging.getLogger(__name__)


class VaultAccountInputSerializer(StrictInputSerializer):
    numeric_fields = ("routing_number", "account_number")

    merchant_id = StrictCharField(max_length=64)
    routing_number = StrictCharField(max_length=32, trim_whitespace=False)
    account_number = StrictCharField(max_length=32, trim_whitespace=False)
    account_type = serializers.ChoiceField(choices=AccountType.values)
    sec_code = serializers.ChoiceField(choices=SecCode.values)
    holder_name = StrictCharField(max_length=64)

    def validate_merchant_id(self, value: str) -> str:
        if not MERCHANT_RE.fullmatch(value):
            raise serializers.ValidationError(MERCHANT_MESSAGE)
        return value


class VaultAccountOutputSerializer(serializers.Serializer):
    token = serializers.CharField(help_text="The source_token payments of this account carry.")
    merchant_id = serializers.CharField()
    account_type = serializers.ChoiceField(choices=AccountType.values)
    sec_code = serializers.ChoiceField(choices=SecCode.values)
    account_last4 = serializers.CharField(help_text="The only digits of the account ever shown.")
    key_version = serializers.CharField()
    created_at = serializers.DateTimeField()


class VaultAccountCreateApi(ModuleApiView):
    def post(self, request):
        serializer = VaultAccountInputSerializer(data=request.data)
        if not serializer.is_valid():
            return _error_response(field_errors(serializer.errors))
        data = serializer.validated_data
        if not merchant_access_allowed(user=request.user, merchant_id=data["merchant_id"]):
            return _error_response(_forbidden("merchant_id"))
        try:
            account = vault_account_store(**data)
        except VaultInputError as exc:
            return _error_response(field_errors(exc.errors))
        except ImproperlyConfigured as exc:
            # The host has not given the vault its keys: nothing was stored; say which setting.
            logger.error("vault store refused: %s", exc)
            return _error_response(ApiError(503, "vault_unconfigured", str(exc)))
        return Response(VaultAccountOutputSerializer(account).data, status=201)
