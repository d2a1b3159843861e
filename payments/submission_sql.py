"""The SQL of a submission's record: its second transaction's rows in one statement.

After the processor's answer, a submission records the attempt and applies the answer under the
payment's row lock (``payments.services.submission``). Statement by statement that is ``BEGIN``,
the row lock, the attempt's insert, the move's ``UPDATE``, the merchant's event and the audit
row, ``COMMIT``: six round trips on every payment. When the payment's row is still the version
the submission's mark wrote (its ``xmin``: no one has written the row since), the service knows
what it holds without reading it, and this module writes the same rows in one statement of
data-modifying CTEs:

    WITH locked AS (SELECT the payment FOR NO KEY UPDATE WHERE id = ... AND xmin = the mark's),
         attempt AS (INSERT INTO attempts ... SELECT ..., COUNT(*) + 1 ... FROM locked
                     ON CONFLICT (payment, operation, number) DO NOTHING RETURNING ...),
         moved AS (UPDATE payment SET state ... WHERE id = ... AND EXISTS (SELECT FROM attempt)),
         merchant_event AS (INSERT INTO the merchant's event ... SELECT ... FROM attempt),
         log AS (INSERT INTO the event log ... SELECT ... FROM attempt RETURNING ...)
    SELECT the attempt's and the log row's values the database chose

Every write after the lock reads the attempt's result, so the statement writes all of it or
nothing. It writes nothing, and returns no row, when the row is not that version (another
submission marked it, an event moved it: the service then takes the path statement by
statement, which reads the row as it is), or when the attempt's number is taken: the number is
counted in the statement's snapshot, taken before any wait on the row lock, so an attempt
another submission committed during that wait is not counted: the insert then meets the
number's unique constraint and, ``ON CONFLICT DO NOTHING``, writes nothing.
"""

from datetime import timedelta
from functools import cache

from django.db import models

from payments.event_rows import Move
from payments.event_sql import _column, _connection, _insert_template, _row_params, _table
from payments.models import Payment, PaymentEvent, ProcessorAttempt
from payments.webhooks.models import Event

# What the statement returns: the attempt's id, its time and number, the database's; then, when
# it moves the payment, the audit row's id and time.
_ATTEMPT_RETURNED = ("id", "recorded_at", "attempt_number")
_LOG_RETURNED = ("id", "created_at")


def _typed(field: models.Field) -> str:
    return f"CAST(%s AS {field.cast_db_type(_connection())})"


@cache
def _locked_cte() -> str:
    """The payment's row locked, only if it is the version the mark wrote."""
    key = _column(Payment._meta.pk)
    return (
        f"locked AS (SELECT {key} FROM {_table(Payment)} "  # noqa: S608
        f"WHERE {key} = %s AND xmin = CAST(%s AS xid) FOR NO KEY UPDATE)"
    )


@cache
def _attempt_cte(vendor: str) -> tuple[str, list[models.Field]]:
    """The attempt, numbered by its insert; and the fields whose parameters it takes, in order
    (its number takes the operation's, its start the call's latency)."""
    fields, columns, _ = _insert_template(ProcessorAttempt, vendor, True)
    meta = ProcessorAttempt._meta
    payment, operation = meta.get_field("payment"), meta.get_field("operation")
    values = []
    for field in fields:
        if field.name == "attempt_number":
            values.append(
                f"(SELECT COUNT(*) + 1 FROM {_table(ProcessorAttempt)} "  # noqa: S608
                f"WHERE {_column(payment)} = locked.{_column(Payment._meta.pk)} "
                f"AND {_column(operation)} = {_typed(operation)})"
            )
        elif field.name == "started_at":
            # The record's time less the call's latency, on the database's clock.
            values.append("STATEMENT_TIMESTAMP() - CAST(%s AS interval)")
        else:
            values.append(_typed(field))
    unique = ", ".join(_column(meta.get_field(name)) for name in _attempt_number_unique())
    returned = ", ".join(_column(meta.get_field(name)) for name in _ATTEMPT_RETURNED)
    sql = (
        f"attempt AS (INSERT INTO {_table(ProcessorAttempt)} ({columns}) "  # noqa: S608
        f"SELECT {', '.join(values)} FROM locked ON CONFLICT ({unique}) DO NOTHING "
        f"RETURNING {returned})"
    )
    return sql, fields


def _attempt_number_unique() -> tuple[str, ...]:
    """The fields of the constraint that keeps an attempt's number to one row."""
    for constraint in ProcessorAttempt._meta.constraints:
        unique = isinstance(constraint, models.UniqueConstraint)
        if unique and "attempt_number" in constraint.fields:
            return tuple(constraint.fields)
    raise LookupError("ProcessorAttempt has no unique constraint on its attempt number")


def _attempt_params(attempt: ProcessorAttempt, fields: list[models.Field], db) -> list:
    params = []
    for field in fields:
        if field.name == "attempt_number":
            params.append(attempt.operation)
        elif field.name == "started_at":
            params.append(timedelta(milliseconds=attempt.latency_ms))
        else:
            params.append(field.get_db_prep_save(field.pre_save(attempt, add=True), db))
    return params


