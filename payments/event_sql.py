"""The SQL of a processor event's rows: the PostgreSQL backend of the event write.

``payments.services.payment_apply_event`` decides, under the payment's row lock and with the
state machine, what an event does, and declares it as one ``EventWrite``
(``payments.services.writes``); this module only writes that declaration. The rows are built
as unsaved model instances by the service, so every value (defaults, ``auto_now``, JSON and
decimal adaptation) comes from the models' own fields, except a column with a database default
(``db_default``: the audit times, on the database's clock), which the insert leaves to the
database; and one statement of data-modifying CTEs writes them:

    WITH claim AS (INSERT INTO dedup record ... ON CONFLICT DO NOTHING RETURNING 1),
         moved AS (UPDATE payment SET state ... WHERE id = ... AND EXISTS (SELECT FROM claim)),
         ledger AS (INSERT INTO ledger ... SELECT ... FROM claim),
         entry AS (UPDATE ledger SET status ... WHERE ... AND EXISTS (SELECT FROM claim)),
         counted AS (INSERT INTO merchant day ... SELECT ... FROM claim ON CONFLICT DO UPDATE),
         merchant_event AS (INSERT INTO the merchant's event ... SELECT ... FROM claim)
    INSERT INTO event log ... SELECT ... FROM claim RETURNING id

Every write after the claim reads the claim's result, so when the dedup record already exists
nothing at all is written and the statement returns no row. One round trip instead of five:
the worker applies events in batches, and each round trip to PostgreSQL and each ORM
statement built in Python was most of an event's cost (docs/benchmarks.md). Other databases
write the same rows one by one after ``processed_event_claim`` (the portable backend, in
``payments.services.writes``); the merchant-day counter's upsert (``merchant_day_add_sql``)
serves both. Each CTE is built with the function that gives its parameters, so the order of the
parameters is the order of the CTEs by construction.
"""

import uuid
from collections.abc import Callable
from functools import cache, lru_cache

from django.db import connection, connections, models
from django.db.transaction import TransactionManagementError

from payments.event_rows import RETURN_DAY_COUNTERS, EventWrite
from payments.models import (
    Event,
    LedgerEntry,
    LedgerEntryStatus,
    MerchantReturnDay,
    Payment,
    PaymentEvent,
    ProcessedEvent,
)


def _table(model: type[models.Model]) -> str:
    return connection.ops.quote_name(model._meta.db_table)


def _column(field: models.Field) -> str:
    return connection.ops.quote_name(field.column)


@cache
def _insert_template(
    model: type[models.Model], vendor: str, typed: bool
) -> tuple[list[models.Field], str, str]:
    """The fields of an insert into ``model`` (an auto primary key and the columns with a
    database default are left to the database), their quoted column list and their
    placeholders: typed (``CAST(%s AS type)``, as a select list over a CTE needs) or plain.
    Built once per model: it is on every event's path."""
    fields = [
        f
        for f in model._meta.concrete_fields
        if not isinstance(f, models.AutoField) and not f.has_db_default()
    ]
    columns = ", ".join(_column(f) for f in fields)
    if typed:
        values = ", ".join(f"CAST(%s AS {f.cast_db_type(connection)})" for f in fields)
    else:
        values = ", ".join(["%s"] * len(fields))
    return fields, columns, values


def _connection():
    """This thread's default connection itself, not the ``connection`` proxy, which looks the
    thread's connection up again on every attribute: the hot paths below touch it per value."""
    return connections[connection.alias]


def _compiled(queryset: models.QuerySet) -> tuple[str, list, tuple[str, ...], tuple] | None:
    """The ORM's own statement of ``queryset`` (compiled on this thread's connection, inside the
    caller's transaction, as FOR UPDATE must be), its parameters, the attribute names of its
    columns and the fields' own converters from the database's value (a JSON column's,
    ``Payment.metadata``), applied as the ORM applies them; None where the database backend
    converts a column itself (then the ORM must build the instances, with this thread's
    connection)."""
    compiler = queryset.query.get_compiler(connection=connection)
    sql, params = compiler.as_sql()
    columns = [column for column, _, _ in compiler.select]
    if any(connection.ops.get_db_converters(column) for column in columns):
        return None
    converters = tuple(
        (index, tuple(column.get_db_converters(connection)), column)
        for index, column in enumerate(columns)
        if column.get_db_converters(connection)
    )
    return sql, list(params), tuple(column.target.attname for column in columns), converters


