import pytest


@pytest.fixture
def key_holder_calls(monkeypatch) -> list[tuple[str, bool]]:
    """Each call of the settings key holder's ``wrap`` and ``unwrap``, as (name, whether a
    transaction was open): the holder may be KMS, a network away, so no transaction (nor row
    lock) may be held across it."""
    from django.db import connection

    from bank.vault.crypto import SettingsKeyProvider

    calls: list[tuple[str, bool]] = []
    for name in ("wrap", "unwrap"):
        method = getattr(SettingsKeyProvider, name)

        def watched(self, *args, _method=method, _name=name, **kwargs):
            calls.append((_name, connection.in_atomic_block))
            return _method(self, *args, **kwargs)

        monkeypatch.setattr(SettingsKeyProvider, name, watched)
    return calls
