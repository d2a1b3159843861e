"""The NACHA return and NOC round against names the bank chose: a name holding a bank number is
stored, alerted and reported masked; a name too long for an alert key still raises its alert;
a refused file never stops the file after it."""

import io
import os

import pytest
from django.core.management import call_command

from bank.nacha.models import NachaInboundFile
from payments.alerts import ALERT_KEY_MAX
from sandbox.bank_writer import nacha_answer_file_write
from tests.bank.nacha.conftest import BANK
from tests.bank.test_collect import (  # noqa: F401 (the fixture)
    EVENING,
    _answers,
    _drop,
    _settled_payments,
    bank_path,
)
from tests.bank_number_scan import bank_number_scan
from triage.models import Alert

pytestmark = pytest.mark.django_db(transaction=True)

ACCOUNT = "4455667788991"


def test_a_refused_file_named_with_a_bank_number_is_masked_everywhere_and_the_next_is_read(
    bank_path,  # noqa: F811
    module_settings,
):
    module_settings.NACHA_TRANSPORT = {
        "kind": "directory",
        "outbound": str(bank_path.outbound),
        "inbound": str(bank_path.inbound),
    }
    payments, ours = _settled_payments(2)
    good = nacha_answer_file_write(
        answers=_answers(ours, payments, ["R01", "R10"]), created_at=EVENING, **BANK
    )
    lines = good.decode().splitlines()
    lines[6] = lines[6][:4] + "000009" + lines[6][10:]  # the batch control's entry count
    refused_name = f"a-returns-acct-{ACCOUNT}-" + "n" * 200 + ".ach"
    _drop(bank_path, refused_name, ("\n".join(lines) + "\n").encode())
    _drop(bank_path, f"b-returns-{ACCOUNT}.ach", good)
    out = io.StringIO()

    call_command("nacha_collect", "--min-age-seconds", "0", stdout=out, stderr=out)

    assert "imported 1, refused 1" in out.getvalue()
    assert ACCOUNT not in out.getvalue() and "acct-****8991-" in out.getvalue()
    refused = NachaInboundFile.objects.get(status="refused")
    assert refused.name.startswith("a-returns-acct-****8991-")
    assert NachaInboundFile.objects.get(status="imported").name == "b-returns-****8991.ach"
    [alert] = Alert.objects.filter(key__startswith="nacha.inbound_refused:")
    assert len(alert.key) == ALERT_KEY_MAX
    assert alert.details["file"] == refused.name
    assert not os.listdir(bank_path.inbound) or os.listdir(bank_path.inbound) == ["processed"]
    assert bank_number_scan([ACCOUNT]) == []
