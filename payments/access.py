"""Tenancy: which merchants an API user may act for.

The decision is a pluggable policy: the setting ``PAYMENTS_MERCHANT_ACCESS_POLICY`` names a
callable ``(user, merchant_id) -> bool``. The default reads ``MerchantAccess`` grants (edited in
the admin); a host project with its own merchant model points the setting at its own function,
and gives it a ``merchant_ids(user)`` attribute if ``GET /api/payments/`` should list across a
user's merchants without naming one.
"""

from collections.abc import Callable
from functools import lru_cache

from django.utils.module_loading import import_string

from payments import conf
from payments.models import MerchantAccess

MerchantAccessPolicy = Callable[[object, str], bool]


# How many of a user's grants its token's read carries (``payments.api.authentication``): a
# user granted more merchants is asked per request.
GRANTS_CARRIED = 100
_GRANTED = "_payments_merchants_granted"


def grants_known(user, merchant_ids) -> None:
    """Every merchant ``user`` is granted, as read with its token at this request's start: the
    default policy answers from them, for this user object (one request's) only."""
    setattr(user, _GRANTED, frozenset(merchant_ids))


def merchant_access_granted(user, merchant_id: str) -> bool:
    """The default policy: an active, authenticated user holding a grant for the merchant."""
    if user is None or not user.is_authenticated or not user.is_active:
        return False
    known = getattr(user, _GRANTED, None)
    if known is not None:
        return merchant_id in known
    return MerchantAccess.objects.filter(user=user, merchant_id=merchant_id).exists()


@lru_cache(maxsize=8)
def _policy(path: str) -> MerchantAccessPolicy:
    return import_string(path)


def merchant_access_allowed(*, user, merchant_id: str) -> bool:
    """Ask the configured policy: may ``user`` act for ``merchant_id``?"""
    return bool(_policy(conf.PAYMENTS_MERCHANT_ACCESS_POLICY)(user, merchant_id))


def _granted_merchant_ids(user) -> list[str]:
    if user is None or not user.is_authenticated or not user.is_active:
        return []
    known = getattr(user, _GRANTED, None)
    if known is not None:
        return sorted(known)
    return list(MerchantAccess.objects.filter(user=user).values_list("merchant_id", flat=True))


# What the default policy grants, for a list of payments across a user's merchants.
merchant_access_granted.merchant_ids = _granted_merchant_ids


def merchants_listed(*, user) -> list[str] | None:
    """The merchants ``user`` may act for, when the configured policy can list them: a policy
    lists them through a ``merchant_ids(user)`` attribute of its callable, as the default does.
    ``None`` when it cannot: a list of payments must then name its merchant."""
    lister = getattr(_policy(conf.PAYMENTS_MERCHANT_ACCESS_POLICY), "merchant_ids", None)
    return None if lister is None else list(lister(user))
