import pytest

from payments import event_sql
from payments.services import writes


@pytest.fixture(params=["one statement", "statement by statement"])
def event_write_path(request, monkeypatch):
    """Run a test of applying events on both backends of the event write: PostgreSQL's single
    statement (payments.event_sql) and the portable sequence the quick start's SQLite takes,
    whose payment is also locked by the ORM's query rather than the precompiled one."""
    if request.param == "statement by statement":
        monkeypatch.setattr(writes, "_one_statement", lambda: False)
        monkeypatch.setattr(event_sql, "_lock_template", lambda vendor: None)
    return request.param


# The webhook tests' receiver and settings (tests/payments/webhook_support.py).
from tests.payments.webhook_support import loopback_webhooks, receiver  # noqa: E402, F401
