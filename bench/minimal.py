"""The ingest baseline: a minimal DRF view that validates a callback body and answers 202.

It checks the same fields as the product's contract (``callbacks.serializers``) with a plain DRF
serializer, and does nothing else: no signature check, no queue send. The gap between it and
``POST /callbacks/processor/`` is what the signature check, the schema parser and the SQS send
cost.
"""

from decimal import Decimal

from rest_framework import serializers, status
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from payments.catalogue import event_type_names


class CallbackBodySerializer(serializers.Serializer):
    payment_id = serializers.UUIDField()
    event_type = serializers.ChoiceField(choices=event_type_names())
    processor_event_id = serializers.RegexField(r"^[A-Za-z0-9._:-]{1,128}$")
    amount = serializers.DecimalField(max_digits=14, decimal_places=2, min_value=Decimal("0.01"))
    timestamp = serializers.DateTimeField()
    reason_code = serializers.CharField(max_length=64, required=False, allow_blank=True)
    message = serializers.CharField(max_length=1000, required=False, allow_blank=True)


class MinimalCallbackView(APIView):
    authentication_classes: list = []
    permission_classes = [AllowAny]

    def post(self, request):
        serializer = CallbackBodySerializer(data=request.data)
        if not serializer.is_valid():
            return Response({"errors": serializer.errors}, status=status.HTTP_400_BAD_REQUEST)
        return Response(
            {
                "status": "accepted",
                "processor_event_id": serializer.validated_data["processor_event_id"],
            },
            status=status.HTTP_202_ACCEPTED,
        )
