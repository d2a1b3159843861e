"""The shapes of events and webhook endpoints in the API, input and output."""

from rest_framework import serializers

from payments.api.fields import (
    StrictCharField,
    StrictInputSerializer,
    merchant_id_checked,
)
from payments.webhooks.catalogue import EVENT_TYPES
from payments.webhooks.models import Event, WebhookEndpoint


class EventTypesField(serializers.ListField):
    def __init__(self, **kwargs):
        super().__init__(
            child=StrictCharField(max_length=64), max_length=len(EVENT_TYPES), **kwargs
        )


class StrictBooleanField(serializers.BooleanField):
    """A JSON ``true`` or ``false``, not one of the strings and numbers DRF would take."""

    default_error_messages = {"invalid": "must be true or false"}

    def to_internal_value(self, data):
        if not isinstance(data, bool):
            self.fail("invalid")
        return data


class WebhookEndpointCreateInputSerializer(StrictInputSerializer):
    merchant_id = StrictCharField(max_length=64)
    # Longer text is refused by the URL check, with its own message (addresses.url_problem).
    url = StrictCharField(max_length=100_000, trim_whitespace=False)
    event_types = EventTypesField(required=False, default=list)
    description = StrictCharField(max_length=255, required=False, allow_blank=True, default="")
    thin = StrictBooleanField(required=False, default=False)
    ordered = StrictBooleanField(required=False, default=False)

    def validate_merchant_id(self, value: str) -> str:
        return merchant_id_checked(value)


class WebhookEndpointUpdateInputSerializer(StrictInputSerializer):
    url = StrictCharField(max_length=100_000, required=False, trim_whitespace=False)
    event_types = EventTypesField(required=False)
    description = StrictCharField(max_length=255, required=False, allow_blank=True)
    thin = StrictBooleanField(required=False)
    ordered = StrictBooleanField(required=False)


class WebhookEndpointOutputSerializer(serializers.ModelSerializer):
    object = serializers.SerializerMethodField()

    class Meta:
        model = WebhookEndpoint
        fields = [
            "id",
            "object",
            "merchant_id",
            "url",
            "description",
            "event_types",
            "thin",
            "ordered",
            "enabled",
            "disabled_at",
            "disabled_reason",
            "created_at",
        ]

    def get_object(self, endpoint) -> str:
        return "webhook_endpoint"


class EventListQuerySerializer(StrictInputSerializer):
    numeric_fields = ("limit", "after")

    merchant = StrictCharField(max_length=64, required=False)
    type = serializers.ChoiceField(choices=EVENT_TYPES, required=False)
    after = StrictCharField(max_length=40, required=False)
    limit = serializers.IntegerField(required=False, min_value=1, max_value=100)

    def validate_merchant(self, value: str) -> str:
        return merchant_id_checked(value)


class EventOutputSerializer(serializers.ModelSerializer):
    object = serializers.SerializerMethodField()

    class Meta:
        model = Event
        fields = ["id", "object", "type", "created_at", "merchant_id", "data"]

    def get_object(self, event) -> str:
        return "event"


class WebhookEndpointWithSecretOutputSerializer(WebhookEndpointOutputSerializer):
    """A new endpoint, or one whose secret was rotated: the only answers showing the secret."""

    secret = serializers.CharField(help_text="whsec_...; shown in this answer only")

    class Meta(WebhookEndpointOutputSerializer.Meta):
        fields = [*WebhookEndpointOutputSerializer.Meta.fields, "secret"]


class WebhookEndpointEnabledOutputSerializer(WebhookEndpointOutputSerializer):
    replayed = serializers.IntegerField(help_text="deliveries due again since it was disabled")

    class Meta(WebhookEndpointOutputSerializer.Meta):
        fields = [*WebhookEndpointOutputSerializer.Meta.fields, "replayed"]
