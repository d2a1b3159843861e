"""Fuzzing the parser: whatever the bytes, it either reads the file or refuses it naming a
record of it; it never raises anything else."""

import hypothesis
from hypothesis import HealthCheck, given
from hypothesis import strategies as st

from bank.nacha.parser import NachaFormatError, parse_nacha
from tests.bank.nacha.conftest import read_file

FIXTURES = ["ppd-debit.ach", "ccd-debit.ach", "web-debit.ach", "returns.ach", "noc.ach"]
SETTINGS = hypothesis.settings(
    max_examples=400, deadline=None, database=None, suppress_health_check=list(HealthCheck)
)


def _assert_read_or_refused_naming_a_record(data: bytes) -> None:
    try:
        parsed = parse_nacha(data)
    except NachaFormatError as refusal:
        # A record of the file, or the one after its last (where a missing record was due).
        most = max(1, data.count(b"\n") + 2, len(data) // 94 + 2)
        assert 1 <= refusal.record_number <= most
        assert str(refusal).startswith(f"record {refusal.record_number}: ")
        assert refusal.reason
    else:
        assert parsed.record_count % 10 == 0


@SETTINGS
@given(data=st.binary(max_size=3000))
def test_arbitrary_bytes_are_read_or_refused_naming_a_record(data):
    _assert_read_or_refused_naming_a_record(data)


@st.composite
def mutated_files(draw) -> bytes:
    data = bytearray(read_file(draw(st.sampled_from(FIXTURES))))
    for _ in range(draw(st.integers(1, 4))):
        action = draw(st.sampled_from(["set", "delete", "insert", "lines"]))
        position = draw(st.integers(0, len(data) - 1))
        if action == "set":
            data[position] = draw(st.sampled_from(b"0123456789 9A\n\r\x00\xff7658"))
        elif action == "delete":
            del data[position]
        elif action == "insert":
            data.insert(position, draw(st.integers(0, 255)))
        else:
            lines = bytes(data).split(b"\n")
            i, j = draw(st.integers(0, len(lines) - 1)), draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
            data = bytearray(b"\n".join(lines))
    return bytes(data)


@SETTINGS
@given(data=mutated_files())
def test_mutated_valid_files_are_read_or_refused_naming_a_record(data):
    _assert_read_or_refused_naming_a_record(data)


@SETTINGS
@given(
    name=st.sampled_from(FIXTURES),
    column=st.integers(1, 94),
    record=st.integers(0, 9),
    char=st.characters(min_codepoint=0x20, max_codepoint=0x7E),
)
def test_one_changed_printable_character_is_read_or_refused_naming_its_record(
    name, column, record, char
):
    lines = read_file(name).decode("ascii").replace("\r\n", "\n").split("\n")
    lines = [line.ljust(94) for line in lines if line]
    if len(lines) == 1:
        lines = [lines[0][i : i + 94] for i in range(0, len(lines[0]), 94)]
    record = min(record, len(lines) - 1)
    line = lines[record]
    lines[record] = line[: column - 1] + char + line[column:]
    data = ("\n".join(lines)).encode("ascii")
    try:
        parse_nacha(data)
    except NachaFormatError as refusal:
        assert 1 <= refusal.record_number <= len(lines) + 1
