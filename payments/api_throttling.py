"""Rate limits of the payments API, off unless ``PAYMENTS_API_THROTTLE_RATES`` sets them.

DRF's scoped throttle, with its rates read from the module's own setting rather than the host's
``DEFAULT_THROTTLE_RATES``, so a host's throttles never apply to the module's views and the
module's never to the host's. Two scopes: ``read`` (GET) and ``write`` (POST, a create). Counts
live in Django's default cache, per user (per address for a request not yet authenticated);
a refused request answers 429 in the error envelope with ``Retry-After``.
"""

from __future__ import annotations

from rest_framework.throttling import ScopedRateThrottle

from payments import conf
from payments.throttle_rates import parse_throttle_rates


class ModuleScopedThrottle(ScopedRateThrottle):
    """``read`` for GET and HEAD, ``write`` for every other method."""

    def allow_request(self, request, view) -> bool:
        self.scope = "read" if request.method in ("GET", "HEAD") else "write"
        self.rate = parse_throttle_rates(conf.PAYMENTS_API_THROTTLE_RATES)[self.scope]
        if self.rate is None:
            return True
        self.num_requests, self.duration = self.parse_rate(self.rate)
        # SimpleRateThrottle's own check, skipping ScopedRateThrottle's (it would read the
        # host's DEFAULT_THROTTLE_RATES).
        return super(ScopedRateThrottle, self).allow_request(request, view)

    def get_rate(self) -> str | None:
        return getattr(self, "rate", None)
