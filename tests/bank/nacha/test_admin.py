"""The bank path in the admin: files, entries and the bank's files are listed, read-only, and no
page shows a file's bytes (they hold account numbers)."""

from datetime import datetime

import pytest

from bank.nacha.inbound import nacha_inbound_store
from bank.nacha.services import nacha_entry_add, nacha_file_cut
from bank.nacha.windows import EASTERN
from tests.bank.nacha.conftest import records
from tests.bank.nacha.test_file_cut import resolve
from tests.factories import PaymentFactory

pytestmark = pytest.mark.django_db


def test_file_entry_and_inbound_pages_show_no_account_number(admin_client, nacha_settings):
    payment = PaymentFactory(source_token="tok_bank_0001abc")
    entry = nacha_entry_add(payment_id=payment.pk)
    cut = nacha_file_cut(now=datetime(2026, 12, 1, 20, 0, tzinfo=EASTERN), resolve_account=resolve)
    lines = records("ppd-debit.ach")
    refused = nacha_inbound_store(name="bad.ach", content=("\n".join(lines[:9]) + "\n").encode())
    pages = [
        "/admin/bank/nachafile/",
        f"/admin/bank/nachafile/{cut.file.pk}/change/",
        "/admin/bank/nachaentry/",
        f"/admin/bank/nachaentry/{entry.pk}/change/",
        "/admin/bank/nachainboundfile/",
        f"/admin/bank/nachainboundfile/{refused.file.pk}/change/",
    ]
    assert (
        "555000001" in cut.file.content_bytes().decode()
    )  # the account number is in the file itself
    for url in pages:
        response = admin_client.get(url)
        assert response.status_code == 200, url
        text = response.content.decode()
        assert "555000001" not in text and "12345678901" not in text, url
    page = admin_client.get(f"/admin/bank/nachainboundfile/{refused.file.pk}/change/")
    assert "must be blocked to a multiple of 10" in page.content.decode()
    assert admin_client.get("/admin/bank/nachafile/add/").status_code == 403
