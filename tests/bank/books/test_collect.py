"""``bank_statements_collect``: statements taken over the NACHA transports (a directory, the
real sshd over SFTP), stored whole and sealed by the vault, moved out of the bank's drop; a
malformed one stored refused, naming the record, with one high alert per file's bytes."""

import io
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from bank.books.models import BankStatement, StatementLine, StatementStatus
from payments.signals import alert_raised
from tests.bank.books.test_bai2 import prior_day
from tests.bank.nacha.conftest import FILE_KEY
from tests.bank.nacha.sshd import sshd_start

pytestmark = pytest.mark.django_db


@pytest.fixture
def vault(module_settings):
    module_settings.VAULT_KEYS = {"k1": FILE_KEY}
    module_settings.VAULT_ACTIVE_KEY = "k1"
    return module_settings


@pytest.fixture
def drop(vault, module_settings, tmp_path):
    folder = tmp_path / "statements"
    folder.mkdir()
    module_settings.BOOKS_STATEMENT_TRANSPORT = {"kind": "directory", "inbound": str(folder)}
    return folder


@pytest.fixture
def alerts():
    raised = []

    def receiver(sender, **kwargs):
        raised.append(kwargs)

    alert_raised.connect(receiver, dispatch_uid="test_books_collect_alerts")
    yield raised
    alert_raised.disconnect(dispatch_uid="test_books_collect_alerts")


def collect() -> str:
    out = io.StringIO()
    call_command("bank_statements_collect", "--min-age-seconds", "0", stdout=out, stderr=out)
    return out.getvalue()


def test_a_statement_in_the_directory_is_stored_sealed_and_moved_out_of_the_drop(drop):
    (drop / "prior-day.bai").write_bytes(prior_day())

    output = collect()

    stored = BankStatement.objects.get()
    assert "imported 1, refused 0" in output
    assert stored.status == StatementStatus.IMPORTED and stored.line_count == 4
    assert StatementLine.objects.count() == 4
    # Kept whole, only sealed: the account number is not in the row, and the bytes open.
    assert b"000123456789" not in bytes(stored.ciphertext)
    assert stored.content_bytes() == prior_day()
    assert not (drop / "prior-day.bai").exists() and (drop / "processed" / "prior-day.bai").exists()
    assert "seen before 0" in collect()  # nothing left


def test_a_malformed_statement_is_stored_refused_naming_the_record_and_alerted_once(drop, alerts):
    bad = prior_day().replace(b"49,3092651,8/", b"49,3092650,8/")
    (drop / "bad.bai").write_bytes(bad)

    output = collect()
    (drop / "bad.bai").write_bytes(bad)  # the bank puts the same bytes there again
    collect()

    stored = BankStatement.objects.get()
    assert "refused 1" in output and "refused: bad.bai" in output
    assert (stored.status, stored.refused_record) == (StatementStatus.REFUSED, 10)
    assert "49 account control total" in stored.refused_reason
    assert stored.content_bytes() == bad  # kept whole for a human
    assert StatementLine.objects.count() == 0  # nothing of it imported
    [alert] = alerts
    assert alert["severity"] == "high" and alert["key"].startswith(
        "books.statement_refused:bad.bai"
    )
    assert alert["details"]["record"] == 10 and "000123456789" not in alert["summary"]


def test_a_statement_the_reader_fails_on_is_refused_whole_and_the_round_goes_on(
    drop, alerts, monkeypatch
):
    """A failure of the reader's own, no rule of the format's (injected here: the format's
    rules refuse every broken file the tests know of), on the first file of the drop: before,
    it ended the round (exit 1), and that file stayed in the drop ahead of every later one."""
    import bank.books.services as services

    broken = prior_day() + b"\n"
    real_parse = services.parse_bai2

    def parse(content: bytes):
        if content == broken:
            raise KeyError("account 000123456789 type 999")
        return real_parse(content)

    monkeypatch.setattr(services, "parse_bai2", parse)
    (drop / "a-broken.bai").write_bytes(broken)
    (drop / "b-good.bai").write_bytes(prior_day())

    output = collect()

    assert "imported 1, refused 1" in output
    refused = BankStatement.objects.get(name="a-broken.bai")
    assert (refused.status, refused.refused_record) == (StatementStatus.REFUSED, 0)
    assert refused.refused_reason.startswith("the statement could not be read (KeyError: ")
    assert "000123456789" not in refused.refused_reason
    assert refused.content_bytes() == broken
    good = BankStatement.objects.get(name="b-good.bai")
    assert good.status == StatementStatus.IMPORTED and good.line_count == 4
    assert not list(drop.glob("*.bai"))  # both moved out of the drop
    [alert] = alerts
    assert alert["severity"] == "high" and "a-broken.bai" in alert["summary"]
    assert "the statement could not be read" in alert["summary"]


def test_collecting_without_a_statement_transport_names_the_setting(vault, module_settings):
    module_settings.BOOKS_STATEMENT_TRANSPORT = None

    with pytest.raises(CommandError, match="BOOKS_STATEMENT_TRANSPORT"):
        collect()


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    server = sshd_start(tmp_path_factory.mktemp("sshd"))
    yield server
    server.stop()


