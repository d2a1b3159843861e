"""The rates ``PAYMENTS_API_THROTTLE_RATES`` accepts, parsed apart from DRF's throttle.

``payments.conf`` declares the setting with this parser, and the project's settings module
imports ``payments.conf``: importing DRF's throttling from there would read DRF's settings before
``REST_FRAMEWORK`` exists and keep DRF's defaults for the whole process (its schema class among
them). So this module imports nothing of DRF; ``payments.api_throttling`` holds the throttle.
"""

from __future__ import annotations

import re

SCOPES = ("read", "write")
_RATE_RE = re.compile(r"([1-9][0-9]{0,8})/(s|sec|second|m|min|minute|h|hour|d|day)", re.ASCII)
RATE_ACCEPTED = (
    "None (no limits), or a dict with some or all of the keys 'read' and 'write', each a rate "
    "such as '100/min' (per s, min, h or day) or None"
)


def parse_throttle_rates(value: dict | None) -> dict[str, str | None]:
    """The rate of each scope (``None``: not limited); ``ValueError`` naming what is wrong."""
    if value is None:
        return dict.fromkeys(SCOPES)
    unknown = sorted(str(key) for key in value if key not in SCOPES)
    if unknown:
        raise ValueError(f"unknown scope(s) {unknown}")
    rates = dict.fromkeys(SCOPES)
    for scope, rate in value.items():
        if rate is not None and not (isinstance(rate, str) and _RATE_RE.fullmatch(rate)):
            raise ValueError(f"[{scope!r}] = {rate!r} is not a rate such as '100/min'")
        rates[scope] = rate
    return rates
