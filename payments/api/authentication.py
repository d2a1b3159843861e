"""The payments API's default token authentication: DRF's, with the caller's merchant grants
read by the same statement that reads its token (``payments.access``), so a create's tenancy
check costs no round trip of its own."""

from django.contrib.auth import get_user_model
from django.db import connection
from django.utils.translation import gettext_lazy as _
from rest_framework import authentication, exceptions

from payments.access import GRANTS_CARRIED, grants_known
from payments.models import MerchantAccess


class TokenAuthentication(authentication.TokenAuthentication):
    """``Authorization: Token <key>``, as DRF reads it (the same model, errors and header). On
    PostgreSQL the token's read also carries the user's grants, up to ``GRANTS_CARRIED`` of
    them; a user with more is asked per request by the default access policy, as before. A
    host's own access policy ignores what is carried. The statement is written once per
    process, not built by the ORM on every request."""

    def authenticate_credentials(self, key):
        if connection.vendor != "postgresql":
            return super().authenticate_credentials(key)
        model = self.get_model()
        users = list(get_user_model().objects.raw(_token_sql(model), [GRANTS_CARRIED + 1, key]))
        if not users:
            raise exceptions.AuthenticationFailed(_("Invalid token."))
        [user] = users
        if not user.is_active:
            raise exceptions.AuthenticationFailed(_("User inactive or deleted."))
        if len(user.merchants_granted) <= GRANTS_CARRIED:
            grants_known(user, user.merchants_granted)
        token = model(key=key, user=user, created=user.token_created)
        return (user, token)


_SQL: dict[type, str] = {}


def _token_sql(model) -> str:
    """The user of a token (``%s``: the key) with its token's creation and up to ``%s`` (the
    first parameter) of its grants, merchants in order."""
    sql = _SQL.get(model)
    if sql is None:
        quote = connection.ops.quote_name
        users = get_user_model()._meta
        tokens = model._meta
        token_user = quote(tokens.get_field("user").column)
        grants = MerchantAccess._meta
        sql = (
            f"SELECT u.*, t.{quote(tokens.get_field('created').column)} AS token_created, "
            f"ARRAY(SELECT g.{quote(grants.get_field('merchant_id').column)} "
            f"FROM {quote(grants.db_table)} g "
            f"WHERE g.{quote(grants.get_field('user').column)} = t.{token_user} "
            f"ORDER BY 1 LIMIT %s) AS merchants_granted "
            f"FROM {quote(tokens.db_table)} t JOIN {quote(users.db_table)} u "
            f"ON u.{quote(users.pk.column)} = t.{token_user} "
            f"WHERE t.{quote(tokens.pk.column)} = %s"
        )
        _SQL[model] = sql
    return sql
