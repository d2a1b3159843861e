"""New rows of several tables written in one statement: a create's payment, its ledger entry,
its audit row and its outbox row are one round trip to PostgreSQL instead of four.

Each row is an unsaved model instance, and each insert is the one the ORM's own ``save`` would
send (``InsertQuery``: the fields' defaults, ``auto_now_add``, database defaults, adaptation),
made a data-modifying CTE of one ``WITH`` statement; what the database fills (an auto id, a
column's database default) comes back into the instances as ``save`` sets it. The rows are
inserted in the order given and see each other's keys (the foreign keys Django creates on
PostgreSQL are checked at commit). A row may be given as a function that makes it: it is
called once the rows before it are built, so it reads what their inserts fill in on the
instances (a payment's ``created_at``), as a row saved after them would. Model signals are not
sent: no receiver of the module's listens to these models' saves. Other databases save the rows
one by one.
"""

import uuid
from collections.abc import Callable
from datetime import date, datetime
from decimal import Decimal
from functools import lru_cache

from django.db import connection
from django.db.models import Model
from django.db.models.expressions import DatabaseDefault
from django.db.models.sql import InsertQuery

Row = Model | Callable[[], Model]


def rows_insert(rows: list[Row]) -> list[Model]:
    """Insert the unsaved ``rows`` in one statement, in order, and mark them saved; the rows
    (those given as functions made)."""
    if not _one_statement():
        made = []
        for row in rows:
            row = row if isinstance(row, Model) else row()
            row.save(force_insert=True)
            made.append(row)
        return made
    ctes, params, selects, returned, made = [], [], [], [], []
    for index, row in enumerate(rows):
        row = row if isinstance(row, Model) else row()
        made.append(row)
        sql, row_params, returning = _insert(row)
        name = f"row{index}"
        ctes.append(f"{name} AS ({sql})")
        params.extend(row_params)
        for field in returning:
            column = connection.ops.quote_name(field.column)
            selects.append(f"(SELECT {column} FROM {name})")  # noqa: S608
            returned.append((row, field))
    statement = f"WITH {', '.join(ctes)} SELECT {', '.join(selects) or 'NULL'}"
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        values = cursor.fetchone()
    for (row, field), value in zip(returned, values, strict=False):
        for convert in field.get_db_converters(connection):
            value = convert(value, field.cached_col, connection)
        setattr(row, field.attname, value)
    for row in made:
        row._state.adding = False
        row._state.db = connection.alias
    return made


def row_insert_returning(row: Model, *, computed: tuple[str, ...]) -> None:
    """Insert the unsaved ``row`` as ``save`` does, and set back on it the ``computed`` fields
    too, whose values are expressions the database computes in the insert (a count): one
    statement (``INSERT ... RETURNING``), where ``save`` and a read after it are two."""
    meta = row._meta
    extra = [meta.get_field(name) for name in computed]
    sql, params, returning = _insert(row, extra_returning=extra)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        values = cursor.fetchone()
    for field, value in zip(returning, values, strict=True):
        for convert in field.get_db_converters(connection):
            value = convert(value, field.cached_col, connection)
        setattr(row, field.attname, value)
    row._state.adding = False
    row._state.db = connection.alias


def _one_statement() -> bool:
    return connection.vendor == "postgresql"


def _insert(row: Model, extra_returning: list | None = None) -> tuple[str, list, list]:
    """The ORM's insert of ``row`` (``Model._save_table``'s fields and returning fields, and
    ``extra_returning``). Its statement is the same for every row of a model whose values are
    plain values or database defaults alike: compiled once per process for each such shape, and
    each row only adapts its values (``Field.get_db_prep_save``, as the compiler does); a row
    with another expression, or a field with a placeholder of its own, is compiled per row."""
    meta = row._meta
    fields, attnames, placeholders = _fields_of(type(row), row.pk is not None)
    returning = [*meta.db_returning_fields, *(extra_returning or [])]
    values = [field.pre_save(row, True) for field in fields]
    defaults = tuple(isinstance(value, DatabaseDefault) for value in values)
    # A value of a plain type is never an expression: only the others are asked.
    plain = not placeholders and all(
        type(value) in _PLAIN or is_default or not hasattr(value, "resolve_expression")
        for value, is_default in zip(values, defaults, strict=True)
    )
    key = (type(row), attnames, defaults, tuple(returning))
    sql = _statements.get(key) if plain else None
    if sql is not None:
        params = [
            field.get_db_prep_save(value, connection=connection)
            for field, value, is_default in zip(fields, values, defaults, strict=True)
            if not is_default
        ]
        return sql, params, returning
    query = InsertQuery(type(row))
    # ``raw``: the values as ``pre_save`` made them above (an ``auto_now_add`` field's moment),
    # not made again.
    query.insert_values(fields, [row], raw=True)
    compiler = query.get_compiler(connection=connection)
    compiler.returning_fields = returning
    [(sql, params)] = compiler.as_sql()
    if plain:
        _statements[key] = sql
    return sql, list(params), returning


_PLAIN = frozenset(
    (type(None), str, int, bool, float, Decimal, dict, list, datetime, date, uuid.UUID)
)


@lru_cache(maxsize=64)
def _fields_of(model: type[Model], with_pk: bool) -> tuple[list, tuple[str, ...], bool]:
    """The fields ``Model._save_table`` inserts for a row of ``model`` (its auto field only when
    the row has its key), their attnames, and whether one has a placeholder of its own."""
    meta = model._meta
    fields = [
        f
        for f in meta.local_concrete_fields
        if not f.generated and (with_pk or f is not meta.auto_field)
    ]
    placeholders = any(hasattr(field, "get_placeholder") for field in fields)
    return fields, tuple(field.attname for field in fields), placeholders


# The insert statements compiled so far, by model, fields, which of them take their database
# default, and returning fields (``_insert``): a handful per process.
_statements: dict[tuple, str] = {}