def _from_rows(model: type[models.Model], db, attnames, converters, rows) -> list:
    """Instances of ``model`` from the rows of a compiled statement, as the ORM builds them."""
    instances = []
    for row in rows:
        if converters:
            row = list(row)
            for index, functions, column in converters:
                for convert in functions:
                    row[index] = convert(row[index], column, db)
        instances.append(model.from_db(db.alias, attnames, row))
    return instances


@cache
def _lock_template(vendor: str) -> tuple[str, tuple[str, ...], tuple] | None:
    """The ORM's own ``select_for_update(no_key=True).get(pk=...)`` statement for a payment
    (``FOR NO KEY UPDATE``, see ``payments.services.writes.payment_lock``), compiled
    once (``_compiled``)."""
    compiled = _compiled(Payment.objects.select_for_update(no_key=True).filter(pk=uuid.UUID(int=0)))
    if compiled is None:
        return None
    sql, _, attnames, converters = compiled
    return sql, attnames, converters


# The placeholder ids a queryset of ``rows_select_for_update`` is compiled with: no payment's.
_PLACEHOLDER_IDS = tuple(uuid.UUID(int=i + 1) for i in range(64))


@lru_cache(maxsize=64)
def _locks_template(
    build: Callable[[list[uuid.UUID]], models.QuerySet], count: int, vendor: str
) -> tuple[type[models.Model], str, tuple, tuple[str, ...], tuple] | None:
    """``build``'s queryset for ``count`` ids, compiled once per count (``_compiled``), with
    each of its parameters either the index of the id it takes or a constant of the query."""
    placeholders = list(_PLACEHOLDER_IDS[:count])
    queryset = build(placeholders)
    compiled = _compiled(queryset)
    if compiled is None:
        return None
    sql, params, attnames, converters = compiled
    slots = tuple(
        ("id", placeholders.index(p)) if p in placeholders else ("constant", p) for p in params
    )
    if sum(kind == "id" for kind, _ in slots) < count:
        return None  # an id the query did not take as a parameter: leave it to the ORM
    return queryset.model, sql, slots, attnames, converters


def rows_select_for_update(
    build: Callable[[list[uuid.UUID]], models.QuerySet],
    ids: list[uuid.UUID],
    *,
    along: tuple[Callable[[str], str], list] | None = None,
) -> list[models.Model]:
    """What ``list(build(ids))`` returns (a queryset locking rows by ``ids``, a module-level
    function), without compiling the ORM's query again for every call: the statement is the
    ORM's own, compiled once per number of ids, its ids substituted. It was a tenth of the
    worker's CPU per batch of processor events. Call inside a transaction.

    ``along``: a statement over the locked rows (a function of the relation it reads them
    from) and its parameters, run in the same statement as a data-modifying CTE over them
    (``WITH locked AS (...), along AS (...) SELECT * FROM locked``): one round trip fewer. It
    must read every locked row before it writes (a sort or an aggregate does), so that every
    row of ``build`` is locked before any row it writes; where the ORM builds the rows itself
    it runs after them, over the table."""
    db = _connection()
    if db.get_autocommit():  # as the ORM refuses: a lock that ends with its statement
        raise TransactionManagementError("a row lock needs a transaction")
    template = (
        _locks_template(build, len(ids), db.vendor) if len(ids) <= len(_PLACEHOLDER_IDS) else None
    )
    if template is None:
        rows = list(build(ids))
        if along is not None:
            along_sql, along_params = along
            with db.cursor() as cursor:
                cursor.execute(along_sql(_table(build(ids[:0]).model)), along_params)
        return rows
    model, sql, slots, attnames, converters = template
    params = [ids[value] if kind == "id" else value for kind, value in slots]
    if along is not None:
        along_sql, along_params = along
        sql = f"WITH locked AS ({sql}), along AS ({along_sql('locked')}) SELECT * FROM locked"
        params += along_params
    with db.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    return _from_rows(model, db, attnames, converters, rows)


