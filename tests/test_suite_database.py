"""The suite's test database commits without waiting for its flush to disk (tests/conftest.py's
``django_db_setup``): this process's connection and any other one a test's processes open."""

import psycopg
import pytest
from django.db import connection


def show_synchronous_commit(cursor) -> str:
    cursor.execute("SHOW synchronous_commit")
    return cursor.fetchone()[0]


@pytest.mark.django_db(transaction=True)
def test_the_test_database_commits_without_waiting_for_the_flush():
    with connection.cursor() as cursor:
        assert show_synchronous_commit(cursor) == "off"


@pytest.mark.django_db(transaction=True)
def test_a_new_connection_to_the_test_database_gets_the_setting_from_the_database():
    db = connection.settings_dict
    with psycopg.connect(
        host=db["HOST"] or "127.0.0.1",
        port=db["PORT"] or 5432,
        user=db["USER"],
        password=db["PASSWORD"] or None,
        dbname=db["NAME"],
    ) as other:
        assert show_synchronous_commit(other.cursor()) == "off"
        # The server's own default is untouched: another database commits as before.
        with psycopg.connect(
            host=db["HOST"] or "127.0.0.1",
            port=db["PORT"] or 5432,
            user=db["USER"],
            password=db["PASSWORD"] or None,
            dbname="postgres",
        ) as server:
            assert show_synchronous_commit(server.cursor()) == "on"
