"""The API's dated versions (Stripe's model): a client names the shapes it expects in the
``Payments-Version`` header, else gets the version the host pins (``PAYMENTS["API_VERSION"]``,
which the views pass in: this module is read with the settings), and every answer says in the
same header which version it was served in.

A version is a date; a later one compares greater as text, so a shape that changed is one
``if request.version >= V2026_12_01:`` where the shape is chosen. Webhook endpoints are pinned
to a version too, and their events rendered in it (``payments.webhooks.versions``). What each
version changed is listed in ``docs/reference/api.md`` (``CHANGES``, which the reference is
generated from).
"""

from __future__ import annotations

import re

VERSION_HEADER = "Payments-Version"

# The shapes the API answered before it had versions.
FIRST = "2026-11-01"
# Balances in the industry's words, one code per condition, refusals and retries told apart by
# ``type``, and every list in one convention.
V2026_12_01 = "2026-12-01"

# Every version the API serves, oldest first, with what it changed.
CHANGES: dict[str, list[str]] = {
    FIRST: ["the shapes the API answered before it had versions"],
    V2026_12_01: [
        'the balance is `{object: "balance", merchant_id, balances: [{currency, pending, posted, '
        "available, reserved, owed}]}`: `pending` is money in flight (it was every live entry), "
        "and the other old figures are gone",
        "one code per condition: a NOC past its deadline is `notification_of_change_past_deadline` "
        "on reinitiate too (it was `noc_past_deadline`)",
        "`idempotency_error` only for a request to retry with the same key (409 "
        "`idempotency_key_in_use`); a key reused with another body (422 `idempotency_key_reused`) "
        "is an `invalid_request_error`",
        "`GET /api/events/` and `GET /api/webhook_endpoints/` answer `{object, next, previous, "
        "has_more, results}` like every other list (they answered `{object, data, has_more, "
        "next_cursor}`)",
        'an event, delivered or listed, is `{id, object: "event", api_version, type, '
        "created_at, merchant_id, data}`, `api_version` naming the version `data.object` is in "
        "(a delivery had no `object`, and neither had `api_version`)",
        "every object an event carries has `created_at`; a `double_loss` has `detected_at`, as "
        "nested in its refund; `webhook_endpoint.disabled` carries the endpoint as the API shows "
        "it (it carried `id`, `object`, `url` and `disabled_reason`)",
    ],
}
VERSIONS = tuple(CHANGES)
VERSIONS_ACCEPTED = f"one of the API's versions: {', '.join(VERSIONS)}"

_SHOWN_RE = re.compile(r"[0-9A-Za-z._:+-]{1,32}", re.ASCII)
# A run of digits that could be an account number is never echoed; a date's longest is four.
_DIGITS_RE = re.compile(r"[0-9]{5}")


def requested_version(request, pinned: str) -> str:
    """The version ``request`` is served in: the one ``Payments-Version`` names, or the host's
    ``pinned`` one; 400 ``api_version_invalid`` naming the value for any other text (empty
    included)."""
    value = request.headers.get(VERSION_HEADER)
    if value is None:
        return pinned
    if value not in VERSIONS:
        raise version_invalid(value)
    return value


def version_refusal(value: str) -> str:
    """Why ``value`` (not a version) is refused, naming it when it is short plain text;
    anything else (NUL, control characters, a page of text, a bank number) is described, never
    echoed into the answer and the log."""
    plain = _SHOWN_RE.fullmatch(value) and not _DIGITS_RE.search(value)
    shown = f"{value!r}" if plain else f"a value of {len(value)} characters"
    return f"{shown} is not a version of this API; {VERSIONS_ACCEPTED}"


def version_invalid(value: str):
    # Imported here: this module is read with the settings (payments.conf), before DRF may be.
    from payments.api.errors import ApiError

    message = version_refusal(value)
    return ApiError(
        400,
        "api_version_invalid",
        f"{VERSION_HEADER}: {message}",
        param=VERSION_HEADER,
        errors={VERSION_HEADER: [message]},
    )


def version_of(request, pinned: str) -> str:
    """The version an answer names: the one the request named, if it is one, else the pin;
    also for a request refused before its version was read (a body over the limit), whose
    error envelope is the same in every version."""
    version = getattr(request, "version", None) or request.headers.get(VERSION_HEADER)
    return version if version in VERSIONS else pinned


# The first version's codes where one condition had two, by the view that answered the other:
# ``{(view class, code): code in FIRST}``.
_FIRST_CODES = {
    ("PaymentReinitiateApi", "notification_of_change_past_deadline"): "noc_past_deadline",
}
# The first version's types where a type said two things: ``{code: type in FIRST}``.
_FIRST_TYPES = {"idempotency_key_reused": "idempotency_error"}


def error_for_version(error: dict, version: str, view_name: str) -> None:
    """``error`` (an envelope's ``error``) in ``version``'s words: the code and type as the
    module raises them are the latest's; an older version gets what it answered before."""
    if version >= V2026_12_01:
        return
    code = error["code"]
    error["type"] = _FIRST_TYPES.get(code, error["type"])
    error["code"] = _FIRST_CODES.get((view_name, code), code)


def first_version_codes() -> dict[str, list[str]]:
    """What 2026-11-01 answers instead, by code, for the error-code reference."""
    earlier: dict[str, list[str]] = {}
    for (view_name, code), first in _FIRST_CODES.items():
        earlier.setdefault(code, []).append(f"`{first}` from `{view_name}`")
    for code, first in _FIRST_TYPES.items():
        earlier.setdefault(code, []).append(f"type `{first}`")
    return earlier
