"""The statements round against a careless or hostile bank: a statement the reader cannot take
is refused whole with a reason and an alert, moved out of the drop, and the round goes on with
the next file; bank numbers in a statement's text and in a file's name are stored masked; an
alert key built from a long name fits its column."""

from datetime import date, datetime

import pytest

from bank.books.bai2_writer import Line, bai2_statement_write
from bank.books.models import BankStatement, StatementLine, StatementStatus
from payments.alerts import ALERT_KEY_MAX
from tests.bank.books.test_bai2 import prior_day
from tests.bank.books.test_collect import collect, drop, vault  # noqa: F401 (fixtures)
from tests.bank_number_scan import bank_number_scan
from triage.models import Alert

pytestmark = pytest.mark.django_db

ACCOUNT = "4455667788991"
GROUPED = "7766-8056-8693"
FULL_WIDTH = "\uff13\uff13\uff14\uff14\uff15\uff15\uff16\uff16\uff17"  # "334455667" full-width


def statement(*, text: str = "ACH SETTLEMENT", amount: int = 14050) -> bytes:
    return bai2_statement_write(
        sender="021000021",
        receiver="ACMEPAY",
        account_number="000123456789",
        as_of_date=date(2026, 12, 1),
        created_at=datetime(2026, 12, 2, 6, 0),
        file_id="1",
        lines=[Line("166", amount, "B1", f"REF {ACCOUNT}", text)],
    )


def test_a_round_refuses_a_bad_statement_and_goes_on_with_the_next_file(
    drop,  # noqa: F811
    django_capture_on_commit_callbacks,
):
    # Full-width digits where the format has digits: read as money before, refused now.
    (drop / "a-bad.bai").write_bytes(prior_day().replace(b"16,166,14050", "16,166,１4050".encode()))
    (drop / "b-good.bai").write_bytes(prior_day())

    with django_capture_on_commit_callbacks(execute=True):
        output = collect()

    assert "imported 1, refused 1" in output and "refused: a-bad.bai" in output
    bad = BankStatement.objects.get(name="a-bad.bai")
    good = BankStatement.objects.get(name="b-good.bai")
    assert bad.status == StatementStatus.REFUSED and bad.refused_record == 5
    assert "16 166 amount is not an amount" in bad.refused_reason
    assert good.status == StatementStatus.IMPORTED and StatementLine.objects.count() == 4
    assert not list(drop.glob("*.bai"))  # both moved out of the drop: nothing blocks the next
    [alert] = Alert.objects.filter(key__startswith="books.statement_refused:")
    assert alert.severity == "high" and "a-bad.bai" in alert.key


def test_a_statement_with_a_value_wider_than_its_column_is_refused_not_a_crash(
    drop,  # noqa: F811
    django_capture_on_commit_callbacks,
):
    wide = prior_day().replace(b"USD,2/", b"USDOLLARS,2/", 1)
    (drop / "a-wide.bai").write_bytes(wide)
    (drop / "b-good.bai").write_bytes(prior_day())

    with django_capture_on_commit_callbacks(execute=True):
        output = collect()

    assert "imported 1, refused 1" in output
    refused = BankStatement.objects.get(status=StatementStatus.REFUSED)
    assert "02 currency code is not 3 letters" in refused.refused_reason
    assert Alert.objects.filter(key__startswith="books.statement_refused:").count() == 1


def test_bank_numbers_in_a_statements_text_and_name_are_stored_and_shown_masked(
    drop,  # noqa: F811
    admin_client,
    django_capture_on_commit_callbacks,
):
    name = f"stmt-{ACCOUNT}-{FULL_WIDTH}.bai"
    # The writer writes ASCII: the full-width digits go in after it.
    content = statement(text=f"PAYROLL ACCT {GROUPED} FROM XXXXXXXXX")
    (drop / name).write_bytes(content.replace(b"XXXXXXXXX", FULL_WIDTH.encode()))
    refused_name = f"refused-{ACCOUNT}.bai"
    (drop / refused_name).write_bytes(statement().replace(b"16,166", "16,１66".encode()))

    with django_capture_on_commit_callbacks(execute=True):
        output = collect()

    assert "imported 1, refused 1" in output
    line = StatementLine.objects.get()
    assert line.text == "PAYROLL ACCT ****8693 FROM ****" + FULL_WIDTH[-4:]
    assert line.customer_reference == "REF ****8991"
    assert BankStatement.objects.filter(name="stmt-****8991-****" + FULL_WIDTH[-4:] + ".bai")
    assert Alert.objects.get(key__startswith="books.statement_refused:refused-****8991.bai")
    assert bank_number_scan([ACCOUNT, GROUPED, FULL_WIDTH]) == []


def test_an_alert_key_built_from_a_long_file_name_fits_its_column_and_keeps_the_name(
    drop,  # noqa: F811
    django_capture_on_commit_callbacks,
):
    name = "s" * 240 + ".bai"  # a name the file system takes, a key that would not fit
    (drop / name).write_bytes(prior_day().replace(b"49,3092651,8/", b"49,3092650,8/"))

    with django_capture_on_commit_callbacks(execute=True):
        collect()

    alert = Alert.objects.get(key__startswith="books.statement_refused:")
    assert len(alert.key) == ALERT_KEY_MAX and alert.key.startswith(
        f"books.statement_refused:{'s' * 200}"
    )
    assert alert.details["file"] == name
