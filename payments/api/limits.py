"""``GET /api/merchants/<merchant_id>/limits/``: a merchant's exposure limits and what is left
of them today (``payments.services.limits``), for each direction and currency: its view,
serializers and schema. Another merchant's id answers 404, as its balance does."""

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.response import Response

from payments.api.base import ModuleApiView, merchant_refused
from payments.api.schema import COMMON_ANSWERS, REQUEST_HEADERS, error_answer
from payments.services.create import SUPPORTED_CURRENCIES
from payments.services.limits import Exposure, merchant_exposure


def _amount(value) -> str | None:
    return None if value is None else f"{value:.2f}"


class ExposureOutputSerializer(serializers.Serializer):
    direction = serializers.CharField(help_text="debit (collections) or credit (refunds, payouts)")
    currency = serializers.CharField()
    source = serializers.ChoiceField(
        choices=["merchant", "default"],
        help_text="The merchant's own limits, or the module's default.",
    )
    single_limit = serializers.CharField(allow_null=True, help_text="Largest one entry may be.")
    daily_limit = serializers.CharField(allow_null=True)
    window_limit = serializers.CharField(allow_null=True)
    window_banking_days = serializers.IntegerField(allow_null=True)
    banking_day = serializers.DateField(help_text="Today's effective banking day.")
    used_today = serializers.CharField()
    remaining_today = serializers.CharField(allow_null=True, help_text="Null: no daily limit.")
    used_window = serializers.CharField(allow_null=True)
    remaining_window = serializers.CharField(allow_null=True)

    def to_representation(self, instance: Exposure) -> dict:
        limits = instance.limits
        return {
            "direction": instance.direction,
            "currency": instance.currency,
            "source": instance.source,
            "single_limit": _amount(limits.single),
            "daily_limit": _amount(limits.daily),
            "window_limit": _amount(limits.window),
            "window_banking_days": limits.window_banking_days,
            "banking_day": instance.banking_day.isoformat(),
            "used_today": _amount(instance.used_today),
            "remaining_today": _amount(instance.remaining_today),
            "used_window": _amount(instance.used_window),
            "remaining_window": _amount(instance.remaining_window),
        }


class MerchantLimitsOutputSerializer(serializers.Serializer):
    object = serializers.CharField(default="exposure_limits")
    merchant_id = serializers.CharField()
    limits = ExposureOutputSerializer(many=True)


class MerchantLimitsApi(ModuleApiView):
    @extend_schema(
        operation_id="merchant_limits",
        parameters=REQUEST_HEADERS,
        responses={
            200: OpenApiResponse(
                MerchantLimitsOutputSerializer,
                description="Per direction and currency: the exposure limits, what counts "
                "today and what is left.",
            ),
            400: error_answer("The merchant id is not of the accepted form."),
            404: error_answer("A merchant you may not act for."),
            **COMMON_ANSWERS,
        },
    )
    def get(self, request, merchant_id):
        """The merchant's exposure limits per direction and currency, and what is left today."""
        if (refused := merchant_refused(request, merchant_id)) is not None:
            return refused
        exposure = merchant_exposure(merchant_id=merchant_id, currencies=SUPPORTED_CURRENCIES)
        return Response(
            MerchantLimitsOutputSerializer(
                {"object": "exposure_limits", "merchant_id": merchant_id, "limits": exposure}
            ).data
        )
