"""An event in each API version, as Stripe pins a webhook endpoint's version: an endpoint
receives every event in the version it is pinned to (``WebhookEndpoint.api_version``), and
``GET /api/events/`` answers in the request's (``payments.api_versions``).

An event's object is stored once, in the latest version's shape. An older version's is made
at delivery by undoing, newest first, what each later version changed (``OBJECT_CHANGES``),
so a version is one entry here, and an event written before an endpoint changed its version
is still sent in the version the endpoint reads. The event around the object (``event_shape``)
differs by version the same way.
"""

from collections.abc import Callable

from payments.api_versions import FIRST, V2026_12_01, VERSIONS
from payments.webhooks.models import Event

ObjectChange = Callable[[dict], dict]


def _without(*names: str) -> ObjectChange:
    def undo(obj: dict) -> dict:
        return {key: value for key, value in obj.items() if key not in names}

    return undo


def _only(*names: str) -> ObjectChange:
    def undo(obj: dict) -> dict:
        return {key: obj[key] for key in names if key in obj}

    return undo


# What a version changed in the objects events carry, by the object's kind: each function turns
# an object of that version into the version before's shape. Described for integrators in
# ``payments.api_versions.CHANGES``.
OBJECT_CHANGES: dict[str, dict[str, ObjectChange]] = {
    V2026_12_01: {
        # The endpoint as the API shows it (one shape wherever it appears); before, four fields.
        "webhook_endpoint": _only("id", "object", "url", "disabled_reason"),
        # Every object has ``created_at``; a double loss says when it was found, as it does
        # nested in its refund.
        "notification_of_change": _without("created_at"),
        "return_dishonor": _without("created_at"),
        "double_loss": _without("detected_at", "created_at"),
    },
}


def object_in_version(obj: dict, version: str) -> dict:
    """``obj`` (stored in the latest version's shape) in ``version``'s shape."""
    for later in reversed(VERSIONS):
        if later <= version:
            break
        undo = OBJECT_CHANGES.get(later, {}).get(obj.get("object"))
        if undo is not None:
            obj = undo(obj)
    return obj


def event_shape(event: Event, version: str, *, thin: bool = False, listed: bool = False) -> dict:
    """``event`` as ``version`` shows it, delivered (``listed`` False) or in the events list.

    From 2026-12-01 one shape in both: ``{id, object: "event", api_version, type, created_at,
    merchant_id, data}``, ``api_version`` naming the version ``data.object`` is in. In
    2026-11-01, without ``api_version``, and a delivery without ``object``. Thin, the object is
    its ``id`` and ``object`` only, in every version."""
    if version not in VERSIONS:
        raise ValueError(f"{version!r} is not a version of the API")
    stored = event.data["object"]
    if thin:
        shown = {key: stored[key] for key in ("id", "object")}
        data = {"object": shown}
    else:
        data = {**event.data, "object": object_in_version(stored, version)}
    shape = {
        "id": event.id,
        "object": "event",
        "api_version": version,
        "type": event.type,
        "created_at": event.created_at.isoformat().replace("+00:00", "Z"),
        "merchant_id": event.merchant_id,
        "data": data,
    }
    if version == FIRST:
        del shape["api_version"]
        if not listed:
            del shape["object"]
    return shape
