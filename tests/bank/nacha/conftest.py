import base64
from pathlib import Path

import pytest

FILES = Path(__file__).parent / "files"
# The vault tests' own first key (tests/bank/vault/conftest.py), so both fixtures agree.
FILE_KEY = base64.b64encode(bytes(range(32))).decode()


def read_file(name: str) -> bytes:
    return (FILES / name).read_bytes()


def records(name: str) -> list[str]:
    """The records of a fixture, each padded to 94 columns, for tests that alter one."""
    text = read_file(name).decode("ascii").replace("\r\n", "\n")
    lines = (
        text.split("\n") if "\n" in text else [text[i : i + 94] for i in range(0, len(text), 94)]
    )
    return [line.ljust(94) for line in lines if line]


def join(lines: list[str]) -> bytes:
    return ("\n".join(lines) + "\n").encode("utf-8")


@pytest.fixture
def ppd_records() -> list[str]:
    return records("ppd-debit.ach")


ORIGINATOR_SETTING = {
    "odfi_routing_number": "021000021",
    "odfi_name": "First ODFI Bank",
    "immediate_origin": "1234567890",
    "immediate_origin_name": "Example Merchant Co",
    "company_name": "Example Merchant",
    "company_identification": "1234567890",
}


@pytest.fixture
def sealing_key(module_settings):
    """A vault key: the files, ours and the bank's, are stored sealed by the vault."""
    module_settings.VAULT_KEYS = {"k1": FILE_KEY}
    module_settings.VAULT_ACTIVE_KEY = "k1"
    return module_settings


@pytest.fixture
def nacha_settings(sealing_key):
    """The bank path set up for a test: our originator, the Fed's windows, a 30-minute buffer,
    and a vault key to seal the files with."""
    sealing_key.NACHA_ORIGINATOR = dict(ORIGINATOR_SETTING)
    return sealing_key


# The bank that answers our files in the tests: the RDFI of the returns and NOCs it writes back.
BANK = {
    "bank_routing_number": "011000015",
    "bank_name": "RDFI Bank",
    "odfi_routing_number": "021000021",
    "odfi_name": "First ODFI Bank",
}


@pytest.fixture
def bank(module_settings, sqs_queues, tmp_path):
    """The bank as the processor backend, its drop two directories (the sandbox bank's)."""
    from bank.nacha.transports import DirectoryTransport
    from tests.bank.vault.conftest import KEY_1

    module_settings.PROCESSOR_BACKEND = "bank.nacha.backend.NachaBankBackend"
    module_settings.NACHA_ORIGINATOR = dict(ORIGINATOR_SETTING)
    module_settings.VAULT_KEYS = {"k1": KEY_1}
    module_settings.VAULT_ACTIVE_KEY = "k1"
    module_settings.NACHA_TRANSPORT = {
        "kind": "directory",
        "outbound": str(tmp_path / "out"),
        "inbound": str(tmp_path / "in"),
    }
    return DirectoryTransport(outbound=str(tmp_path / "out"), inbound=str(tmp_path / "in"))
