"""Tests only: rewriting history the database guards (``payments.history``), as a superuser's
deliberate maintenance session may, to age rows or to corrupt them for a checker to find."""

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connection, transaction


@contextmanager
def history_rewritten() -> Iterator[None]:
    """The block's writes with ``session_replication_role = replica``: PostgreSQL fires no
    ordinary trigger, the history guard included. Back to the default when the block ends."""
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL session_replication_role = replica")
        yield
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL session_replication_role = DEFAULT")
