"""The schema of ``/api/events/`` and ``/api/webhook_endpoints/`` (drf-spectacular), in the
payments API's conventions (``payments.api.schema``). Called by ``PaymentsConfig.ready``."""

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    PolymorphicProxySerializer,
    extend_schema,
    extend_schema_view,
    inline_serializer,
)
from rest_framework import serializers as drf_serializers

from payments.api.schema import (
    COMMON_ANSWERS,
    MERCHANT_PATTERN,
    REQUEST_HEADERS,
    error_answer,
    list_of,
)
from payments.webhooks import apis, serializers
from payments.webhooks.catalogue import EVENT_TYPES


def _of_version(name: str, latest, first) -> PolymorphicProxySerializer:
    """An answer whose shape the version chooses: the latest's, or 2026-11-01's."""
    return PolymorphicProxySerializer(
        component_name=name, serializers=[latest, first], resource_type_field_name=None
    )


def describe() -> None:
    endpoint_id = OpenApiParameter("endpoint_id", OpenApiTypes.UUID, OpenApiParameter.PATH)
    merchant = OpenApiParameter(
        "merchant",
        {"type": "string", "pattern": MERCHANT_PATTERN},
        description="Only this merchant's (403 if you may not act for it). Without it, every "
        "merchant you may act for.",
    )
    not_yours = error_answer("No such endpoint, or one of a merchant you may not act for.")
    version_refused = error_answer("Payments-Version is not a version of this API.")
    with_secret = serializers.WebhookEndpointWithSecretOutputSerializer
    extend_schema_view(
        get=extend_schema(
            operation_id="event_list",
            parameters=[
                merchant,
                OpenApiParameter("type", {"type": "string", "enum": list(EVENT_TYPES)}),
                OpenApiParameter(
                    "after",
                    str,
                    description="Events after this one: the last id of the page read (the "
                    "next link carries it; in 2026-11-01, the page's next_cursor).",
                ),
                OpenApiParameter("limit", {"type": "integer", "minimum": 1, "maximum": 100}),
                *REQUEST_HEADERS,
            ],
            responses={
                200: OpenApiResponse(
                    _of_version(
                        "EventListOfVersion",
                        list_of("EventList", serializers.EventOutputSerializer),
                        inline_serializer(
                            "EventListFirstVersion",
                            {
                                "object": drf_serializers.CharField(),
                                "data": serializers.EventOutputSerializer(many=True),
                                "has_more": drf_serializers.BooleanField(),
                                "next_cursor": drf_serializers.CharField(allow_null=True),
                            },
                        ),
                    ),
                    description="Oldest first, in the order events became visible; from "
                    "2026-12-01 in every list's convention, before as data and next_cursor.",
                ),
                400: error_answer("A refused parameter, named in param."),
                403: error_answer("You may not act for the merchant filtered on."),
                **COMMON_ANSWERS,
            },
        )
    )(apis.EventListApi)
    extend_schema_view(
        get=extend_schema(
            operation_id="webhook_endpoint_list",
            parameters=[merchant, *REQUEST_HEADERS],
            responses={
                200: OpenApiResponse(
                    _of_version(
                        "WebhookEndpointListOfVersion",
                        list_of("WebhookEndpointList", serializers.WebhookEndpointOutputSerializer),
                        inline_serializer(
                            "WebhookEndpointListFirstVersion",
                            {
                                "object": drf_serializers.CharField(),
                                "data": serializers.WebhookEndpointOutputSerializer(many=True),
                                "has_more": drf_serializers.BooleanField(),
                            },
                        ),
                    ),
                    description="Your merchants' endpoints, never their secrets; from 2026-12-01 "
                    "in every list's convention, before as data.",
                ),
                400: error_answer("A refused parameter, named in param."),
                403: error_answer("You may not act for the merchant filtered on."),
                **COMMON_ANSWERS,
            },
        ),
        post=extend_schema(
            operation_id="webhook_endpoint_create",
            request=serializers.WebhookEndpointCreateInputSerializer,
            parameters=REQUEST_HEADERS,
            responses={
                201: OpenApiResponse(with_secret, description="The endpoint and its secret."),
                400: error_answer("What was refused, by field (url, event_types, ...)."),
                403: error_answer("You may not act for merchant_id."),
                **COMMON_ANSWERS,
            },
        ),
    )(apis.WebhookEndpointListCreateApi)
    extend_schema_view(
        get=extend_schema(
            operation_id="webhook_endpoint_retrieve",
            parameters=[endpoint_id, *REQUEST_HEADERS],
            responses={
                200: serializers.WebhookEndpointOutputSerializer,
                400: version_refused,
                404: not_yours,
                **COMMON_ANSWERS,
            },
        ),
        patch=extend_schema(
            operation_id="webhook_endpoint_update",
            request=serializers.WebhookEndpointUpdateInputSerializer,
            parameters=[endpoint_id, *REQUEST_HEADERS],
            responses={
                200: serializers.WebhookEndpointOutputSerializer,
                400: error_answer("What was refused, by field."),
                404: not_yours,
                **COMMON_ANSWERS,
            },
        ),
        delete=extend_schema(
            operation_id="webhook_endpoint_delete",
            parameters=[endpoint_id, *REQUEST_HEADERS],
            responses={204: None, 400: version_refused, 404: not_yours, **COMMON_ANSWERS},
        ),
    )(apis.WebhookEndpointDetailApi)
    extend_schema_view(
        post=extend_schema(
            operation_id="webhook_endpoint_rotate_secret",
            request=None,
            parameters=[endpoint_id, *REQUEST_HEADERS],
            responses={
                200: OpenApiResponse(with_secret, description="The new secret, shown once."),
                400: error_answer("The body is not empty."),
                404: not_yours,
                **COMMON_ANSWERS,
            },
        )
    )(apis.WebhookEndpointRotateSecretApi)
    extend_schema_view(
        post=extend_schema(
            operation_id="webhook_endpoint_enable",
            request=None,
            parameters=[endpoint_id, *REQUEST_HEADERS],
            responses={
                200: OpenApiResponse(
                    serializers.WebhookEndpointEnabledOutputSerializer,
                    description="Enabled; replayed counts the deliveries due again.",
                ),
                400: error_answer("The body is not empty."),
                404: not_yours,
                **COMMON_ANSWERS,
            },
        )
    )(apis.WebhookEndpointEnableApi)
