"""Copies of the process's test database, taken and put back whole, for the tests that take its
schema back to an older migration.

Migrating the test database back to a release and forward again costs Django's migration
executor 5 to 7 s each way (it renders the models' states migration by migration), and each
such test did both. A module takes the schema back once, copies the database
(``snapshot``: PostgreSQL's ``CREATE DATABASE ... TEMPLATE``, under a second), and each of its
tests starts from that copy (``restore``) and leaves the newest schema by restoring the copy made
before (no forward migration to undo what it did). A restore drops the test database and makes
it again from the copy: the same tables, rows, sequences and migration records; the process's
own connection is closed first and opens again on the new database at its next query.

    newest = snapshot("newest")
    migrate_back()
    released = snapshot("released")
    ...
    restore(released)   # a test's start
    restore(newest)     # its end, whatever it did
    drop(newest, released)
"""

import contextlib
from collections.abc import Callable, Iterator
from typing import TypeVar

import psycopg
from django.contrib.contenttypes.models import ContentType
from django.db import connection


def _server() -> str:
    """The URL of the test database's server's ``postgres`` database."""
    db = connection.settings_dict
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    host = db["HOST"] or "127.0.0.1"
    return f"postgres://{db['USER']}{password}@{host}:{db['PORT'] or 5432}/postgres"


@contextlib.contextmanager
def _alone():
    """An administrative connection, with every session on the test database ended: this
    process's own (closed) and any left by what a test started."""
    connection.close()
    with psycopg.connect(_server(), autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            [connection.settings_dict["NAME"]],
        )
        yield admin


def snapshot(suffix: str) -> str:
    """A copy of the test database as it is now, named after it; its name."""
    name = f"{connection.settings_dict['NAME']}_{suffix}"
    with _alone() as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{connection.settings_dict["NAME"]}"')
    return name


def restore(copy: str) -> None:
    """The test database made again from ``copy``, committing as the suite's test databases
    do (``synchronous_commit = off``, a setting no copy carries; tests/conftest.py)."""
    database = connection.settings_dict["NAME"]
    with _alone() as admin:
        admin.execute(f'DROP DATABASE "{database}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{database}" TEMPLATE "{copy}"')
        admin.execute(f'ALTER DATABASE "{database}" SET synchronous_commit = off')
    # Content types are cached by id and by model: the copy's may differ from what was read.
    ContentType.objects.clear_cache()


def drop(*copies: str) -> None:
    with psycopg.connect(_server(), autocommit=True) as admin:
        for copy in copies:
            admin.execute(f'DROP DATABASE IF EXISTS "{copy}" WITH (FORCE)')


T = TypeVar("T")


@contextlib.contextmanager
def taken_back(blocker, suffix: str, migrate_back: Callable[[], T]) -> Iterator[tuple[str, str, T]]:
    """For a module's fixture: the test database taken back once (``migrate_back``) and copied
    there as ``suffix``, beside a copy of it at the newest schema; yields (that copy, the newest
    copy, what ``migrate_back`` returned). At the end the newest schema is put back and both
    copies dropped, whatever happened. ``blocker``: pytest-django's ``django_db_blocker``."""
    copies = []
    try:
        with blocker.unblock():
            copies.append(newest := snapshot("newest"))
            result = migrate_back()
            copies.append(back := snapshot(suffix))
        yield back, newest, result
    finally:
        with blocker.unblock():
            if copies:
                restore(newest)
            drop(*copies)