@pytest.mark.subprocess
def test_a_statement_is_collected_over_sftp_from_the_real_sshd(
    sshd, vault, module_settings, tmp_path
):
    inbound: Path = tmp_path / "from-bank"
    inbound.mkdir()
    (inbound / "prior-day.bai").write_bytes(prior_day())
    module_settings.BOOKS_STATEMENT_TRANSPORT = {
        "kind": "sftp",
        "host": "127.0.0.1",
        "port": sshd.port,
        "username": sshd.username,
        "private_key_path": sshd.client_key_path,
        "host_key": sshd.host_key,
        "inbound": str(inbound),
        "timeout_seconds": 10,
    }

    output = collect()

    assert "imported 1" in output
    assert BankStatement.objects.get().content_bytes() == prior_day()
    assert (inbound / "processed" / "prior-day.bai").exists()


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ({"BOOKS_STATEMENT_TRANSPORT": {"kind": "ftp"}}, "BOOKS_STATEMENT_TRANSPORT"),
        ({"BOOKS_STATEMENT_TRANSPORT": {"kind": "directory"}}, "BOOKS_STATEMENT_TRANSPORT"),
        ({"BOOKS_STATEMENT_TRANSPORT": "/var/bank"}, "BOOKS_STATEMENT_TRANSPORT"),
        ({"BOOKS_CLOSE_BY_HOUR_EASTERN": 24}, "BOOKS_CLOSE_BY_HOUR_EASTERN"),
        ({"BOOKS_CLOSE_BY_HOUR_EASTERN": True}, "BOOKS_CLOSE_BY_HOUR_EASTERN"),
        ({"BOOKS_CLOSE_BY_HOUR_EASTERN": float("nan")}, "BOOKS_CLOSE_BY_HOUR_EASTERN"),
        ({"BOOKS_VARIANCE_ALERT_BANKING_DAYS": -1}, "BOOKS_VARIANCE_ALERT_BANKING_DAYS"),
        ({"BOOKS_VARIANCE_ALERT_BANKING_DAYS": 10**30}, "BOOKS_VARIANCE_ALERT_BANKING_DAYS"),
        ({"BOOKS_SETTLEMENT_TYPE_CODES": "166"}, "BOOKS_SETTLEMENT_TYPE_CODES"),
        ({"BOOKS_RETURN_TYPE_CODES": ["45\x00"]}, "BOOKS_RETURN_TYPE_CODES"),
        ({"BOOKS_RETURN_TYPE_CODES": ["\u0664\u0665\u0665"]}, "BOOKS_RETURN_TYPE_CODES"),
        ({"BOOKS_RETURN_TYPE_CODES": ["\ud800ab"]}, "BOOKS_RETURN_TYPE_CODES"),
        ({"BOOKS_STATEMENT_TRASNPORT": None}, "BOOKS_STATEMENT_TRASNPORT"),
    ],
)
def test_manage_check_names_a_bad_books_setting(module_settings, settings, value, named):
    from bank.checks import bank_setting_values_check

    settings.BANK = {**settings.BANK, **value}

    [error] = bank_setting_values_check()

    assert error.id in ("bank.E001", "bank.E002") and f'BANK["{named}"]' in error.msg


def test_manage_check_accepts_the_books_defaults(settings):
    from bank.checks import bank_moved_settings_check, bank_setting_values_check

    settings.BANK = {}

    assert bank_setting_values_check() == [] and bank_moved_settings_check() == []


def test_the_books_old_dict_is_read_this_release_with_a_warning_naming_each_keys_new_place(
    settings,
):
    from bank import conf
    from bank.checks import bank_moved_settings_check, bank_setting_values_check

    settings.BANK = {"BOOKS_VARIANCE_ALERT_BANKING_DAYS": 5}
    settings.PAYMENTS_BOOKS = {"CLOSE_BY_HOUR_EASTERN": 9, "VARIANCE_ALERT_BANKING_DAYS": 7}

    warnings = bank_moved_settings_check()

    # The old key is read; the new dict wins where both are set.
    assert conf.BOOKS_CLOSE_BY_HOUR_EASTERN == 9
    assert conf.BOOKS_VARIANCE_ALERT_BANKING_DAYS == 5
    assert [(w.id, w.obj) for w in warnings] == [("bank.W001", "BOOKS_CLOSE_BY_HOUR_EASTERN")]
    assert warnings[0].msg.startswith(
        'PAYMENTS_BOOKS["CLOSE_BY_HOUR_EASTERN"] has moved to BANK["BOOKS_CLOSE_BY_HOUR_EASTERN"]'
    )
    assert bank_setting_values_check() == []


@pytest.mark.parametrize(
    ("old", "named"),
    [
        ({"CLOSE_BY_HOUR_EASTERN": 24}, 'BANK["BOOKS_CLOSE_BY_HOUR_EASTERN"]'),
        ({"STATEMENT_TRASNPORT": None}, 'PAYMENTS_BOOKS["STATEMENT_TRASNPORT"]'),
        ({"\x00": 1}, 'PAYMENTS_BOOKS["\x00"]'),
        (["STATEMENT_TRANSPORT"], "PAYMENTS_BOOKS = "),
    ],
)
def test_manage_check_refuses_a_bad_value_or_an_unknown_key_in_the_books_old_dict(
    settings, old, named
):
    from bank.checks import bank_setting_values_check

    settings.BANK = {}
    settings.PAYMENTS_BOOKS = old

    [error] = bank_setting_values_check()

    assert error.id in ("bank.E001", "bank.E002") and named in error.msg


def test_key_rotation_rewraps_a_stored_statement_which_opens_once_the_old_key_is_gone(
    drop, module_settings, capsys
):
    from tests.bank.vault.conftest import KEY_2

    (drop / "prior-day.bai").write_bytes(prior_day())
    collect()
    module_settings.VAULT_KEYS = {"k1": FILE_KEY, "k2": KEY_2}
    module_settings.VAULT_ACTIVE_KEY = "k2"

    call_command("vault_rotate_keys", "--batch-size", "5")

    assert "0 bank statements" in capsys.readouterr().out
    module_settings.VAULT_KEYS = {"k2": KEY_2}  # the old key is gone
    stored = BankStatement.objects.get()
    assert stored.key_version == "k2" and stored.content_bytes() == prior_day()
