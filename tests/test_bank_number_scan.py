"""The scan the hostile tests rely on finds a planted bank number wherever it is left whole."""

import pytest

from tests.bank_number_scan import bank_number_scan
from triage.models import Alert

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("planted", "stored"),
    [
        ("445566778899", "paid from 445566778899"),
        ("7766-8056-8693", "acct 776680568693"),  # the digits without their dashes
        ("\uff14\uff14\uff15\uff15\uff16\uff16\uff17\uff17", "acct 44556677"),  # in ASCII
    ],
)
def test_a_bank_number_left_whole_is_found_in_its_table_and_on_its_admin_pages(planted, stored):
    alert = Alert.objects.create(key="scan.test", severity="high", summary=stored)

    hits = bank_number_scan([planted])

    assert any(hit.startswith("table triage_alert") for hit in hits), hits
    assert any(f"/{alert.pk}/change/" in hit for hit in hits), hits


def test_a_masked_bank_number_is_not_found():
    Alert.objects.create(key="scan.test", severity="high", summary="paid from ****8899")

    assert bank_number_scan(["445566778899"]) == []


def test_a_row_whose_key_holds_an_admin_escape_is_scanned_on_its_own_page():
    # ``evt_25...`` read back unquoted would be ``evt%...``: a 302 to the index, not the row.
    from payments.models import EventOutcome, ProcessedEvent
    from tests.factories import PaymentFactory

    ProcessedEvent.objects.create(
        processor_event_id="evt_25f1_2Fx",
        payment=PaymentFactory(),
        event_type="settled",
        payload_hash="0" * 64,
        outcome=EventOutcome.APPLIED,
    )

    assert bank_number_scan(["445566778899"]) == []
