"""Files written by other implementations, at test time, read by our parser and nacha_inspect;
and our writer's files read by them.

Four implementations from the package registries, pinned and installed by ``make deps``:
achkit and carta-ach (PyPI, requirements.txt) and @midlandsbank/node-nacha and nach2 (npm,
``achinterop/``, driven by ``achinterop/interop.js``). Each writes the same debits (``SPEC``):
a PPD batch (checking and savings), a CCD batch and a WEB batch. None of them writes return
(99) or NOC (98) addenda, so the return direction is covered the other way round: they read
the return and NOC files our bank writer writes.

Where one of them writes what our parser refuses, the NACHA rules decide, and each case is a
test below naming the record: node-nacha pads a file whose records already fill its blocks
with a whole block of 9s (its control then counts one block too few), and writes an addenda
05 whose entry detail sequence number is not its entry's; nach2 leaves that number blank.
"""

from __future__ import annotations

import copy
import json
import subprocess
from datetime import date, datetime
from io import StringIO
from pathlib import Path

import achkit
import pytest
from ach.builder import AchFile as CartaFile
from ach.parser import Parser as CartaParser
from django.core.management import CommandError, call_command

from bank.nacha.originator import parse_originator
from bank.nacha.parser import NachaFormatError, parse_nacha
from bank.nacha.windows import EASTERN
from bank.nacha.writer import FileEntry, nacha_file_write
from sandbox.bank_writer import BankAnswer, nacha_answer_file_write
from tests.bank.nacha.conftest import FILES, ORIGINATOR_SETTING

ROOT = Path(__file__).resolve().parents[3]
INTEROP = ROOT / "achinterop"
NODE_NACHA_SAMPLE = INTEROP / "node_modules/@midlandsbank/node-nacha/tests/assets/NACHA.txt"

SPEC = {
    "destination_routing": "091000019",
    "destination_name": "WELLS FARGO",
    "immediate_origin": "1234567890",
    "origin_name": "ACME PAYMENTS",
    "company_name": "ACME PAYMENTS",
    "company_identification": "1234567890",
    "file_id_modifier": "C",
    "batches": [
        {
            "sec": "PPD",
            "description": "PAYMENT",
            "effective_date": "260302",
            "entries": [
                {
                    "name": "ALICE SMITH",
                    "routing": "021000021",
                    "account": "123456789",
                    "account_type": "checking",
                    "amount_cents": 1234,
                    "id": "PAY1",
                },
                {
                    "name": "BOB JONES",
                    "routing": "011000015",
                    "account": "987654321",
                    "account_type": "savings",
                    "amount_cents": 100000,
                    "id": "PAY2",
                },
            ],
        },
        {
            "sec": "CCD",
            "description": "PAYMENT",
            "effective_date": "260302",
            "entries": [
                {
                    "name": "WIDGET CO",
                    "routing": "021000021",
                    "account": "55555",
                    "account_type": "checking",
                    "amount_cents": 1,
                    "id": "PAY3",
                },
                {
                    "name": "GADGET LLC",
                    "routing": "091000019",
                    "account": "ABC12345",
                    "account_type": "checking",
                    # nach2 takes no amount of $10,000,000 or more (its check counts the
                    # characters of the dollar amount): its largest.
                    "amount_cents": 999999999,
                    "id": "PAY4",
                },
            ],
        },
        {
            "sec": "WEB",
            "description": "PAYMENT",
            "effective_date": "260302",
            "entries": [
                {
                    "name": "CAROL WHITE",
                    "routing": "011000015",
                    "account": "44443333",
                    "account_type": "savings",
                    "amount_cents": 50505,
                    "id": "PAY5",
                }
            ],
        },
    ],
}

# (SEC code, transaction code, amount in cents, masked account) of SPEC's entries, in order.
SPEC_ENTRIES = [
    ("PPD", 27, 1234, "****6789"),
    ("PPD", 37, 100000, "****4321"),
    ("CCD", 27, 1, "****5555"),
    ("CCD", 27, 999999999, "****2345"),
    ("WEB", 37, 50505, "****3333"),
]

