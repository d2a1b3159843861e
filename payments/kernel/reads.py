"""Several independent reads in one statement: each queryset a subquery of one ``SELECT``
whose rows come back as a JSON array, made model instances again as the ORM makes them.

A create checks the account and the merchant it concerns in several small indexed reads (its
originator profile, the account's validation, notifications of change and blocks, the
merchant's exposure limits); none depends on another, so one round trip serves them all.
Each queryset keeps its own filters, order, slice and ``only()``; fields it leaves out are
deferred, as they would be. The statement may take a create's locks too, its first round trip
in the transaction. Other databases than PostgreSQL run the querysets one by one.
"""

import json
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

from django.db import connection
from django.db.models import JSONField, Model, QuerySet
from django.db.models.base import DEFERRED

from payments.kernel.locks import LockSql


def querysets_read(
    querysets: Sequence[QuerySet], *, locks: Sequence[LockSql | None] = ()
) -> list[list[Model]]:
    """The rows of each of ``querysets`` (model querysets of the default database), read in
    one statement on PostgreSQL, which takes the transaction ``locks`` first, in their order.
    The reads are not protected by the locks (``LockSql``): only what need not be is read
    with them."""
    if connection.vendor != "postgresql":
        return [list(queryset) for queryset in querysets]
    parts, params = [], []
    for lock in locks:
        if lock is not None:
            parts.append(lock.sql)
            params.extend(lock.params)
    taken = len(parts)
    for queryset in querysets:
        sql, query_params = queryset.query.get_compiler(connection=connection).as_sql()
        parts.append(
            f"(SELECT COALESCE(json_agg(row_to_json(t)), '[]'::json)::text FROM ({sql}) AS t)"
        )
        params.extend(query_params)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {', '.join(parts)}", params)
        texts = cursor.fetchone()[taken:]
    return [
        [_instance(queryset.model, row) for row in json.loads(text, parse_float=Decimal)]
        for queryset, text in zip(querysets, texts, strict=True)
    ]


def _instance(model: type[Model], row: dict[str, Any]) -> Model:
    """The model instance of one JSON row, keyed by column: each field's value as its
    ``to_python`` reads it, the fields the query left out deferred."""
    values = []
    for field in model._meta.concrete_fields:
        if field.column not in row:
            values.append(DEFERRED)
            continue
        value = row[field.column]
        if isinstance(field, JSONField):
            values.append(_floats(value))
        elif value is None:
            values.append(None)
        else:
            values.append(field.to_python(value))
    return model.from_db(connection.alias, [f.attname for f in model._meta.concrete_fields], values)


def _floats(value: Any) -> Any:
    """A JSON field's value as the ORM reads it: its numbers floats (or ints), not the
    ``Decimal`` the read parses the columns' numbers into."""
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, list):
        return [_floats(item) for item in value]
    if isinstance(value, dict):
        return {key: _floats(item) for key, item in value.items()}
    return value
