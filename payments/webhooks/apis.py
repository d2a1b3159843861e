"""``/api/events/`` and ``/api/webhook_endpoints/``: thin views over the webhooks services, with
the payments API's policies, error envelope and tenancy (another merchant's endpoint is 404)."""

import uuid

from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework.response import Response
from rest_framework.utils.urls import replace_query_param

from payments.access import merchant_access_allowed, merchants_listed
from payments.api.base import ModuleApiView, forbidden, not_found
from payments.api.errors import field_errors
from payments.api_versions import V2026_12_01, VERSIONS, version_refusal
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
            raise forbidden("merchant")
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
        visible, so paging by ``after`` never skips one. Each event is in the request's version,
        from 2026-12-01 the shape a delivery carries."""
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
        results = EventOutputSerializer(page, many=True, context={"version": request.version}).data
        after = page[-1].id if page else query.get("after")
        return _list_answer(request, results, has_more=has_more, after=after, feed=True)


def _list_answer(request, results, *, has_more: bool, after=None, feed: bool = False) -> Response:
    """A page in the version's list convention. From 2026-12-01 every list's: ``{object, next,
    previous, has_more, results}``, ``next`` the link to the page after the last event (None
    when no page follows, as on every list; a client polling for new events keeps the last id it
    read and asks ``after`` it) and ``previous`` None (the events are read forward). Before, the
    webhooks' own: ``{object, data, has_more}``, and a ``feed``'s ``next_cursor``."""
    if request.version >= V2026_12_01:
        following = has_more and after is not None
        return Response(
            {
                "object": "list",
                "next": _link_after(request, after) if following else None,
                "previous": None,
                "has_more": has_more,
                "results": results,
            }
        )
    page = {"object": "list", "data": results, "has_more": has_more}
    if feed:
        page["next_cursor"] = after
    return Response(page)


def _link_after(request, after) -> str:
    return replace_query_param(request.build_absolute_uri(), "after", str(after))


def _version_checked(data: dict) -> None:
    """400 ``api_version_invalid`` (the code of an unknown ``Payments-Version`` too) naming an
    endpoint's ``api_version`` that is not a version of the API."""
    version = data.get("api_version")
    if version is not None and version not in VERSIONS:
        raise field_errors({"api_version": [version_refusal(version)]}, code="api_version_invalid")


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
        results = WebhookEndpointOutputSerializer(endpoints, many=True).data
        return _list_answer(request, results, has_more=False)

    def post(self, request):
        """A new endpoint: https only, event types from the catalogue, its events in
        ``api_version`` (else the request's version); the answer is the only place its
        ``whsec_`` secret is ever shown."""
        serializer = WebhookEndpointCreateInputSerializer(data=request.data)
        if not serializer.is_valid():
            raise field_errors(serializer.errors)
        data = serializer.validated_data
        _version_checked(data)
        if not merchant_access_allowed(user=request.user, merchant_id=data["merchant_id"]):
            raise forbidden("merchant_id")
        # Without one named, the version the request was served in: its Payments-Version, or
        # the host's pin.
        data.setdefault("api_version", request.version)
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
        """Change the fields given; a new ``api_version`` renders the events sent from now on
        in its shapes, those still waiting included (each keeps its ``webhook-id``)."""
        endpoint = _endpoint_of_user(request.user, endpoint_id)
        if endpoint is None:
            return not_found("endpoint_id")
        serializer = WebhookEndpointUpdateInputSerializer(data=request.data)
        if not serializer.is_valid():
            raise field_errors(serializer.errors)
        data = serializer.validated_data
        _version_checked(data)
        try:
            webhook_endpoint_update(
                endpoint=endpoint,
                url=data.get("url"),
                event_types=data.get("event_types"),
                description=data.get("description"),
                thin=data.get("thin"),
                ordered=data.get("ordered"),
                api_version=data.get("api_version"),
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