def payment_select_for_update(payment_id) -> Payment:
    """The payment, its row locked for this transaction: what ``Payment.objects.
    select_for_update(no_key=True).get(pk=payment_id)`` returns (``Payment.DoesNotExist`` included),
    without compiling that query again for every event; it was a sixth of an event's cost in
    the worker. Call inside a transaction; ``payments.services.writes.payment_lock`` is the
    lock the services take."""
    db = _connection()
    if db.get_autocommit():  # as the ORM refuses: a lock that ends with its statement
        raise TransactionManagementError("the payment's row lock needs a transaction")
    template = _lock_template(db.vendor)
    if template is None:
        return Payment.objects.select_for_update(no_key=True).get(pk=payment_id)
    sql, attnames, converters = template
    with db.cursor() as cursor:
        cursor.execute(sql, [Payment._meta.pk.get_db_prep_value(payment_id, db)])
        row = cursor.fetchone()
    if row is None:
        raise Payment.DoesNotExist(f"no payment {payment_id}")
    return _from_rows(Payment, db, attnames, converters, [row])[0]


def _row_params(row: models.Model, fields, db, *, add: bool = True) -> list:
    """The database values of ``fields`` of ``row``: defaults, ``auto_now`` and adaptation, as
    the ORM's own save computes them."""
    return [f.get_db_prep_save(f.pre_save(row, add=add), db) for f in fields]


def _insert_parts(row: models.Model, *, typed: bool = True) -> tuple[str, str, list]:
    """The column list, placeholders and parameters of an insert of the unsaved ``row``; its
    values come from its fields (defaults, ``auto_now_add``, adaptation), except the columns
    the database fills itself (``_insert_template``)."""
    fields, columns, values = _insert_template(type(row), connection.vendor, typed)
    return columns, values, _row_params(row, fields, connection)


def _claim_sql(columns: str, values: str) -> str:
    """Insert a dedup record unless its id is known, returning a row only when it inserted."""
    key = _column(ProcessedEvent._meta.pk)
    return (
        f"INSERT INTO {_table(ProcessedEvent)} ({columns}) VALUES ({values}) "  # noqa: S608
        f"ON CONFLICT ({key}) DO NOTHING RETURNING 1"
    )


def processed_event_claim(claim: ProcessedEvent) -> bool:
    """Insert the dedup record ``claim`` unless its id is known; True when this call inserted
    it. The portable form of the claim, for databases that write an event's rows one by one."""
    columns, values, params = _insert_parts(claim, typed=False)
    with connection.cursor() as cursor:
        cursor.execute(_claim_sql(columns, values), params)
        return cursor.fetchone() is not None


def merchant_day_add_sql(source: str) -> str:
    """The upsert adding to a merchant's day counters. ``source`` is a ``VALUES`` or ``SELECT``
    of (merchant_id, day, then each of RETURN_DAY_COUNTERS); two transactions adding to the same
    day both count, without a read-modify-write race."""
    table = _table(MerchantReturnDay)
    updates = ", ".join(f"{c} = {table}.{c} + EXCLUDED.{c}" for c in RETURN_DAY_COUNTERS)
    return (
        f"INSERT INTO {table} (merchant_id, day, {', '.join(RETURN_DAY_COUNTERS)}) "  # noqa: S608
        f"{source} ON CONFLICT (merchant_id, day) DO UPDATE SET {updates}"
    )


