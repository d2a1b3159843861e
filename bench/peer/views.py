"""The peer's callback view: the processor's signature checked, the body validated by a DRF
serializer, one Celery task published per callback, 202."""

from rest_framework import status
from rest_framework.parsers import JSONParser
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from bench.minimal import CallbackBodySerializer
from bench.peer.tasks import apply_processor_event
from callbacks import conf as callbacks_conf
from payments import signing


class CeleryCallbackView(APIView):
    authentication_classes: list = []
    permission_classes = [AllowAny]
    parser_classes = [JSONParser]

    def post(self, request):
        try:
            signing.verify(
                request.headers.get(signing.HEADER),
                request.body,
                callbacks_conf.CALLBACK_SIGNING_SECRETS,
            )
        except signing.SignatureError as exc:
            return Response({"errors": {"signature": [str(exc)]}}, status=401)
        serializer = CallbackBodySerializer(data=request.data)
        if not serializer.is_valid():
            return Response({"errors": serializer.errors}, status=status.HTTP_400_BAD_REQUEST)
        # The event as the processor sent it (JSON types), for the task's arguments.
        event = {k: request.data[k] for k in serializer.validated_data}
        apply_processor_event.delay(event)
        return Response(
            {"status": "accepted", "processor_event_id": event["processor_event_id"]},
            status=status.HTTP_202_ACCEPTED,
        )
