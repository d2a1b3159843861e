from datetime import datetime
from decimal import Decimal

import pytest
from django.core.management import call_command

from bank.nacha.models import NachaFile
from bank.nacha.transports import DirectoryTransport
from bank.nacha.windows import EASTERN
from bank.vault.services import vault_account_store
from payments.services import payment_create, payment_submit
from sandbox.bank import bank_answer_files
from tests.bank.nacha.conftest import ORIGINATOR_SETTING
from tests.bank.vault.conftest import ACCOUNT, KEY_1
from tests.callbacks.worker_support import run_worker
from tests.factories import account_validated


@pytest.fixture
def books(module_settings, settings, sqs_queues, tmp_path):
    """The bank path on a directory transport, and the bank's statements in a directory of
    their own."""
    module_settings.PROCESSOR_BACKEND = "bank.nacha.backend.NachaBankBackend"
    module_settings.NACHA_ORIGINATOR = dict(ORIGINATOR_SETTING)
    module_settings.VAULT_KEYS = {"k1": KEY_1}
    module_settings.VAULT_ACTIVE_KEY = "k1"
    module_settings.NACHA_TRANSPORT = {
        "kind": "directory",
        "outbound": str(tmp_path / "out"),
        "inbound": str(tmp_path / "in"),
    }
    module_settings.BOOKS_STATEMENT_TRANSPORT = {
        "kind": "directory",
        "inbound": str(tmp_path / "statements"),
    }
    return BankDirs(tmp_path)


class BankDirs:
    def __init__(self, root):
        self.outbound = str(root / "out")
        self.inbound = str(root / "in")
        self.statements = str(root / "statements")
        self.nacha = DirectoryTransport(outbound=self.outbound, inbound=self.inbound)
        self.statement_transport = DirectoryTransport(
            outbound=self.statements, inbound=self.statements
        )


def bank_payment(*, holder: str, amount: str, merchant: str = "m-1", sec_code: str = "PPD"):
    token = vault_account_store(
        **(ACCOUNT | {"holder_name": holder, "merchant_id": merchant, "sec_code": sec_code})
    ).token
    # A WEB account validated first, as NACHA's rule wants (tests of the books, not of it).
    account_validated(token, merchant)
    payment = payment_create(merchant_id=merchant, amount=Decimal(amount), source_token=token)
    payment_submit(payment_id=payment.pk)
    return payment


def send_and_answer(books) -> NachaFile:
    """Cut and deliver the waiting entries in one file; the sandbox bank answers it on the
    file's effective day (its returns are dated that day), and the returns are applied."""
    from bank.collect import nacha_files_collect

    call_command("nacha_send", "--now")
    run_worker(relay=True)
    [sent] = NachaFile.objects.all()
    effective = sent.effective_entry_date
    bank_answer_files(
        outbound=books.outbound,
        inbound=books.inbound,
        now=datetime.combine(effective, datetime.min.time(), tzinfo=EASTERN).replace(hour=17),
    )
    nacha_files_collect(transport=books.nacha, min_age_seconds=0)
    run_worker()
    return sent
