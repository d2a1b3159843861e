import pytest

from payments import services


@pytest.fixture(params=["one statement", "statement by statement"])
def event_write_path(request, monkeypatch):
    """Run a test of applying events on both ways its rows are written: PostgreSQL's single
    statement (payments.event_sql) and the portable sequence the quick start's SQLite takes."""
    if request.param == "statement by statement":
        monkeypatch.setattr(services, "_event_rows_in_one_statement", lambda: False)
    return request.param