# Each implementation numbers traces its own way: achkit by batch from 1 under the ODFI's 8
# digits; carta-ach the same under the immediate destination's; node-nacha across the file from
# 0; nach2 across the file from 0 under the immediate origin's first 8 digits.
TRACES = {
    "achkit": ["091000010000001", "091000010000002"]
    + ["091000010000001", "091000010000002", "091000010000001"],
    "carta-ach": ["091000010000001", "091000010000002"]
    + ["091000010000001", "091000010000002", "091000010000001"],
    "node-nacha": [f"09100001000000{n}" for n in range(5)],
    "nach2": [f"12345678000000{n}" for n in range(5)],
}


def _achkit_write(spec: dict, *, addenda: str = "") -> bytes:
    file = achkit.AchFile.create(
        origin_dfi=spec["destination_routing"],
        company_id=spec["company_identification"],
        destination_routing=spec["destination_routing"],
        destination_name=spec["destination_name"],
        origin_name=spec["origin_name"],
        file_id_modifier=spec["file_id_modifier"],
        creation_date=datetime(2026, 3, 1, 9, 30),
    )
    for b in spec["batches"]:
        effective = (
            f"20{b['effective_date'][:2]}-{b['effective_date'][2:4]}-{b['effective_date'][4:]}"
        )
        batch = file.batch(b["sec"], b["description"], effective)
        for e in b["entries"]:
            add = batch.credit if e.get("direction") == "credit" else batch.debit
            add(
                e["name"],
                e["routing"],
                e["account"],
                e["amount_cents"],
                account_type=e["account_type"],
                id_number=e["id"],
                addenda=e.get("addenda") or None,
            )
    return file.render().encode("ascii")


def _carta_write(spec: dict) -> bytes:
    file = CartaFile(
        "C",
        {
            "immediate_dest": spec["destination_routing"],
            "immediate_org": spec["immediate_origin"],
            "immediate_dest_name": spec["destination_name"],
            "immediate_org_name": spec["origin_name"],
            "company_id": spec["company_identification"],
        },
    )
    for b in spec["batches"]:
        file.add_batch(
            b["sec"],
            [
                {
                    "type": ("3" if e["account_type"] == "savings" else "2")
                    + ("2" if e.get("direction") == "credit" else "7"),
                    "routing_number": e["routing"],
                    "account_number": e["account"],
                    "amount": f"{e['amount_cents'] / 100:.2f}",
                    "name": e["name"],
                    "id_number": e["id"],
                    "addenda": [{"payment_related_info": e["addenda"]}] if e.get("addenda") else [],
                }
                for e in b["entries"]
            ],
            credits=any(e.get("direction") == "credit" for e in b["entries"]),
            debits=any(e.get("direction") != "credit" for e in b["entries"]),
            eff_ent_date=datetime.strptime(b["effective_date"], "%y%m%d"),
            entry_desc=b["description"],
        )
    return file.render_to_string().encode("ascii")


