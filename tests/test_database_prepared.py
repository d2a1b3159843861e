"""The database connection's options on PostgreSQL: parameters bound by the server, and a
statement run five times on a connection prepared there (Django turns psycopg's preparing off
unless the settings name a threshold), so the server parses and plans it once per connection."""

import pytest
from django.db import connection

from tests.test_settings_environment import base_settings_process

pytestmark = pytest.mark.django_db


def prepared_on_server() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cursor.fetchall()]


def test_a_statement_run_five_times_is_prepared_on_the_server():
    marker = "SELECT %s::int + 41 AS prepared_marker"
    for _ in range(4):
        with connection.cursor() as cursor:
            cursor.execute(marker, [1])
    assert not [s for s in prepared_on_server() if "prepared_marker" in s]

    for _ in range(2):
        with connection.cursor() as cursor:
            cursor.execute(marker, [1])
            assert cursor.fetchone() == (42,)

    assert [s for s in prepared_on_server() if "prepared_marker" in s]


@pytest.mark.parametrize(
    ("variables", "threshold"),
    [
        ({}, 5),
        ({"DATABASE_PREPARE_THRESHOLD": "12"}, 12),
        ({"DATABASE_PREPARE_THRESHOLD": "0"}, None),
        ({"DATABASE_SERVER_SIDE_BINDING": "false"}, None),
    ],
)
def test_the_threshold_comes_from_the_environment(variables, threshold):
    code = (
        "from django.conf import settings; "
        "print(settings.DATABASES['default']['OPTIONS'].get('prepare_threshold'))"
    )
    done = base_settings_process(
        code, DATABASE_URL="postgres://postgres@127.0.0.1:5432/x", **variables
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == str(threshold)


@pytest.mark.parametrize("value", ["-1", "five", "2.5", "\u0665", ""])
def test_a_threshold_that_is_not_a_whole_number_stops_start_up_naming_it(value):
    done = base_settings_process(
        "print('started')",
        DATABASE_URL="postgres://postgres@127.0.0.1:5432/x",
        DATABASE_PREPARE_THRESHOLD=value,
    )
    assert done.returncode != 0 and "started" not in done.stdout
    assert "DATABASE_PREPARE_THRESHOLD must be a whole number" in done.stderr
    assert repr(value.strip()) in done.stderr