@cache
def _moved_cte(fields: tuple[str, ...]) -> tuple[str, list[models.Field]]:
    model_fields = [Payment._meta.get_field(name) for name in fields]
    sets = ", ".join(f"{_column(f)} = {_typed(f)}" for f in model_fields)
    sql = (
        f"moved AS (UPDATE {_table(Payment)} SET {sets} "  # noqa: S608
        f"WHERE {_column(Payment._meta.pk)} = %s AND EXISTS (SELECT FROM attempt))"
    )
    return sql, model_fields


@cache
def _event_cte(vendor: str) -> tuple[str, list[models.Field]]:
    fields, columns, values = _insert_template(Event, vendor, True)
    sql = (
        f"merchant_event AS (INSERT INTO {_table(Event)} ({columns}) "  # noqa: S608
        f"SELECT {values} FROM attempt)"
    )
    return sql, fields


@cache
def _log_cte(vendor: str) -> tuple[str, list[models.Field]]:
    """The audit row, its payload given the attempt's number the statement counted."""
    fields, columns, _ = _insert_template(PaymentEvent, vendor, True)
    values = []
    for field in fields:
        if field.name == "payload":
            values.append(
                f"{_typed(field)} || jsonb_build_object('attempt_number', attempt.attempt_number)"
            )
        else:
            values.append(_typed(field))
    returned = ", ".join(_column(PaymentEvent._meta.get_field(name)) for name in _LOG_RETURNED)
    sql = (
        f"log AS (INSERT INTO {_table(PaymentEvent)} ({columns}) "  # noqa: S608
        f"SELECT {', '.join(values)} FROM attempt RETURNING {returned})"
    )
    return sql, fields


@cache
def _statement(vendor: str, moved: tuple[str, ...] | None, event: bool) -> str:
    ctes = [_locked_cte(), _attempt_cte(vendor)[0]]
    attempt = ProcessorAttempt._meta
    selected = [f"attempt.{_column(attempt.get_field(n))}" for n in _ATTEMPT_RETURNED]
    source = "attempt"
    if moved is not None:
        ctes.append(_moved_cte(moved)[0])
        if event:
            ctes.append(_event_cte(vendor)[0])
        ctes.append(_log_cte(vendor)[0])
        selected += [f"log.{_column(PaymentEvent._meta.get_field(n))}" for n in _LOG_RETURNED]
        source = "attempt, log"
    return f"WITH {', '.join(ctes)} SELECT {', '.join(selected)} FROM {source}"  # noqa: S608


def move_written_whole(move: Move) -> bool:
    """Whether ``submission_write`` writes all of ``move``: the payment's fields and its
    merchant's event, and no ledger row, entry status, merchant's counts or follow-up."""
    return (
        move.ledger is None
        and move.entry_status is None
        and move.counts is None
        and not move.followups
    )


def submission_write(
    *,
    payment: Payment,
    version: str,
    attempt: ProcessorAttempt,
    move: Move | None = None,
    fields: tuple[str, ...] = (),
    log: PaymentEvent | None = None,
) -> bool:
    """Write the attempt (unsaved, its number left to the insert) and, with ``move``, the
    payment's move (its declared fields and the caller's ``fields`` of it), its merchant's event
    and the audit row ``log``, in one statement, only if the payment's row is the version
    ``version`` (its ``xmin``) and the attempt's number is free. True when written, the
    database's values (ids, times, the attempt's number, the log's payload's) set on the rows;
    False when nothing was written. A move that writes more (a ledger row, an entry's status, a
    merchant's counts, follow-ups) is the caller's to write statement by statement."""
    if move is not None and not move_written_whole(move):
        raise ValueError("a move with rows of money is written statement by statement")
    db = _connection()
    moved = (*move.FIELDS, *fields) if move is not None else None
    event = move is not None and move.event is not None
    sql = _statement(db.vendor, moved, event)
    pk = Payment._meta.pk.get_db_prep_value(payment.pk, db)
    params = [pk, version]
    _, attempt_fields = _attempt_cte(db.vendor)
    params += _attempt_params(attempt, attempt_fields, db)
    if move is not None:
        _, model_fields = _moved_cte(moved)
        params += [*_row_params(payment, model_fields, db, add=False), pk]
        if event:
            params += _row_params(move.event, _event_cte(db.vendor)[1], db)
        params += _row_params(log, _log_cte(db.vendor)[1], db)
    with db.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        return False
    written = [(attempt, ProcessorAttempt, _ATTEMPT_RETURNED)]
    if move is not None:
        written.append((log, PaymentEvent, _LOG_RETURNED))
    values = iter(row)
    for instance, model, names in written:
        for name in names:
            field = model._meta.get_field(name)
            value = next(values)
            for convert in field.get_db_converters(db):
                value = convert(value, field, db)
            setattr(instance, field.attname, value)
        instance._state.adding, instance._state.db = False, db.alias
    if log is not None:
        log.payload["attempt_number"] = attempt.attempt_number
    if event:
        move.event._state.adding, move.event._state.db = False, db.alias
    return True
