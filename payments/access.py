"""Tenancy: which merchants an API user may act for.

The decision is a pluggable policy: the setting ``PAYMENTS_MERCHANT_ACCESS_POLICY`` names a
callable ``(user, merchant_id) -> bool``. The default reads ``MerchantAccess`` grants (edited in
the admin); a host project with its own merchant model points the setting at its own function.
"""

from collections.abc import Callable
from functools import lru_cache

from django.utils.module_loading import import_string

from payments import conf
from payments.models import MerchantAccess

MerchantAccessPolicy = Callable[[object, str], bool]


def merchant_access_granted(user, merchant_id: str) -> bool:
    """The default policy: an active, authenticated user holding a grant for the merchant."""
    if user is None or not user.is_authenticated or not user.is_active:
        return False
    return MerchantAccess.objects.filter(user=user, merchant_id=merchant_id).exists()


@lru_cache(maxsize=8)
def _policy(path: str) -> MerchantAccessPolicy:
    return import_string(path)


def merchant_access_allowed(*, user, merchant_id: str) -> bool:
    """Ask the configured policy: may ``user`` act for ``merchant_id``?"""
    return bool(_policy(conf.PAYMENTS_MERCHANT_ACCESS_POLICY)(user, merchant_id))
