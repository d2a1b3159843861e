"""Whatever bytes the bank's drop holds, storing them never crashes: the file is kept, and
either imported whole or refused whole with a record number; nothing half-imported."""

import hypothesis
import pytest
from hypothesis import HealthCheck, given
from hypothesis import strategies as st

from bank.nacha.inbound import nacha_inbound_store
from bank.nacha.models import NachaInboundEvent, NachaInboundFile
from tests.bank.nacha.conftest import read_file
from tests.bank.nacha.test_parser_fuzz import mutated_files

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("sealing_key")]


@hypothesis.settings(
    max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck)
)
@given(data=st.one_of(mutated_files(), st.binary(max_size=2000)))
def test_any_bytes_are_stored_imported_whole_or_refused_whole(data):
    result = nacha_inbound_store(name="drop.ach", content=data)
    stored = NachaInboundFile.objects.get(pk=result.file.pk)
    assert stored.content_bytes() == data
    events = NachaInboundEvent.objects.filter(file=stored).count()
    if stored.status == "refused":
        assert stored.refused_record >= 1 and stored.refused_reason
        assert events == 0
    else:
        assert events <= stored.entry_count


def test_the_same_file_twice_is_one_row_and_its_events_once():
    data = read_file("returns.ach")
    first = nacha_inbound_store(name="a.ach", content=data)
    second = nacha_inbound_store(name="b.ach", content=data)
    assert first.created and not second.created and first.file.pk == second.file.pk
    assert NachaInboundEvent.objects.count() == 4
    assert NachaInboundEvent.objects.filter(payment__isnull=True).count() == 4  # none of ours
