"""``ProcessorCallbackMiddleware``: the callback endpoint served past the middleware below it.

Every middleware costs every request something, and the callback endpoint needs none of a
browser's: no session, no user, no flash messages, no CSRF token (the signature authenticates
it and DRF exempts it), no static files, no framing policy for a JSON answer to a server. At
the processor's rate those are about a tenth of the endpoint's CPU (docs/performance.md, "The
callback endpoint's CPU per request").

Put it in ``MIDDLEWARE`` below the middleware every request must pass (Django's
``SecurityMiddleware``: the HTTPS redirect and its headers; a host's own request logging) and
above the rest. A request for the endpoint's path then goes from here straight to the view,
as Django's handler would call it (no transaction: the view is ``non_atomic_requests``), and
its answer is rendered and given its ``Content-Length`` here, as ``CommonMiddleware`` would.
Every other request goes on down the chain untouched. Optional: without it the endpoint
answers the same, through the whole chain.
"""

from collections.abc import Callable

from django.http import HttpRequest, HttpResponseBase
from django.urls import (
    NoReverseMatch,
    Resolver404,
    ResolverMatch,
    get_script_prefix,
    resolve,
    reverse,
)

URL_NAME = "callbacks:processor"


class ProcessorCallbackMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response
        # The endpoint's path and route in the project's URLconf, looked up on the first
        # request (the URLconf may import what imports this module).
        self._route: tuple[str | None, ResolverMatch | None] | None = None

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        path, match = self._route or self._route_find()
        # A request with a URLconf of its own (set by a middleware above) is resolved by the
        # handler, as any other.
        if request.path_info != path or match is None or hasattr(request, "urlconf"):
            return self.get_response(request)
        request.resolver_match = match
        response = match.func(request, *match.args, **match.kwargs)
        if callable(getattr(response, "render", None)):
            response = response.render()
        if not response.streaming and not response.has_header("Content-Length"):
            response.headers["Content-Length"] = str(len(response.content))
        return response

    def _route_find(self) -> tuple[str | None, ResolverMatch | None]:
        """The endpoint's ``path_info`` (its URL without the script prefix) and what it
        resolves to; neither when the project does not route that path to the endpoint."""
        from callbacks.apis import processor_callback

        route: tuple[str | None, ResolverMatch | None] = (None, None)
        try:
            path = "/" + reverse(URL_NAME).removeprefix(get_script_prefix())
            match = resolve(path)
        except (NoReverseMatch, Resolver404):
            pass
        else:
            if match.func is processor_callback:
                route = (path, match)
        self._route = route
        return route
