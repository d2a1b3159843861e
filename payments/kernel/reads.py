"""Several independent reads in one statement: each read a subquery of one ``SELECT`` whose
rows come back as a JSON array, made model instances again as the ORM makes them.

A create checks the account and the merchant it concerns in several small indexed reads (its
originator profile, the account's validation, notifications of change and blocks, the
merchant's exposure limits); none depends on another, so one round trip serves them all.
Each read keeps its own filters, order, slice and ``only()``; fields it leaves out are
deferred, as they would be. A ``values()`` queryset's rows come back as dicts, as it gives them,
each value as the JSON row has it (a number a ``Decimal``, a date text): for a figure the
database computes (a sum), which no model instance need be made for. The statement may take a
create's locks too, its first round trip in the transaction. Other databases than PostgreSQL run
the querysets one by one.

A read that has the same shape on every call (a create's) is a ``PreparedRead``: the ORM builds
and compiles its queryset once per process and shape, and each call only puts its values in
the compiled statement's parameters, where a queryset is built and compiled again per call.
"""

import json
import uuid
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.db import connection
from django.db.models import JSONField, Model, QuerySet
from django.db.models.base import DEFERRED
from django.db.models.query import ValuesIterable

from payments.kernel.locks import LockSql


@dataclass(frozen=True)
class _Compiled:
    """A read's statement, made a subquery of the one ``SELECT``: its model and SQL, and its
    parameters, each a constant or (``slot`` true) the name of a value given per call."""

    model: type[Model] | None  # None: a values() read, its rows dicts
    sql: str
    params: tuple[tuple[bool, Any], ...]

    def params_for(self, values: dict[str, Any]) -> list:
        return [values[value] if slot else value for slot, value in self.params]


class PreparedRead:
    """A read of the same shape on every call: ``build`` makes its queryset from the values
    named in ``slots`` (strings the queryset only compares columns with, never reads in Python),
    in ``uuid_slots`` (UUIDs, alike: a payment's id) and from shape arguments (any other
    keyword, hashable: a flag that adds a filter).

    On PostgreSQL the queryset of each shape is built and compiled once, with a marker in each
    slot, and each call gives its values to the compiled statement (``read``); elsewhere each
    call builds the queryset (``queryset``). A slot whose marker the compiled statement does not
    carry as a parameter as it was given (a lookup that rewrites its value) fails at once; a
    slot a shape does not use is left out."""

    def __init__(
        self,
        build: Callable[..., QuerySet],
        *,
        slots: Sequence[str] = (),
        uuid_slots: Sequence[str] = (),
    ) -> None:
        self.build = build
        self.slots = tuple(slots)
        self.uuid_slots = tuple(uuid_slots)
        self._compiled: dict[Hashable, _Compiled] = {}

    def read(self, **arguments: Any) -> "Read":
        values = {name: arguments.pop(name) for name in (*self.slots, *self.uuid_slots)}
        return Read(self, values, arguments)

    def compiled(self, shape: dict[str, Any]) -> _Compiled:
        key = tuple(sorted(shape.items()))
        compiled = self._compiled.get(key)
        if compiled is None:
            compiled = self._compiled[key] = self._compile(shape)
        return compiled

    def _compile(self, shape: dict[str, Any]) -> _Compiled:
        given: dict[str, Any] = {name: _marker(name) for name in self.slots}
        given.update({name: _uuid_marker(name) for name in self.uuid_slots})
        markers = {marker: name for name, marker in given.items()}
        queryset = self.build(**given, **shape)
        sql, params = queryset.query.get_compiler(connection=connection).as_sql()
        compiled_params = tuple(
            (True, markers[param])
            if isinstance(param, str | uuid.UUID) and param in markers
            else (False, param)
            for param in params
        )
        uuid_texts = {str(marker) for marker in markers if isinstance(marker, uuid.UUID)}
        uuid_texts |= {marker.hex for marker in markers if isinstance(marker, uuid.UUID)}
        rewritten = [
            value
            for slot, value in compiled_params
            if not slot and isinstance(value, str) and (_MARKER in value or value in uuid_texts)
        ]
        if rewritten:
            raise ValueError(f"the compiled read does not carry its slots as given: {rewritten}")
        values_read = issubclass(queryset._iterable_class, ValuesIterable)
        return _Compiled(None if values_read else queryset.model, sql, compiled_params)


@dataclass(frozen=True)
class Read:
    """One call's read of a ``PreparedRead``: its slots' values and its shape."""

    prepared: PreparedRead
    values: dict[str, Any]
    shape: dict[str, Any]

    def queryset(self) -> QuerySet:
        return self.prepared.build(**self.values, **self.shape)


_MARKER = "\x00slot:"


def _marker(name: str) -> str:
    return f"{_MARKER}{name}\x00"