def merchant_days_lock_sql(source: str | None = None) -> str:
    """The upsert that locks, in (merchant, day) order, the counters' rows of the merchants of
    the payments ``%s`` (an array of ids) for the day ``%s`` and the database's UTC day (the
    same but around midnight), creating at zero those not there yet. Taken before any counter
    of a batch is added to: two batches adding to the same merchants' days in different orders
    would otherwise each hold a row the other waits for (a deadlock PostgreSQL ends by killing
    one). ``source``: where the payments' rows are read (the payments table, or the rows a
    statement has just locked: ``rows_select_for_update``'s ``along``); its ``ORDER BY`` reads
    all of them before the first counter's row is written."""
    table = _table(MerchantReturnDay)
    zeros = ", ".join("0" for _ in RETURN_DAY_COUNTERS)
    first = RETURN_DAY_COUNTERS[0]
    return (
        f"INSERT INTO {table} (merchant_id, day, {', '.join(RETURN_DAY_COUNTERS)}) "  # noqa: S608
        f"SELECT merchant.id, day.value, {zeros} "
        f"FROM (SELECT DISTINCT merchant_id FROM {source or _table(Payment)} WHERE id = ANY(%s)) "
        "AS merchant(id) CROSS JOIN (SELECT DISTINCT unnest(ARRAY[CAST(%s AS date), "
        "CAST(now() AT TIME ZONE 'UTC' AS date)])) AS day(value) "
        "ORDER BY merchant.id, day.value "
        f"ON CONFLICT (merchant_id, day) DO UPDATE SET {first} = {table}.{first}"
    )


# The parameters of one part of the statement, read from the declared write.
_Params = Callable[["EventWrite", object], list]


def _claim_cte(vendor: str) -> tuple[str, _Params]:
    """Claim the dedup record: every other part reads this one's result."""
    fields, columns, values = _insert_template(ProcessedEvent, vendor, True)

    def params(write: "EventWrite", db) -> list:
        return _row_params(write.claim, fields, db)

    return f"claim AS ({_claim_sql(columns, values)})", params


def _moved_cte(fields: tuple[str, ...]) -> tuple[str, _Params]:
    """The payment's move (the ``fields`` the move declares), written only if claimed."""
    model_fields = [Payment._meta.get_field(name) for name in fields]
    sets = ", ".join(
        f"{_column(f)} = CAST(%s AS {f.cast_db_type(connection)})" for f in model_fields
    )
    key = _column(Payment._meta.pk)
    sql = (
        f"moved AS (UPDATE {_table(Payment)} SET {sets} "  # noqa: S608
        f"WHERE {key} = %s AND EXISTS (SELECT FROM claim))"
    )

    def params(write: "EventWrite", db) -> list:
        payment = write.move.payment
        return [
            *_row_params(payment, model_fields, db, add=False),
            Payment._meta.pk.get_db_prep_value(payment.pk, db),
        ]

    return sql, params


def _ledger_cte(vendor: str) -> tuple[str, _Params]:
    """The move's ledger row, written only if claimed."""
    fields, columns, values = _insert_template(LedgerEntry, vendor, True)
    sql = (
        f"ledger AS (INSERT INTO {_table(LedgerEntry)} ({columns}) "  # noqa: S608
        f"SELECT {values} FROM claim)"
    )

    def params(write: "EventWrite", db) -> list:
        return _row_params(write.move.ledger, fields, db)

    return sql, params


def _event_cte(vendor: str) -> tuple[str, _Params]:
    """The move's merchant event (``payments.webhooks``), written only if claimed."""
    fields, columns, values = _insert_template(Event, vendor, True)
    sql = (
        f"merchant_event AS (INSERT INTO {_table(Event)} ({columns}) "  # noqa: S608
        f"SELECT {values} FROM claim)"
    )

    def params(write: "EventWrite", db) -> list:
        return _row_params(write.move.event, fields, db)

    return sql, params


def _entry_cte() -> tuple[str, _Params]:
    """The move's pending entry to its new status (money out's, posted or archived), if
    claimed; ``posted_at`` is set only when the move gives one."""
    status = LedgerEntry._meta.get_field("status")
    posted_at = LedgerEntry._meta.get_field("posted_at")
    payment, kind = LedgerEntry._meta.get_field("payment"), LedgerEntry._meta.get_field("kind")
    text = status.cast_db_type(connection)
    sql = (
        f"entry AS (UPDATE {_table(LedgerEntry)} SET {_column(status)} = CAST(%s AS {text}), "  # noqa: S608
        f"{_column(posted_at)} = COALESCE(CAST(%s AS {posted_at.cast_db_type(connection)}), "
        f"{_column(posted_at)}) WHERE {_column(payment)} = %s AND {_column(kind)} = %s "
        f"AND {_column(status)} = %s AND EXISTS (SELECT FROM claim))"
    )

    def params(write: "EventWrite", db) -> list:
        entry = write.move.entry_status
        return [
            entry.status,
            posted_at.get_db_prep_value(entry.posted_at, db),
            Payment._meta.pk.get_db_prep_value(write.move.payment.pk, db),
            entry.kind,
            LedgerEntryStatus.PENDING,
        ]

    return sql, params


