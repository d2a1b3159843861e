import pytest
from django.db import connection

from tests.chaos.histories import clean_history


@pytest.fixture
def history():
    """A clean run in the database, built through the product's services with the database's
    history guard on, and what the processor recorded of it. The test may then corrupt that
    history for the checker to find, as only a superuser's maintenance session could: the rest
    of the test runs with ``session_replication_role = replica`` (``payments.history``)."""
    built = clean_history()
    with connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = replica")
    yield built
    if connection.connection is not None and not connection.needs_rollback:
        with connection.cursor() as cursor:
            cursor.execute("RESET session_replication_role")
