"""The bank path's settings are checked at start-up like every other, and the vault's keys are
never printed, not even when refused."""

import base64

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from tests.bank.nacha.conftest import ORIGINATOR_SETTING


def _refused(module_settings, name, value) -> str:
    setattr(module_settings, name, value)
    with pytest.raises(SystemCheckError) as refused:
        call_command("check")
    return str(refused.value)


@pytest.mark.parametrize(
    ("name", "value", "problem"),
    [
        (
            "NACHA_ORIGINATOR",
            ORIGINATOR_SETTING | {"odfi_routing_number": "021000022"},
            "odfi_routing_number: the routing number's check digit does not match",
        ),
        ("NACHA_ORIGINATOR", ORIGINATOR_SETTING | {"bank": "x"}, "unknown key(s) ['bank']"),
        ("NACHA_ORIGINATOR", {"odfi_routing_number": "021000021"}, "missing key(s)"),
        ("NACHA_WINDOWS", [{"name": "x", "deadline": "10:30", "same_day": True}], "next-day"),
        ("NACHA_BANK_BUFFER_MINUTES", -1, "out of range"),
        ("NACHA_TRANSPORT", {"kind": "ftp"}, "kind is 'directory' or 'sftp'"),
        ("VAULT_ACTIVE_KEY", "a b", "not of the accepted form"),
    ],
    ids=["routing", "unknown", "missing", "windows", "buffer", "transport", "active-key"],
)
def test_a_wrong_bank_path_setting_stops_start_up_naming_it(module_settings, name, value, problem):
    message = _refused(module_settings, name, value)
    assert f'BANK["{name}"]' in message and problem in message


def test_a_refused_vault_key_is_never_shown(module_settings):
    short = base64.b64encode(b"sixteen byte key").decode()
    message = _refused(module_settings, "VAULT_KEYS", {"k1": short})
    assert "key 'k1' must decode to 32 bytes" in message
    assert short not in message and "<not shown: key material>" in message