def _counted_cte() -> tuple[str, _Params]:
    """Add the move's counts to the merchant's day (the return-rate counters), if claimed."""
    counters = ", ".join(["CAST(%s AS integer)"] * len(RETURN_DAY_COUNTERS))
    source = f"SELECT CAST(%s AS varchar), CAST(%s AS date), {counters} FROM claim"

    def params(write: "EventWrite", db) -> list:
        return write.move.counts.params()

    return f"counted AS ({merchant_day_add_sql(source)})", params


@cache
def _log_returned() -> tuple[models.Field, ...]:
    """What the event-log insert returns: its id and the values the database chose (its
    ``created_at``, on the database's clock), as the ORM's own insert returns them."""
    return (
        PaymentEvent._meta.pk,
        *(f for f in PaymentEvent._meta.concrete_fields if f.has_db_default()),
    )


def _log_insert(vendor: str, ctes: list[str]) -> tuple[str, _Params]:
    """The statement itself: the event-log row after ``ctes``, written only if claimed; it
    returns the row's id and database defaults (``_log_returned``)."""
    fields, columns, values = _insert_template(PaymentEvent, vendor, True)
    returned = ", ".join(_column(f) for f in _log_returned())
    sql = (
        f"WITH {', '.join(ctes)} INSERT INTO {_table(PaymentEvent)} ({columns}) "  # noqa: S608
        f"SELECT {values} FROM claim RETURNING {returned}"
    )

    def params(write: "EventWrite", db) -> list:
        return _row_params(write.log, fields, db)

    return sql, params


@cache
def _event_statement(
    vendor: str,
    *,
    moved: tuple[str, ...] | None,
    ledger: bool,
    counted: bool,
    entry: bool = False,
    event: bool = False,
) -> tuple[str, tuple[_Params, ...]]:
    """The one statement of ``event_write`` for one shape of write, and the functions giving
    its parameters in the statement's order, built together once: the statement text is the
    same for every write of a shape, only the parameters change."""
    parts = [_claim_cte(vendor)]
    if moved is not None:
        parts.append(_moved_cte(moved))
    if ledger:
        parts.append(_ledger_cte(vendor))
    if entry:
        parts.append(_entry_cte())
    if counted:
        parts.append(_counted_cte())
    if event:
        parts.append(_event_cte(vendor))
    sql, log_params = _log_insert(vendor, [cte for cte, _ in parts])
    return sql, (*(params for _, params in parts), log_params)


def event_write(write: "EventWrite") -> bool:
    """Write the dedup record ``write.claim`` and, only if it was new, the payment's move (its
    declared fields, its ledger row or its pending entry's status, its counts on the merchant's
    day) and the event-log row ``write.log`` (whose primary key is set), in one statement. True
    when written, False when the dedup record existed already and nothing was written. Call
    inside the payment's transaction."""
    db = _connection()
    move = write.move
    sql, parts = _event_statement(
        db.vendor,
        moved=move.FIELDS if move is not None else None,
        ledger=move is not None and move.ledger is not None,
        counted=move is not None and move.counts is not None,
        entry=move is not None and move.entry_status is not None,
        event=move is not None and move.event is not None,
    )
    params = [value for part in parts for value in part(write, db)]
    with db.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        return False
    log = write.log
    for field, value in zip(_log_returned(), row, strict=True):
        for convert in field.get_db_converters(db):
            value = convert(value, field, db)
        setattr(log, field.attname, value)
    log._state.adding, log._state.db = False, db.alias
    return True
