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


@pytest.fixture
def key_holder_calls(monkeypatch) -> list[tuple[str, bool]]:
    """Each call of the settings key holder's ``wrap`` and ``unwrap``, as (name, whether a
    transaction was open): the holder may be KMS, a network away, so no transaction (nor row
    lock) may be held across it."""
    from django.db import connection

    from payments.vault.crypto import SettingsKeyProvider

    calls: list[tuple[str, bool]] = []
    for name in ("wrap", "unwrap"):
        method = getattr(SettingsKeyProvider, name)

        def watched(self, *args, _method=method, _name=name, **kwargs):
            calls.append((_name, connection.in_atomic_block))
            return _method(self, *args, **kwargs)

        monkeypatch.setattr(SettingsKeyProvider, name, watched)
    return calls
