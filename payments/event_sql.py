"""The rows of one applied processor event, written in one PostgreSQL statement.

``payments.services.payment_apply_event`` decides, under the payment's row lock and with the
state machine, what an event does; this module only writes that decision. The rows are built
as unsaved model instances by the service, so every value (defaults, ``auto_now``, JSON and
decimal adaptation) comes from the models' own fields, and one statement of data-modifying
CTEs writes them:

    WITH claim AS (INSERT INTO dedup record ... ON CONFLICT DO NOTHING RETURNING 1),
         moved AS (UPDATE payment SET state ... WHERE id = ... AND EXISTS (SELECT FROM claim)),
         ledger AS (INSERT INTO ledger ... SELECT ... FROM claim),
         counted AS (INSERT INTO merchant day ... SELECT ... FROM claim ON CONFLICT DO UPDATE)
    INSERT INTO event log ... SELECT ... FROM claim RETURNING id

Every write after the claim reads the claim's result, so when the dedup record already exists
nothing at all is written and the statement returns no row. One round trip instead of five:
the worker applies events in batches, and each round trip to PostgreSQL and each ORM
statement built in Python was most of an event's cost (docs/benchmarks.md).
"""

from django.db import connection, models

from payments.models import LedgerEntry, MerchantReturnDay, Payment, PaymentEvent, ProcessedEvent


def _table(model: type[models.Model]) -> str:
    return connection.ops.quote_name(model._meta.db_table)


def _column(field: models.Field) -> str:
    return connection.ops.quote_name(field.column)


def _insert_parts(row: models.Model) -> tuple[str, str, list]:
    """The quoted column list, a select list of typed placeholders and the parameters of an
    insert of the unsaved ``row`` (an auto primary key is left to the database)."""
    fields = [f for f in row._meta.concrete_fields if not isinstance(f, models.AutoField)]
    params = [f.get_db_prep_save(f.pre_save(row, add=True), connection) for f in fields]
    columns = ", ".join(_column(f) for f in fields)
    values = ", ".join(f"CAST(%s AS {f.cast_db_type(connection)})" for f in fields)
    return columns, values, params


def _moved_part(payment: Payment) -> tuple[str, list]:
    """The payment's new state, its change time and ``updated_at``, written only if claimed."""
    names = ("state", "state_changed_at", "updated_at")
    fields = [Payment._meta.get_field(name) for name in names]
    sets = ", ".join(f"{_column(f)} = CAST(%s AS {f.cast_db_type(connection)})" for f in fields)
    params = [f.get_db_prep_save(f.pre_save(payment, add=False), connection) for f in fields]
    key = _column(Payment._meta.pk)
    sql = (
        f"moved AS (UPDATE {_table(Payment)} SET {sets} "  # noqa: S608
        f"WHERE {key} = %s AND EXISTS (SELECT FROM claim))"
    )
    return sql, [*params, Payment._meta.pk.get_db_prep_value(payment.pk, connection)]


def _counted_part(merchant_id: str, day) -> tuple[str, list]:
    """One more settled debit on the merchant's day (the return-rate counters), if claimed."""
    table = _table(MerchantReturnDay)
    sql = (
        f"counted AS (INSERT INTO {table} "  # noqa: S608
        "(merchant_id, day, debits, returns, unauthorized_returns, administrative_returns) "
        "SELECT CAST(%s AS varchar), CAST(%s AS date), 1, 0, 0, 0 FROM claim "
        f"ON CONFLICT (merchant_id, day) DO UPDATE SET debits = {table}.debits + 1)"
    )
    return sql, [merchant_id, day]


def event_rows_insert(
    *,
    claim: ProcessedEvent,
    log: PaymentEvent,
    payment: Payment | None = None,
    ledger: LedgerEntry | None = None,
    debits_day=None,
) -> bool:
    """Write the dedup record ``claim`` and, only if it was new, the payment's move (its state
    when ``payment`` is given, the ``ledger`` row, one settled debit on ``debits_day``) and the
    event-log row ``log`` (whose primary key is set). True when written, False when the dedup
    record existed already and nothing was written. Call inside the payment's transaction."""
    columns, values, params = _insert_parts(claim)
    key = _column(ProcessedEvent._meta.pk)
    ctes = [
        f"claim AS (INSERT INTO {_table(ProcessedEvent)} ({columns}) "  # noqa: S608
        f"VALUES ({values}) ON CONFLICT ({key}) DO NOTHING RETURNING 1)"
    ]
    if payment is not None:
        sql, part = _moved_part(payment)
        ctes.append(sql)
        params += part
    if ledger is not None:
        columns, values, part = _insert_parts(ledger)
        ctes.append(
            f"ledger AS (INSERT INTO {_table(LedgerEntry)} ({columns}) "  # noqa: S608
            f"SELECT {values} FROM claim)"
        )
        params += part
    if debits_day is not None:
        sql, part = _counted_part(log.payment.merchant_id, debits_day)
        ctes.append(sql)
        params += part
    columns, values, part = _insert_parts(log)
    log_key = _column(PaymentEvent._meta.pk)
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH {', '.join(ctes)} INSERT INTO {_table(PaymentEvent)} ({columns}) "  # noqa: S608
            f"SELECT {values} FROM claim RETURNING {log_key}",
            [*params, *part],
        )
        row = cursor.fetchone()
    if row is None:
        return False
    log.pk = row[0]
    log._state.adding, log._state.db = False, connection.alias
    return True
