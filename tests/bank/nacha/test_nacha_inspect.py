import json
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from tests.bank.nacha.conftest import FILES, join, records

ROOT = Path(__file__).resolve().parents[3]


def _inspect(path) -> list[dict]:
    out = StringIO()
    call_command("nacha_inspect", str(path), stdout=out)
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_each_entry_is_one_json_line_with_the_account_masked_to_its_last_4():
    lines = _inspect(FILES / "ppd-debit.ach")
    assert lines[0] == {
        "record": 3,
        "batch_number": 1,
        "trace_number": "021000020000001",
        "sec_code": "PPD",
        "transaction_code": 27,
        "amount_cents": 12550,
        "account": "****8901",
        "addenda": ["05"],
    }
    raw = (FILES / "ppd-debit.ach").read_text()
    assert "12345678901" in raw
    assert all("12345678901" not in json.dumps(line) for line in lines)


def test_returns_print_their_r_code_and_original_trace_number():
    lines = _inspect(FILES / "returns.ach")
    assert [(x["kind"], x["return_code"], x["original_trace_number"]) for x in lines] == [
        ("return", "R01", "021000020000001"),
        ("return", "R10", "021000020000003"),
        ("dishonored_return", "R68", "021000020000004"),
        ("contested_return", "R71", "021000020000002"),
    ]


def test_nocs_print_their_c_code_and_never_the_corrected_account_number():
    lines = _inspect(FILES / "noc.ach")
    assert [(x["change_code"], x["original_trace_number"]) for x in lines] == [
        ("C01", "021000020000001"),
        ("C03", "021000020000003"),
        ("C05", "021000020000002"),
    ]
    assert "98765432100" not in json.dumps(lines)  # C01's corrected account number


def test_a_malformed_file_is_an_error_naming_the_record_and_reason(tmp_path):
    lines = records("ppd-debit.ach")
    lines[5] = lines[5][:4] + "000009" + lines[5][10:]
    path = tmp_path / "bad.ach"
    path.write_bytes(join(lines))
    with pytest.raises(CommandError, match="record 6: batch control entry/addenda count says 9"):
        _inspect(path)


def test_a_missing_file_is_an_error_naming_it(tmp_path):
    with pytest.raises(CommandError, match="cannot read .*nope.ach"):
        _inspect(tmp_path / "nope.ach")


@pytest.mark.subprocess
def test_the_command_exits_1_on_a_malformed_file_without_a_database(tmp_path):
    path = tmp_path / "bad.ach"
    path.write_bytes(join(records("ppd-debit.ach")[:9]))
    env = {
        "PATH": "/usr/bin:/bin",
        "DJANGO_SETTINGS_MODULE": "config.settings.test",
        "DATABASE_URL": "postgres://nobody@127.0.0.1:1/none",
    }
    done = subprocess.run(
        [sys.executable, "manage.py", "nacha_inspect", str(path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "record 9: the file has 9 records" in done.stderr
    ok = subprocess.run(
        [sys.executable, "manage.py", "nacha_inspect", "-"],
        input=(FILES / "noc.ach").read_text(),
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ok.returncode == 0, ok.stderr
    assert len(ok.stdout.splitlines()) == 3