# A UUID slot's marker: a UUID no row holds, one per slot's name.
_UUID_MARKERS = uuid.UUID("6f1c3c52-3d0e-4d5f-9c55-0f8b1b6c2a10")


def _uuid_marker(name: str) -> uuid.UUID:
    return uuid.uuid5(_UUID_MARKERS, name)


@dataclass(frozen=True)
class AfterLocks:
    """An expression of the one ``SELECT`` evaluated after its locks, whose reads the locks do
    protect: a call of a VOLATILE function of the database. Each statement such a function
    runs reads in a snapshot taken when that statement starts (PostgreSQL's READ COMMITTED),
    so after the statement's locks were granted: it sees what every earlier holder of them
    committed, where the statement's own subqueries read in its snapshot, which may predate
    the wait. Its value comes back as the driver reads it."""

    sql: str
    params: list


def querysets_read(
    querysets: Sequence[QuerySet | Read], *, locks: Sequence[LockSql | None] = ()
) -> list[list[Model]]:
    """The rows of each of ``querysets`` (model querysets of the default database, or reads
    of a ``PreparedRead``), read in one statement on PostgreSQL, which takes the transaction
    ``locks`` first, in their order. The reads are not protected by the locks (``LockSql``):
    only what need not be is read with them."""
    return locked_read(querysets, locks=locks)[1]


def locked_read(
    querysets: Sequence[QuerySet | Read],
    *,
    locks: Sequence[LockSql | None] = (),
    after_locks: Sequence[AfterLocks] = (),
) -> tuple[list, list[list[Model]]]:
    """``querysets_read``, and the value of each of ``after_locks``, evaluated in the same
    statement in their order after the locks (PostgreSQL only: elsewhere there are none)."""
    if connection.vendor != "postgresql":
        if after_locks:
            raise ValueError("reads after locks are PostgreSQL's")
        rows = [list(item.queryset() if isinstance(item, Read) else item) for item in querysets]
        return [], rows
    parts, params = [], []
    models: list[type[Model] | None] = []  # None: a values() read, its rows dicts
    for lock in locks:
        if lock is not None:
            parts.append(lock.sql)
            params.extend(lock.params)
    taken = len(parts)
    # Evaluated in the select list's order: after every lock, before the plain reads.
    for after in after_locks:
        parts.append(after.sql)
        params.extend(after.params)
    read_from = len(parts)
    for item in querysets:
        if isinstance(item, Read):
            compiled = item.prepared.compiled(item.shape)
            sql, query_params = compiled.sql, compiled.params_for(item.values)
            models.append(compiled.model)
        else:
            sql, query_params = item.query.get_compiler(connection=connection).as_sql()
            models.append(None if issubclass(item._iterable_class, ValuesIterable) else item.model)
        parts.append(
            f"(SELECT COALESCE(json_agg(row_to_json(t)), '[]'::json)::text FROM ({sql}) AS t)"
        )
        params.extend(query_params)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {', '.join(parts)}", params)
        row = cursor.fetchone()
    texts = row[read_from:]
    return list(row[taken:read_from]), [
        _rows(model, json.loads(text, parse_float=Decimal)) if text != "[]" else []
        for model, text in zip(models, texts, strict=True)
    ]


def _rows(model: type[Model] | None, rows: list[dict[str, Any]]) -> list:
    """A read's JSON rows: model instances, or the rows themselves for a values() read."""
    if model is None:
        return rows
    return [_instance(model, row) for row in rows]


def _instance(model: type[Model], row: dict[str, Any]) -> Model:
    """The model instance of one JSON row, keyed by column: each field's value as its
    ``to_python`` reads it, the fields the query left out deferred."""
    key = (model, tuple(row))
    plan = _plans.get(key)
    if plan is None:
        plan = _plans[key] = _plan(model, row)
    attnames, converters = plan
    values = [
        DEFERRED
        if convert is None
        else (None if (value := row[column]) is None else convert(value))
        for column, convert in converters
    ]
    return model.from_db(connection.alias, attnames, values)


def _plan(model: type[Model], row: dict[str, Any]) -> tuple[list[str], list[tuple[str, Any]]]:
    """How a row of ``model`` with ``row``'s columns is read: each concrete field's column and
    the function that reads its value (None: deferred, the query left it out)."""
    fields = model._meta.concrete_fields
    converters = [
        (field.column, None if field.column not in row else _converter(field)) for field in fields
    ]
    return [field.attname for field in fields], converters


def _converter(field) -> Any:
    return _floats if isinstance(field, JSONField) else field.to_python


# How rows are read, by model and the columns a read gives (``_instance``): a few per process.
_plans: dict[tuple, tuple[list[str], list[tuple[str, Any]]]] = {}


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
