"""Telling a database outage from a failure of the message's work.

An outage is not the message's fault: a message that meets one is neither retried nor
dead-lettered but held back, untouched, until the database answers (``Hand.hold_back``). Every
part of the worker that touches the database asks ``is_outage`` before it records a failure.
"""

from __future__ import annotations

from django.db import DatabaseError, DataError, InterfaceError, OperationalError, connection


class DatabaseDown(Exception):
    """The database does not answer (not: it refused a value). Raised through a batch, whose
    unfinished messages are then held back until it answers again."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


def database_answers() -> bool:
    """Does the database answer a trivial query now? An ``OperationalError`` alone does not
    say: a lock timeout or a deadlock is one too, with the database there."""
    try:
        if not connection.in_atomic_block:
            connection.close()  # a broken connection would keep failing; open a fresh one
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return True
    except DatabaseError:
        return False


def is_outage(exc: BaseException) -> bool:
    """``exc`` is the database being unreachable, not a failure of the message's work."""
    return isinstance(exc, OperationalError | InterfaceError) and not database_answers()


def refused_content(exc: BaseException) -> bool:
    """A data exception (SQLSTATE class 22) or an encoding error: the value was refused, the
    database was there to refuse it."""
    return isinstance(exc, DataError | UnicodeError)
