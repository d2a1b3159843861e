"""New rows of several tables written in one statement: a create's payment, its ledger entry,
its audit row and its outbox row are one round trip to PostgreSQL instead of four.

Each row is an unsaved model instance, and each insert is the one the ORM's own ``save`` would
send (``InsertQuery``: the fields' defaults, ``auto_now_add``, database defaults, adaptation),
made a data-modifying CTE of one ``WITH`` statement; what the database fills (an auto id, a
column's database default) comes back into the instances as ``save`` sets it. The rows are
inserted in the order given and see each other's keys (the foreign keys Django creates on
PostgreSQL are checked at commit). Model signals are not sent: no receiver of the module's
listens to these models' saves. Other databases save the rows one by one.
"""

from django.db import connection
from django.db.models import Model
from django.db.models.sql import InsertQuery


def rows_insert(rows: list[Model]) -> None:
    """Insert the unsaved ``rows`` in one statement, in order, and mark them saved."""
    if not _one_statement():
        for row in rows:
            row.save(force_insert=True)
        return
    ctes, params, selects, returned = [], [], [], []
    for index, row in enumerate(rows):
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
    for row in rows:
        row._state.adding = False
        row._state.db = connection.alias


def _one_statement() -> bool:
    return connection.vendor == "postgresql"


def _insert(row: Model) -> tuple[str, tuple, list]:
    """The ORM's insert of ``row`` (``Model._save_table``'s fields and returning fields)."""
    meta = row._meta
    fields = [
        f
        for f in meta.local_concrete_fields
        if not f.generated and (row.pk is not None or f is not meta.auto_field)
    ]
    query = InsertQuery(type(row))
    query.insert_values(fields, [row])
    compiler = query.get_compiler(connection=connection)
    compiler.returning_fields = meta.db_returning_fields
    [(sql, params)] = compiler.as_sql()
    return sql, params, meta.db_returning_fields