def _node(*args: str, stdin: str | None = None) -> str:
    done = subprocess.run(
        ["node", str(INTEROP / "interop.js"), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _node_write(spec: dict, directory: Path) -> dict[str, bytes]:
    """Both Node implementations' files of ``spec``, in one Node process."""
    request = dict(spec, directory=str(directory))
    request["files"] = {"node-nacha": "node-nacha.ach", "nach2": "nach2.ach"}
    written = json.loads(_node("write", stdin=json.dumps(request)))
    return {library: Path(path).read_bytes() for library, path in written.items()}


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> dict[str, bytes]:
    files = {"achkit": _achkit_write(SPEC), "carta-ach": _carta_write(SPEC)}
    files.update(_node_write(SPEC, tmp_path_factory.mktemp("node")))
    return files


def _inspect(data: bytes, tmp_path: Path) -> list[dict]:
    path = tmp_path / "file.ach"
    path.write_bytes(data)
    out = StringIO()
    call_command("nacha_inspect", str(path), stdout=out)
    return [json.loads(line) for line in out.getvalue().splitlines()]


@pytest.mark.parametrize("library", ["achkit", "carta-ach", "node-nacha", "nach2"])
def test_the_parser_reads_each_implementations_debits_exactly(written, library):
    parsed = parse_nacha(written[library])
    assert [b.header.text("standard_entry_class_code") for b in parsed.batches] == [
        "PPD",
        "CCD",
        "WEB",
    ]
    assert [
        (e.trace_number, e.batch.sec_code, e.transaction_code, e.amount_cents)
        for e in parsed.entries()
    ] == [
        (trace, sec, code, cents)
        for trace, (sec, code, cents, _) in zip(TRACES[library], SPEC_ENTRIES, strict=True)
    ]
    assert [e.receiving_routing_number for e in parsed.entries()] == [
        e["routing"] for b in SPEC["batches"] for e in b["entries"]
    ]
    assert parsed.control.integer("total_debit_amount") == sum(c for _, _, c, _ in SPEC_ENTRIES)
    assert parsed.control.integer("total_credit_amount") == 0
    assert parsed.record_count % 10 == 0


@pytest.mark.parametrize("library", ["achkit", "carta-ach", "node-nacha", "nach2"])
def test_nacha_inspect_prints_each_implementations_entries_masked(written, library, tmp_path):
    lines = _inspect(written[library], tmp_path)
    assert [
        (x["trace_number"], x["sec_code"], x["transaction_code"], x["amount_cents"], x["account"])
        for x in lines
    ] == [
        (trace, sec, code, cents, masked)
        for trace, (sec, code, cents, masked) in zip(TRACES[library], SPEC_ENTRIES, strict=True)
    ]
    assert [x["batch_number"] for x in lines] == [1, 1, 2, 2, 3]
    text = json.dumps(lines)
    assert "123456789" not in text and "ABC12345" not in text  # whole account numbers


def test_the_line_ends_differ_and_are_all_read(written):
    # What each writes, kept as written: LF throughout, nach2's CRLF with an LF after the
    # record before an addenda, and no end after the last record.
    assert written["achkit"].endswith(b"\n") and b"\r" not in written["achkit"]
    assert b"\r\n" in written["nach2"] and not written["nach2"].endswith(b"\n")
    assert not written["node-nacha"].endswith(b"\n")


def test_node_nachas_own_sample_file_is_read_whole():
    parsed = parse_nacha(NODE_NACHA_SAMPLE.read_bytes())
    entries = list(parsed.entries())
    assert parsed.record_count == 190
    assert [b.header.integer("batch_number") for b in parsed.batches] == list(
        range(1, parsed.control.integer("batch_count") + 1)
    )
    assert (entries[0].trace_number, entries[0].amount_cents, entries[0].transaction_code) == (
        "123456780000000",
        14066,
        27,
    )
    assert (len(parsed.batches), len(entries)) == (5, 172)
    assert len(entries) == parsed.control.integer("entry_addenda_count")
    assert sum(e.amount_cents for e in entries) == 9764352
    assert parsed.control.integer("total_debit_amount") == 9764352
    assert {e.batch.sec_code for e in entries} == {"WEB"}


# --- What they write that the rules refuse --------------------------------------------------

# Header, two batches of two entries and their controls, file control: ten records, one block.
ONE_BLOCK = copy.deepcopy(SPEC)
ONE_BLOCK["batches"] = [
    dict(SPEC["batches"][0]),
    dict(SPEC["batches"][1]),
]


def test_node_nachas_extra_block_of_nines_is_refused_naming_the_file_control(tmp_path):
    # Ten records fill one block; node-nacha adds ten 9-filled records more and its control
    # says one block: the rules' block count counts the file's blocks, so the file is wrong.
    data = _node_write(ONE_BLOCK, tmp_path)["node-nacha"]
    assert data.count(b"\n") + 1 == 20
    with pytest.raises(NachaFormatError) as refused:
        parse_nacha(data)
    assert refused.value.record_number == 10
    assert refused.value.reason == (
        "file control block count says 1, the file has 2 blocks of 10 records"
    )
    # The others write the same ten records as one block, read whole.
    assert parse_nacha(_achkit_write(ONE_BLOCK)).record_count == 10
    assert parse_nacha(_carta_write(ONE_BLOCK)).record_count == 10


WITH_ADDENDA = copy.deepcopy(SPEC)
WITH_ADDENDA["batches"][0]["entries"][1]["addenda"] = "INVOICE 42"


@pytest.mark.parametrize("library", ["achkit", "carta-ach"])
def test_an_addenda_05_is_read_with_its_entry(library):
    data = _achkit_write(WITH_ADDENDA) if library == "achkit" else _carta_write(WITH_ADDENDA)
    parsed = parse_nacha(data)
    second = list(parsed.entries())[1]
    assert [a["addenda_type_code"] for a in second.addenda] == ["05"]
    assert second.addenda[0].text("payment_related_information") == "INVOICE 42"
    assert second.addenda[0]["entry_detail_sequence_number"] == second.trace_number[-7:]
    assert parsed.control.integer("entry_addenda_count") == 6


def test_node_nachas_addenda_naming_another_entry_is_refused_naming_it(tmp_path, written):
    # node-nacha counts the addenda's entry detail sequence number from 1 and its traces from 0:
    # the addenda names the entry after its own.
    data = _node_write(WITH_ADDENDA, tmp_path)["node-nacha"]
    with pytest.raises(NachaFormatError) as refused:
        parse_nacha(data)
    assert refused.value.record_number == 5
    assert refused.value.reason == (
        "addenda 05 entry detail sequence number (columns 88-94) must be the last 7 digits of "
        "its entry's trace number (record 4)"
    )
    with pytest.raises(CommandError, match=r"record 5: addenda 05 entry detail sequence"):
        _inspect(data, tmp_path)


def test_nach2s_addenda_without_its_entrys_number_is_refused_naming_it(tmp_path):
    # nach2 fills the addenda's numbers before the batch gives the entry its trace number:
    # the entry detail sequence number is left blank.
    data = _node_write(WITH_ADDENDA, tmp_path)["nach2"]
    with pytest.raises(NachaFormatError) as refused:
        parse_nacha(data)
    assert refused.value.record_number == 5
    assert refused.value.reason == (
        "addenda 05 entry_detail_sequence_number (columns 88-94) must be digits"
    )


# --- Our files, read by them ----------------------------------------------------------------

ORIGINATOR = parse_originator(ORIGINATOR_SETTING)
OURS = [
    ("PPD", "checking", "011000015", 1234),
    ("PPD", "savings", "021000021", 100000),
    ("CCD", "checking", "091000019", 1),
    ("WEB", "checking", "011000015", 99999999),
]
OUR_ENTRIES = [
    (f"02100002{n:07d}", sec, 37 if kind == "savings" else 27, cents)
    for n, (sec, kind, _, cents) in enumerate(OURS, start=1)
]


@pytest.fixture(scope="module")
def ours(tmp_path_factory) -> Path:
    data = nacha_file_write(
        originator=ORIGINATOR,
        entries=[
            FileEntry(
                trace_number=f"02100002{n:07d}",
                sec_code=sec,
                account_type=kind,
                routing_number=routing,
                account_number=f"98765{n:04d}",
                amount_cents=cents,
                identification=f"pay-{n}",
                receiver_name=f"Customer {n}",
            )
            for n, (sec, kind, routing, cents) in enumerate(OURS, start=1)
        ],
        effective_entry_date=date(2026, 3, 2),
        created_at=datetime(2026, 3, 1, 9, 30, tzinfo=EASTERN),
        file_id_modifier="A",
    )
    path = tmp_path_factory.mktemp("ours") / "ours.ach"
    path.write_bytes(data)
    return path


def achkit_entries(parsed: dict) -> list[tuple[str, str, int, int]]:
    """(trace, SEC code, transaction code, amount in cents) of each entry achkit read."""
    return [
        (e["trace_number"], b["sec"], e["txn_code"], e["amount_cents"])
        for b in parsed["batches"]
        for e in b["entries"]
    ]


def carta_entries(parsed: dict) -> list[tuple[str, str, int, int]]:
    """The same of what carta-ach read."""
    return [
        (
            e["entry_detail"]["trace_num"],
            b["batch_header"]["std_ent_cls_code"],
            int(e["entry_detail"]["transaction_code"]),
            int(e["entry_detail"]["amount"]),
        )
        for b in parsed["batches"]
        for e in b["entries"]
    ]


def node_nacha_entries(path: Path) -> list[tuple[str, str, int, int]]:
    """The same of what node-nacha reads of the file at ``path``."""
    parsed = json.loads(_node("parse", str(path)))
    return [
        (e["trace_number"], b["sec"], int(e["transaction_code"]), e["amount_cents"])
        for b in parsed["batches"]
        for e in b["entries"]
    ]


def test_achkit_validates_and_reads_our_file(ours):
    text = ours.read_text()
    assert achkit.validate(text) == {"ok": True, "errors": []}
    parsed = achkit.parse(text)
    assert achkit_entries(parsed) == OUR_ENTRIES
    assert parsed["control"]["total_debit"] == sum(c for *_, c in OUR_ENTRIES)


def test_carta_ach_reads_our_file(ours):
    parsed = CartaParser(ours.read_text()).as_dict()
    assert carta_entries(parsed) == OUR_ENTRIES
    assert int(parsed["file_control"]["block_count"]) == 2


def test_node_nacha_reads_our_file(ours):
    assert node_nacha_entries(ours) == OUR_ENTRIES


def _our_answers(tmp_path: Path) -> Path:
    """Our bank writer's answer to our file: two returns and a NOC."""
    entries = list(parse_nacha(FILES.joinpath("ppd-debit.ach").read_bytes()).entries())
    data = nacha_answer_file_write(
        answers=[
            BankAnswer(entry=entries[0], code="R01"),
            BankAnswer(entry=entries[1], code="R10"),
            BankAnswer(entry=entries[0], code="C05", corrected_data="37"),
        ],
        bank_routing_number="011000015",
        bank_name="Receiving Bank",
        odfi_routing_number="021000021",
        odfi_name="First ODFI Bank",
        created_at=datetime(2026, 3, 3, 8, 0, tzinfo=EASTERN),
    )
    path = tmp_path / "answers.ach"
    path.write_bytes(data)
    return path


def test_achkit_and_carta_read_our_returns_and_nocs_with_their_codes(tmp_path):
    path = _our_answers(tmp_path)
    ours = [
        (
            e.trace_number,
            e.batch.sec_code,
            e.return_addenda["addenda_type_code"],
            e.return_addenda.text(
                "change_code"
                if e.return_addenda["addenda_type_code"] == "98"
                else "return_reason_code"
            ),
            e.return_addenda["original_entry_trace_number"],
        )
        for e in parse_nacha(path.read_bytes()).entries()
    ]
    assert [row[2:4] for row in ours] == [("99", "R01"), ("99", "R10"), ("98", "C05")]
    achkits = achkit.parse(path.read_text())
    assert [
        (e["trace_number"], b["sec"], a["type"], a["info"][:3], a["info"][3:18])
        for b in achkits["batches"]
        for e in b["entries"]
        for a in e["addenda"]
    ] == ours
    cartas = CartaParser(path.read_text()).as_dict()
    assert [
        (
            e["entry_detail"]["trace_num"],
            b["batch_header"]["std_ent_cls_code"],
            a["addenda_type_code"],
            a["pmt_rel_info"][:3],
            a["pmt_rel_info"][3:18],
        )
        for b in cartas["batches"]
        for e in b["entries"]
        for a in e["addenda"]
    ] == ours


def test_achkits_validator_miscounts_return_entries_which_the_rules_count_as_debits(tmp_path):
    # A return of a debit carries transaction code 26 (or 36), a debit code by the rules: our
    # batch control counts it in the total debit amount, achkit counts only codes ending in 7
    # or 8. The parser checks the rules' totals and reads the file whole.
    path = _our_answers(tmp_path)
    parsed = parse_nacha(path.read_bytes())
    returns = [e for e in parsed.entries() if e.return_addenda["addenda_type_code"] == "99"]
    assert [e.transaction_code for e in returns] == [26, 36]
    assert parsed.batches[0].control.integer("total_debit_amount") == sum(
        e.amount_cents for e in returns
    )
    assert [e["code"] for e in achkit.validate(path.read_text())["errors"]] == [
        "BAD_BATCH_DEBIT",
        "BAD_FILE_DEBIT",
    ]
