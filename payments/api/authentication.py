"""The payments API's default token authentication: DRF's, with the caller's merchant grants
read by the same statement that reads its token (``payments.access``), so a create's tenancy
check costs no round trip of its own."""

from django.contrib.postgres.expressions import ArraySubquery
from django.db import connection
from django.db.models import OuterRef
from django.utils.translation import gettext_lazy as _
from rest_framework import authentication, exceptions

from payments.access import GRANTS_CARRIED, grants_known
from payments.models import MerchantAccess


class TokenAuthentication(authentication.TokenAuthentication):
    """``Authorization: Token <key>``, as DRF reads it (the same model, errors and header). On
    PostgreSQL the token's read also carries the user's grants, up to ``GRANTS_CARRIED`` of
    them; a user with more is asked per request by the default access policy, as before. A
    host's own access policy ignores what is carried."""

    def authenticate_credentials(self, key):
        if connection.vendor != "postgresql":
            return super().authenticate_credentials(key)
        model = self.get_model()
        grants = (
            MerchantAccess.objects.filter(user_id=OuterRef("user_id"))
            .order_by("merchant_id")
            .values("merchant_id")[: GRANTS_CARRIED + 1]
        )
        try:
            token = (
                model.objects.select_related("user")
                .annotate(merchants_granted=ArraySubquery(grants))
                .get(key=key)
            )
        except model.DoesNotExist:
            raise exceptions.AuthenticationFailed(_("Invalid token.")) from None
        if not token.user.is_active:
            raise exceptions.AuthenticationFailed(_("User inactive or deleted."))
        if len(token.merchants_granted) <= GRANTS_CARRIED:
            grants_known(token.user, token.merchants_granted)
        return (token.user, token)
