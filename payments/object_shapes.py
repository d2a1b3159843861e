"""The money movements as the API shows them (a debit, a refund, a payout), apart from the
API's input rules: the events of ``payments.webhooks`` carry them in these shapes, and
the API's resource modules (``payments.api``) answer with them."""

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from payments import conf as payments_conf
from payments.models import (
    SHOWN_PURPOSES,
    AccountValidation,
    DoubleLoss,
    DoubleLossStatus,
    Payment,
    PaymentPurpose,
    ValidationMethod,
    ValidationState,
)


def object_field(name: str) -> serializers.Field:
    """The ``object`` every answer carries: what kind of thing it is, one word, fixed by its
    serializer (Stripe's convention), so a client reading a list or an event knows the shape."""

    @extend_schema_field({"type": "string", "pattern": f"^{name}$", "example": name})
    class ObjectField(serializers.Field):
        def __init__(self):
            super().__init__(source="*", read_only=True)

        def to_representation(self, value):
            return name

    return ObjectField()


class PaymentOutputSerializer(serializers.ModelSerializer):
    object = object_field("payment")
    # The purposes a merchant is shown (never an account validation's micro-entry).
    purpose = serializers.ChoiceField(
        choices=[(p, PaymentPurpose(p).label) for p in SHOWN_PURPOSES], read_only=True
    )

    class Meta:
        model = Payment
        fields = [
            "id",
            "object",
            "state",
            "idempotency_key",
            "merchant_id",
            "amount",
            "currency",
            "description",
            "processor_id",
            "metadata",
            "created_at",
            "updated_at",
            "direction",
            "purpose",
            "sec_code",
            "entry_description",
        ]


class DoubleLossOutputSerializer(serializers.Serializer):
    """A double loss as the merchant sees it: the refund's amount it has twice lost, whether it
    is still to recover, and when it was found."""

    amount = serializers.DecimalField(max_digits=14, decimal_places=2)
    currency = serializers.CharField()
    status = serializers.ChoiceField(choices=DoubleLossStatus.choices)
    detected_at = serializers.DateTimeField()


class RefundOutputSerializer(serializers.ModelSerializer):
    """A refund: an ACH credit of (part of) a collected debit, with its own idempotency key.
    One shape wherever it appears: nested in its debit, created, read or listed."""

    object = object_field("refund")
    payment_id = serializers.UUIDField(source="refund_of_id", read_only=True)
    reason = serializers.CharField(source="description", read_only=True)
    double_loss = serializers.SerializerMethodField()

    class Meta:
        model = Payment
        fields = [
            "id",
            "object",
            "payment_id",
            "merchant_id",
            "amount",
            "currency",
            "state",
            "idempotency_key",
            "reason",
            "metadata",
            "double_loss",
            "created_at",
            "updated_at",
            "sec_code",
            "entry_description",
        ]

    @extend_schema_field(DoubleLossOutputSerializer(allow_null=True))
    def get_double_loss(self, refund: Payment) -> dict | None:
        """The double loss this refund made when its debit came back after it, else None (read
        with the refund where the query selected it). A refund its own request just created
        has none yet (``context["created"]``): only a later return makes one."""
        if self.context.get("created"):
            return None
        try:
            loss = refund.double_loss
        except DoubleLoss.DoesNotExist:
            return None
        return DoubleLossOutputSerializer(loss).data


class DestinationOutputSerializer(serializers.Serializer):
    """Where a payout goes: its token and, where the backend knows them, the account's last
    four digits; never more of the account."""

    token = serializers.CharField()
    last4 = serializers.CharField(allow_null=True)


class PayoutOutputSerializer(serializers.ModelSerializer):
    """A payout: an ACH credit of a merchant's available balance to its own account. The
    account's last four digits come from ``context["last4"]`` (token to digits), which the view
    reads from the backend for a whole page at once."""

    object = object_field("payout")
    destination = serializers.SerializerMethodField()

    class Meta:
        model = Payment
        fields = [
            "id",
            "object",
            "merchant_id",
            "amount",
            "currency",
            "state",
            "idempotency_key",
            "description",
            "destination",
            "metadata",
            "created_at",
            "updated_at",
            "sec_code",
            "entry_description",
        ]

    @extend_schema_field(DestinationOutputSerializer)
    def get_destination(self, payout: Payment) -> dict:
        last4 = self.context.get("last4", {}).get(payout.source_token)
        return {"token": payout.source_token, "last4": last4}


class AccountValidationOutputSerializer(serializers.ModelSerializer):
    """An account's validation as its merchant reads it (``GET /api/accounts/<token>/validation/``)
    and as the ``account_validation.*`` events carry it: never the micro-entries' amounts (the
    row keeps only their digest, which is not shown)."""

    id = serializers.CharField(read_only=True)
    object = object_field("account_validation")
    attempts_left = serializers.SerializerMethodField()

    class Meta:
        model = AccountValidation
        fields = [
            "id",
            "object",
            "account_token",
            "merchant_id",
            "state",
            "method",
            "attempts",
            "attempts_left",
            "expires_at",
            "live_from",
            "failure_reason",
            "evidence",
            "started_at",
            "validated_at",
            "failed_at",
            "created_at",
            "updated_at",
        ]

    def get_attempts_left(self, obj) -> int | None:
        """Tries left at the micro-entries' amounts; null for another method."""
        if obj.method != ValidationMethod.MICRO_ENTRIES:
            return None
        if obj.state != ValidationState.PENDING:
            return 0
        return max(payments_conf.MICRO_ENTRY_MAX_ATTEMPTS - obj.attempts, 0)
