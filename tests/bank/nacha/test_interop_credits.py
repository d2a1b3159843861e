"""Credits (money out: refunds and payouts) between our writer and parser and the other
implementations (``test_interop.py``): each of achkit, carta-ach, node-nacha and nach2 writes
a file of credits beside a debit that our parser reads exactly, and achkit, carta-ach and
node-nacha read ours. Every one of them writes and reads credits, so none is left out."""

from __future__ import annotations

import copy
from datetime import date, datetime
from pathlib import Path

import achkit
import pytest
from ach.parser import Parser as CartaParser

from bank.nacha.parser import parse_nacha
from bank.nacha.windows import EASTERN
from bank.nacha.writer import FileEntry, nacha_file_write
from tests.bank.nacha.test_interop import (
    ORIGINATOR,
    SPEC,
    _achkit_write,
    _carta_write,
    _node_write,
    achkit_entries,
    carta_entries,
    node_nacha_entries,
)

CREDIT_SPEC = copy.deepcopy(SPEC)
CREDIT_SPEC["batches"] = [
    {
        "sec": "PPD",
        "description": "REFUND",
        "effective_date": "260302",
        "entries": [
            {
                "name": "ALICE SMITH",
                "routing": "021000021",
                "account": "123456789",
                "account_type": "checking",
                "amount_cents": 1234,
                "id": "REF1",
                "direction": "credit",
            },
            {
                "name": "BOB JONES",
                "routing": "011000015",
                "account": "987654321",
                "account_type": "savings",
                "amount_cents": 500,
                "id": "REF2",
                "direction": "credit",
            },
            {
                # A third entry: ten records would fill one block, which node-nacha pads with
                # a block too many (test_interop.py).
                "name": "CAROL WHITE",
                "routing": "011000015",
                "account": "44443333",
                "account_type": "checking",
                "amount_cents": 1,
                "id": "REF3",
                "direction": "credit",
            },
        ],
    },
    {
        "sec": "CCD",
        "description": "PAYOUT",
        "effective_date": "260302",
        "entries": [
            {
                "name": "WIDGET CO",
                "routing": "091000019",
                "account": "55555",
                "account_type": "checking",
                "amount_cents": 99999,
                "id": "PAYOUT1",
                "direction": "credit",
            },
            {
                "name": "GADGET LLC",
                "routing": "021000021",
                "account": "ABC12345",
                "account_type": "checking",
                "amount_cents": 700,
                "id": "PAY1",
            },
        ],
    },
]
# (transaction code, amount in cents) of CREDIT_SPEC's entries, in order.
CREDIT_ENTRIES = [(22, 1234), (32, 500), (22, 1), (22, 99999), (27, 700)]


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> dict[str, bytes]:
    files = {"achkit": _achkit_write(CREDIT_SPEC), "carta-ach": _carta_write(CREDIT_SPEC)}
    files.update(_node_write(CREDIT_SPEC, tmp_path_factory.mktemp("node")))
    return files


@pytest.mark.parametrize("library", ["achkit", "carta-ach", "node-nacha", "nach2"])
def test_the_parser_reads_each_implementations_credits_with_their_totals(written, library):
    parsed = parse_nacha(written[library])

    assert [(e.transaction_code, e.amount_cents) for e in parsed.entries()] == CREDIT_ENTRIES
    assert [e.is_debit for e in parsed.entries()] == [False, False, False, False, True]
    assert [b.header["service_class_code"] for b in parsed.batches] == ["220", "200"]
    assert parsed.control.integer("total_credit_amount") == 1234 + 500 + 1 + 99999
    assert parsed.control.integer("total_debit_amount") == 700


# Trace, SEC code, transaction code, amount in cents: a debit, a refund of it and a payout.
OURS = [
    ("021000020000001", "PPD", 27, 4200, "debit", ""),
    ("021000020000002", "PPD", 22, 1000, "credit", "REFUND"),
    ("021000020000003", "CCD", 32, 25000, "credit", "PAYOUT"),
]


@pytest.fixture(scope="module")
def ours(tmp_path_factory) -> Path:
    data = nacha_file_write(
        originator=ORIGINATOR,
        entries=[
            FileEntry(
                trace_number=trace,
                sec_code=sec,
                account_type="savings" if code == 32 else "checking",
                routing_number="011000015",
                account_number=f"98765{n:04d}",
                amount_cents=cents,
                identification=f"pay-{n}",
                receiver_name=f"Customer {n}",
                direction=direction,
                description=description,
            )
            for n, (trace, sec, code, cents, direction, description) in enumerate(OURS, start=1)
        ],
        effective_entry_date=date(2026, 3, 2),
        created_at=datetime(2026, 3, 1, 9, 30, tzinfo=EASTERN),
        file_id_modifier="A",
    )
    path = tmp_path_factory.mktemp("ours") / "credits.ach"
    path.write_bytes(data)
    return path


EXPECTED = [(trace, sec, code, cents) for trace, sec, code, cents, *_ in OURS]


def test_achkit_validates_and_reads_our_credits(ours):
    text = ours.read_text()
    assert achkit.validate(text) == {"ok": True, "errors": []}
    parsed = achkit.parse(text)
    assert achkit_entries(parsed) == EXPECTED
    assert (parsed["control"]["total_debit"], parsed["control"]["total_credit"]) == (4200, 26000)


def test_carta_ach_reads_our_credits(ours):
    parsed = CartaParser(ours.read_text()).as_dict()
    assert carta_entries(parsed) == EXPECTED
    assert [b["batch_header"]["serv_cls_code"] for b in parsed["batches"]] == [
        "225",
        "220",
        "220",
    ]


def test_node_nacha_reads_our_credits(ours):
    assert node_nacha_entries(ours) == EXPECTED
