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

from collections.abc import Callable

from django.db import connection
from django.db.models import Model
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


def _insert(row: Model, extra_returning: list | None = None) -> tuple[str, tuple, list]:
    """The ORM's insert of ``row`` (``Model._save_table``'s fields and returning fields, and
    ``extra_returning``)."""
    meta = row._meta
    fields = [
        f
        for f in meta.local_concrete_fields
        if not f.generated and (row.pk is not None or f is not meta.auto_field)
    ]
    query = InsertQuery(type(row))
    query.insert_values(fields, [row])
    compiler = query.get_compiler(connection=connection)
    returning = [*meta.db_returning_fields, *(extra_returning or [])]
    compiler.returning_fields = returning
    [(sql, params)] = compiler.as_sql()
    return sql, params, returning
