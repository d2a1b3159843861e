"""``/api/events/`` and ``/api/webhook_endpoints/``: thin views over the webhooks services, with
the payments API's policies, error envelope and tenancy (another merchant's endpoint is 404)."""

import uuid

from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework.response import Response

from payments.access import merchant_access_allowed, merchants_listed
from payments.api_errors import field_errors
from payments.apis import ModuleApiView, _forbidden, not_found
from payments.webhooks.models import Event, WebhookEndpoint
from payments.webhooks.serializers import (
    EventListQuerySerializer,
    EventOutputSerializer,
    WebhookEndpointCreateInputSerializer,
    WebhookEndpointEnabledOutputSerializer,
    WebhookEndpointOutputSerializer,
    WebhookEndpointUpdateInputSerializer,
    WebhookEndpointWithSecretOutputSerializer,
)
from payments.webhooks.services import (
    webhook_endpoint_create,
    webhook_endpoint_delete,
    webhook_endpoint_enable,
    webhook_endpoint_rotate_secret,
    webhook_endpoint_update,
)

EVENTS_PAGE_SIZE = 25


def _query(request, serializer_class) -> dict:
    params = request.query_params
    repeated = [name for name in params if len(params.getlist(name)) > 1]
    if repeated:
        raise field_errors({name[:64]: ["given more than once"] for name in repeated})
    query = serializer_class(data=params.dict())
    if not query.is_valid():
        raise field_errors(query.errors)
    return query.validated_data


def _merchants(user, merchant: str | None) -> list[str]:
    if merchant is not None:
        if not merchant_access_allowed(user=user, merchant_id=merchant):
            raise _forbidden("merchant")
        return [merchant]
    merchants = merchants_listed(user=user)
    if merchants is None:
        raise field_errors(
            {"merchant": ["required: the merchant access policy cannot list your merchants"]}
        )
    return merchants


class EventListApi(ModuleApiView):
    def get(self, request):
        """The caller's merchants' events, oldest first, after the event ``after`` names (the
        ``next_cursor`` of the last page); filtered by ``merchant`` and ``type``. An event is
        listed once it is dispatched, within seconds of its commit, in the order events became
        visible, so paging by ``after`` never skips one."""
        query = _query(request, EventListQuerySerializer)
        merchants = _merchants(request.user, query.get("merchant"))
        events = Event.objects.filter(merchant_id__in=merchants, position__isnull=False)
        if "after" in query:
            cursor = events.filter(id=query["after"]).values_list("position", flat=True).first()
            if cursor is None:
                raise field_errors({"after": ["not an event of yours, or past retention"]})
            events = events.filter(position__gt=cursor)
        if "type" in query:
            events = events.filter(type=query["type"])
        limit = query.get("limit", EVENTS_PAGE_SIZE)
        page = list(events.order_by("position")[: limit + 1])
        has_more = len(page) > limit
        page = page[:limit]
        return Response(
            {
                "object": "list",
                "data": EventOutputSerializer(page, many=True).data,
                "has_more": has_more,
                "next_cursor": page[-1].id if page else query.get("after"),
            }
        )


def _endpoint_of_user(user, endpoint_id: str) -> WebhookEndpoint | None:
    """The endpoint if ``user`` may act for its merchant; any other id answers alike (404)."""
    try:
        endpoint = WebhookEndpoint.objects.get(id=uuid.UUID(endpoint_id))
    except (ValueError, WebhookEndpoint.DoesNotExist):
        return None
    if not merchant_access_allowed(user=user, merchant_id=endpoint.merchant_id):
        return None
    return endpoint


def _with_secret(endpoint: WebhookEndpoint) -> dict:
    """The only answers that show the secret: a new endpoint, a rotation."""
    return WebhookEndpointWithSecretOutputSerializer(endpoint).data


class WebhookEndpointListCreateApi(ModuleApiView):
    def get(self, request):
        """The endpoints of the caller's merchants (never their secrets)."""
        merchants = _merchants(request.user, request.query_params.get("merchant"))
        endpoints = WebhookEndpoint.objects.filter(merchant_id__in=merchants)
        return Response(
            {
                "object": "list",
                "data": WebhookEndpointOutputSerializer(endpoints, many=True).data,
                "has_more": False,
            }
        )

    def post(self, request):
        """A new endpoint: https only, event types from the catalogue; the answer is the only
        place its ``whsec_`` secret is ever shown."""
        serializer = WebhookEndpointCreateInputSerializer(data=request.data)
        if not serializer.is_valid():
            raise field_errors(serializer.errors)
        data = serializer.validated_data
        if not merchant_access_allowed(user=request.user, merchant_id=data["merchant_id"]):
            raise _forbidden("merchant_id")
        try:
            endpoint = webhook_endpoint_create(**data)
        except DjangoValidationError as exc:
            raise field_errors(exc.message_dict) from None
        return Response(_with_secret(endpoint), status=201)


class WebhookEndpointDetailApi(ModuleApiView):
    def get(self, request, endpoint_id):
        endpoint = _endpoint_of_user(request.user, endpoint_id)
        if endpoint is None:
            return not_found("endpoint_id")
        return Response(WebhookEndpointOutputSerializer(endpoint).data)

    def patch(self, request, endpoint_id):
        endpoint = _endpoint_of_user(request.user, endpoint_id)
        if endpoint is None:
            return not_found("endpoint_id")
        serializer = WebhookEndpointUpdateInputSerializer(data=request.data)
        if not serializer.is_valid():
            raise field_errors(serializer.errors)
        data = serializer.validated_data
        try:
            webhook_endpoint_update(
                endpoint=endpoint,
                url=data.get("url"),
                event_types=data.get("event_types"),
                description=data.get("description"),
                thin=data.get("thin"),
                ordered=data.get("ordered"),
            )
        except DjangoValidationError as exc:
            raise field_errors(exc.message_dict) from None
        return Response(WebhookEndpointOutputSerializer(endpoint).data)

    def delete(self, request, endpoint_id):
        endpoint = _endpoint_of_user(request.user, endpoint_id)
        if endpoint is None:
            return not_found("endpoint_id")
        webhook_endpoint_delete(endpoint=endpoint, actor=f"api:{request.user.get_username()}")
        return Response(status=204)


class WebhookEndpointRotateSecretApi(ModuleApiView):
    def post(self, request, endpoint_id):
        """A new secret, shown in this answer only; the old one signs beside it for
        ``WEBHOOK_SECRET_GRACE``."""
        endpoint = _endpoint_of_user(request.user, endpoint_id)
        if endpoint is None:
            return not_found("endpoint_id")
        if request.data:
            raise field_errors({name[:64]: ["unknown field"] for name in request.data})
        endpoint = webhook_endpoint_rotate_secret(
            endpoint=endpoint, actor=f"api:{request.user.get_username()}"
        )
        return Response(_with_secret(endpoint))


class WebhookEndpointEnableApi(ModuleApiView):
    def post(self, request, endpoint_id):
        """Enable a disabled endpoint; what it missed since it was disabled is sent again."""
        endpoint = _endpoint_of_user(request.user, endpoint_id)
        if endpoint is None:
            return not_found("endpoint_id")
        if request.data:
            raise field_errors({name[:64]: ["unknown field"] for name in request.data})
        replayed = webhook_endpoint_enable(
            endpoint=endpoint, actor=f"api:{request.user.get_username()}"
        )
        endpoint.replayed = replayed
        return Response(WebhookEndpointEnabledOutputSerializer(endpoint).data)
