"""A merchant's balance: ``GET /api/merchants/<merchant_id>/balance/``, its view, serializers
and schema. From version 2026-12-01 a balance object (pending, posted, available, reserved and
owed per currency, ``payments.selectors.merchant_balances``); in 2026-11-01 credits, reversals,
net and counts. Another merchant's id answers 404, as if it did not exist."""

from drf_spectacular.utils import OpenApiResponse, PolymorphicProxySerializer, extend_schema
from rest_framework import serializers
from rest_framework.response import Response

from payments.api.base import ModuleApiView, merchant_refused
from payments.api.schema import COMMON_ANSWERS, REQUEST_HEADERS, error_answer
from payments.api_versions import V2026_12_01
from payments.object_shapes import object_field
from payments.selectors import merchant_balance, merchant_balances


class CurrencyBalanceOutputSerializer(serializers.Serializer):
    """One currency of a merchant's balance, in the words of Stripe and Modern Treasury
    (``payments.selectors.merchant_balances``); each help text is the figure's one definition,
    which the generated API reference shows."""

    currency = serializers.CharField(help_text="ISO 4217 code of the figures below.")
    pending = serializers.CharField(
        help_text="Money in flight, not yet settled: refunds and payouts made and not yet "
        "settled, failed or canceled, as a negative amount (money leaving). A debit enters the "
        "balance when it settles."
    )
    posted = serializers.CharField(
        help_text="Money settled: debits collected, less their returns (and plus the re-credits "
        "of dishonored returns), less refunds and payouts settled, plus money out that came "
        "back and double losses recovered."
    )
    available = serializers.CharField(
        help_text="What may be paid out now: posted money of debits past the return reserve "
        "(PAYMENTS AVAILABLE_AFTER_BANKING_DAYS banking days after settling), less money out "
        "pending or posted, plus money out that came back and double losses recovered. It may "
        "be negative (a return after a payout); shown as it is."
    )
    reserved = serializers.CharField(
        help_text="Posted money of debits still inside the return reserve: available once the "
        "reserve ends, unless the debit is returned. available + reserved = posted + pending."
    )
    owed = serializers.CharField(
        help_text="Double losses not recovered: refunds sent whose debits then came back, which "
        "the merchant is owed and recovers outside ACH; counted in no other figure until "
        "recovered (then in posted and available) or written off (then nowhere)."
    )


class BalanceObjectOutputSerializer(serializers.Serializer):
    """``GET /api/merchants/<id>/balance/`` from version 2026-12-01."""

    object = object_field("balance")
    merchant_id = serializers.CharField()
    balances = CurrencyBalanceOutputSerializer(many=True)


class BalanceOutputSerializer(serializers.Serializer):
    """Version 2026-11-01's balance of one currency: credits from confirmations, reversals from
    returns after settlement, the net of the two, and the payments behind them."""

    currency = serializers.CharField()
    credits = serializers.CharField()
    reversals = serializers.CharField()
    # Dishonored returns: their re-credits, less the ones a contest reversed again.
    recredits = serializers.CharField()
    net = serializers.CharField()
    confirmed_count = serializers.IntegerField()
    returned_count = serializers.IntegerField()
    returned_total = serializers.CharField()
    # Kept from the first version of this answer: ``balance`` equals ``net``.
    balance = serializers.CharField()
    entries = serializers.IntegerField()
    confirmed_total = serializers.CharField()
    # From every entry, money out included (``payments.selectors.merchant_money_figures``):
    # pending (all that has not failed), posted (moved), available (may be paid out now; may
    # be negative, shown as it is), and the refunds and payouts not failed less their returns.
    pending = serializers.CharField()
    posted = serializers.CharField()
    available = serializers.CharField()
    money_out = serializers.CharField()


class MerchantBalanceOutputSerializer(serializers.Serializer):
    """``GET /api/merchants/<id>/balance/`` in version 2026-11-01."""

    merchant_id = serializers.CharField()
    balances = BalanceOutputSerializer(many=True)


class MerchantBalanceApi(ModuleApiView):
    @extend_schema(
        operation_id="merchant_balance",
        parameters=REQUEST_HEADERS,
        responses={
            200: OpenApiResponse(
                PolymorphicProxySerializer(
                    component_name="MerchantBalanceOfVersion",
                    serializers=[BalanceObjectOutputSerializer, MerchantBalanceOutputSerializer],
                    resource_type_field_name=None,
                ),
                description="From 2026-12-01, a balance object: per currency pending, "
                "posted, available, reserved and owed. In 2026-11-01, per currency: credits, "
                "reversals, net and counts.",
            ),
            400: error_answer("The merchant id is not of the accepted form."),
            404: error_answer("A merchant you may not act for."),
            **COMMON_ANSWERS,
        },
    )
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
