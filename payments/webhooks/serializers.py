"""The shapes of events and webhook endpoints in the API, input and output."""

from rest_framework import serializers

from payments.api.fields import (
    StrictCharField,
    StrictInputSerializer,
    merchant_id_checked,
)
from payments.api_versions import FIRST, VERSIONS
from payments.webhooks.catalogue import EVENT_TYPES
from payments.webhooks.models import Event, WebhookEndpoint
from payments.webhooks.versions import event_shape

API_VERSION_HELP = (
    "the API version its events are rendered in: one of "
    + ", ".join(VERSIONS)
    + " (without it, the request's Payments-Version, else the host's pin)"
)


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
    # A version is a date, its digits not a bank number's; the version check never echoes a
    # long run of digits.
    numeric_fields = ("api_version",)

    merchant_id = StrictCharField(max_length=64)
    # Longer text is refused by the URL check, with its own message (addresses.url_problem).
    url = StrictCharField(max_length=100_000, trim_whitespace=False)
    event_types = EventTypesField(required=False, default=list)
    description = StrictCharField(max_length=255, required=False, allow_blank=True, default="")
    thin = StrictBooleanField(required=False, default=False)
    ordered = StrictBooleanField(required=False, default=False)
    # Any text: the version check refuses what is not a version, describing it, not echoing it.
    api_version = StrictCharField(
        max_length=10_000,
        required=False,
        allow_blank=True,
        trim_whitespace=False,
        help_text=API_VERSION_HELP,
    )

    def validate_merchant_id(self, value: str) -> str:
        return merchant_id_checked(value)


class WebhookEndpointUpdateInputSerializer(StrictInputSerializer):
    numeric_fields = ("api_version",)

    url = StrictCharField(max_length=100_000, required=False, trim_whitespace=False)
    event_types = EventTypesField(required=False)
    description = StrictCharField(max_length=255, required=False, allow_blank=True)
    thin = StrictBooleanField(required=False)
    ordered = StrictBooleanField(required=False)
    # Any text: the version check refuses what is not a version, describing it, not echoing it.
    api_version = StrictCharField(
        max_length=10_000,
        required=False,
        allow_blank=True,
        trim_whitespace=False,
        help_text=API_VERSION_HELP,
    )


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
            "api_version",
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
    """An event as the events list shows it, in ``context["version"]``
    (``payments.webhooks.versions``): from 2026-12-01 the shape a delivery carries."""

    object = serializers.SerializerMethodField()
    api_version = serializers.ChoiceField(
        choices=VERSIONS,
        required=False,
        help_text="the version data.object is rendered in (from 2026-12-01)",
    )

    class Meta:
        model = Event
        fields = ["id", "object", "api_version", "type", "created_at", "merchant_id", "data"]

    def get_object(self, event) -> str:
        return "event"

    def to_representation(self, event):
        version = self.context["version"]
        shape = event_shape(event, version, listed=True)
        if version != FIRST:
            return shape
        # The first version's answer as it was before versions, its time in DRF's format.
        # (``api_version`` is skipped: an event has no such attribute.)
        return {**super().to_representation(event), "data": shape["data"]}


class WebhookEndpointWithSecretOutputSerializer(WebhookEndpointOutputSerializer):
    """A new endpoint, or one whose secret was rotated: the only answers showing the secret."""

    secret = serializers.CharField(help_text="whsec_...; shown in this answer only")

    class Meta(WebhookEndpointOutputSerializer.Meta):
        fields = [*WebhookEndpointOutputSerializer.Meta.fields, "secret"]


class WebhookEndpointEnabledOutputSerializer(WebhookEndpointOutputSerializer):
    replayed = serializers.IntegerField(help_text="deliveries due again since it was disabled")

    class Meta(WebhookEndpointOutputSerializer.Meta):
        fields = [*WebhookEndpointOutputSerializer.Meta.fields, "replayed"]
