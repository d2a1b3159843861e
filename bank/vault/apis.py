"""``POST /api/vault/accounts/``: the one request of the API that may carry bank numbers.

Every other field of every other request refuses anything that looks like one; here the two
fields that hold them (``routing_number``, ``account_number``) take them, the vault seals them,
and the answer carries the token and the last 4 digits only. A refusal names the field and
never echoes it.

The ``Idempotency-Key`` works as on ``POST /api/payments/`` (``payments.idempotency``): a
retry with the key replays the first answer (``Idempotent-Replayed: true``) instead of minting
a second token for the account; another body under the key is 422, a key still in flight 409,
and a refusal is not stored. What the key keeps never holds a number: the stored answer is the
token and the last 4 digits, and the request's fingerprint is an HMAC of the body under the
host's ``SECRET_KEY``, so the few digits of an account cannot be found again by hashing guesses.
"""

import json
import logging

from django.core.exceptions import ImproperlyConfigured
from django.utils.crypto import salted_hmac
from rest_framework import serializers

from bank.vault.crypto import VaultUnavailable
from bank.vault.models import AccountType, SecCode
from bank.vault.services import VaultInputError, vault_account_store
from payments import idempotency
from payments.access import merchant_access_allowed
from payments.api.base import CreateApi, forbidden, refusal
from payments.api.errors import ApiError, field_errors
from payments.api.fields import (
    MERCHANT_MESSAGE,
    MERCHANT_RE,
    StrictCharField,
    StrictInputSerializer,
)

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


class VaultAccountCreateApi(CreateApi):
    """Store a bank account in the vault: its routing number's check digit and its account
    number's form are checked, both are sealed, and the answer is a ``vtok_`` token with the
    last 4 digits. With an ``Idempotency-Key`` header a retry answers the first token."""

    def key_request(self, data, parent) -> dict:
        return {"vault_account": vault_request_fingerprint(data)}

    def create_answer(self, request, data, parent) -> idempotency.Answer:
        return _vault_account_answer(request, data)


def vault_request_fingerprint(data: object) -> str:
    """The body's fingerprint for its Idempotency-Key: keyed, since a plain hash of a body
    whose other fields are known would let anyone holding the table try account numbers."""
    text = json.dumps(data, sort_keys=True, default=str)  # ASCII: escapes any surrogate
    return salted_hmac("bank.vault.idempotency", text, algorithm="sha256").hexdigest()


def _vault_account_answer(request, data) -> idempotency.Answer:
    """Validate and store; only a store that executed is what the key replays."""
    serializer = VaultAccountInputSerializer(data=data)
    if not serializer.is_valid():
        return refusal(field_errors(serializer.errors))
    values = serializer.validated_data
    if not merchant_access_allowed(user=request.user, merchant_id=values["merchant_id"]):
        return refusal(forbidden("merchant_id"))
    try:
        account = vault_account_store(**values)
    except VaultInputError as exc:
        return refusal(field_errors(exc.errors))
    except ImproperlyConfigured as exc:
        # The host has not given the vault its keys: nothing was stored; say which setting.
        logger.error("vault store refused: %s", exc)
        return refusal(ApiError(503, "vault_unconfigured", str(exc)))
    except VaultUnavailable as exc:
        # The key holder (KMS) cannot be asked: nothing was stored, and a retry may succeed.
        logger.error("vault store refused: %s", exc)
        return refusal(ApiError(503, "vault_unavailable", "the vault's key holder is unavailable"))
    return idempotency.Answer(201, dict(VaultAccountOutputSerializer(account).data))
