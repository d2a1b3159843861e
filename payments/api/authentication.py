"""The payments API's default token authentication: DRF's, with the caller's merchant grants
read by the same statement that reads its token (``payments.access``), so a create's tenancy
check costs no round trip of its own."""

from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models.base import DEFERRED
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
        user = _token_user(model, key)
        if user is None:
            raise exceptions.AuthenticationFailed(_("Invalid token."))
        if not user.is_active:
            raise exceptions.AuthenticationFailed(_("User inactive or deleted."))
        if len(user.merchants_granted) <= GRANTS_CARRIED:
            grants_known(user, user.merchants_granted)
        token = model(key=key, user=user, created=user.token_created)
        return (user, token)


def _token_user(model, key: str):
    """The user of the token ``key``, with ``token_created`` and ``merchants_granted`` set on it;
    None for an unknown key. Made as the ORM's raw query makes it (each column of a field
    through that field's converters, the others set as attributes), by a plan made once per
    process and column list, where ``objects.raw`` worked out its columns on every request."""
    with connection.cursor() as cursor:
        cursor.execute(_token_sql(model), [GRANTS_CARRIED + 1, key])
        row = cursor.fetchone()
        if row is None:
            return None
        columns = tuple(column.name for column in cursor.description)
    user_model = get_user_model()
    plan = _plans.get((user_model, columns))
    if plan is None:
        plan = _plans[(user_model, columns)] = _plan(user_model, columns)
    fields, extras = plan
    values = [
        DEFERRED if index is None else _converted(row[index], converters, col)
        for col, index, converters in fields
    ]
    names = [col.target.attname for col, _, _ in fields]
    user = user_model.from_db(connection.alias, names, values)
    for name, index in extras:
        setattr(user, name, row[index])
    return user


def _converted(value, converters, col):
    for convert in converters:
        value = convert(value, col, connection)
    return value


def _plan(user_model, columns: tuple[str, ...]):
    """Where each concrete field of ``user_model`` (its column expression) is in a row of
    ``columns`` (None: not read, deferred) with its converters, and the other columns by
    name."""
    at = {column: index for index, column in enumerate(columns)}
    fields = []
    for field in user_model._meta.concrete_fields:
        index = at.pop(field.column, None)
        col = field.get_col(user_model._meta.db_table)
        converters = [*connection.ops.get_db_converters(col), *field.get_db_converters(connection)]
        fields.append((col, index, converters))
    return fields, sorted(at.items(), key=lambda item: item[1])


_plans: dict[tuple, tuple[list, list]] = {}
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
