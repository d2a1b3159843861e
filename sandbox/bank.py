"""The sandbox as a bank: it reads the files we deliver and writes return and NOC files back.

A development double of the ODFI and its RDFIs, over two directories (the directory transport's
``outbound`` is what it reads, its ``inbound`` what it writes). Each entry is answered by the
receiver's name, since the bank sees account details and never our tokens; the rules follow
the sandbox processor's token rules (``sandbox.faults``):

====================  ========================================================================
``NSF ...``           returned R01 (insufficient funds)
``RETURN ...``        returned R01
``UNAUTH ...``        returned R10 (unauthorized)
``CLOSED ...``        returned R02 (account closed)
``QUESTIONABLE ...``  returned R17 with ``QUESTIONABLE`` in its addenda information (the RDFI
                      believes the account was opened under false pretenses: the account is
                      blocked for every merchant's debits)
``NOACCOUNT ...``     returned R03 (no account): the credit rule, for a refund or payout sent to
                      an account the receiving bank cannot find (the return carries code 21 or
                      31, a credit's; the processor's rule is a token naming ``R03``)
``NOC ...``           a NOC C01: the corrected account number is the account's digits reversed
``NOCSAVINGS ...``    a NOC C05: the account is a savings account (transaction code 37)
anything else         no answer (the entry settles)
====================  ========================================================================

A file it has answered is moved to ``answered/`` beside it, so each is answered once.
"""

from __future__ import annotations

import os
from collections.abc import Container
from datetime import datetime
from pathlib import Path

from bank.nacha.parser import Entry, parse_nacha
from bank.nacha.transports import is_collectable
from bank.nacha.windows import EASTERN
from sandbox.bank_writer import BankAnswer, nacha_answer_file_write

RULES = {
    "NSF": "R01",
    "RETURN": "R01",
    "UNAUTH": "R10",
    "CLOSED": "R02",
    "QUESTIONABLE": "R17",
    "NOACCOUNT": "R03",
    "NOC": "C01",
    "NOCSAVINGS": "C05",
}
BANK_ROUTING_NUMBER = "011000015"


def answer_for(entry: Entry) -> BankAnswer | None:
    words = entry.record.text("receiver_name").split()
    code = RULES.get(words[0]) if words else None
    if code is None:
        return None
    corrected = ""
    if code == "C01":
        corrected = entry.record.text("dfi_account_number")[::-1]
    elif code == "C05":
        corrected = "37"
    addenda = "QUESTIONABLE" if code == "R17" else ""
    return BankAnswer(entry, code, corrected_data=corrected, addenda_information=addenda)


def bank_answer_files(
    *,
    outbound: str,
    inbound: str,
    now: datetime | None = None,
    only: Container[str] | None = None,
) -> list[str]:
    """Answer every file delivered to ``outbound`` (or those of them named in ``only``); the
    names of the files written to ``inbound`` (written whole: a temporary name, then a
    rename). ``now`` is the bank's clock: the answers' creation moment, their events' time."""
    now = (now or datetime.now(EASTERN)).astimezone(EASTERN)
    source, target = Path(outbound), Path(inbound)
    answered_dir = source / "answered"
    written = []
    if not source.is_dir():
        return written
    target.mkdir(parents=True, exist_ok=True)
    for path in sorted(p for p in source.iterdir() if p.is_file() and is_collectable(p.name)):
        if only is not None and path.name not in only:
            continue
        parsed = parse_nacha(path.read_bytes())
        answers = [a for a in map(answer_for, parsed.entries()) if a is not None]
        if answers:
            content = nacha_answer_file_write(
                answers=answers,
                bank_routing_number=BANK_ROUTING_NUMBER,
                bank_name="SANDBOX BANK",
                odfi_routing_number=parsed.header.text("immediate_destination"),
                odfi_name=parsed.header.text("immediate_destination_name"),
                created_at=now,
                file_id_modifier=parsed.header["file_id_modifier"],
            )
            name = f"answers-{path.stem}.ach"
            temporary = target / f".{name}.partial"
            temporary.write_bytes(content)
            os.replace(temporary, target / name)
            written.append(name)
        answered_dir.mkdir(exist_ok=True)
        os.replace(path, answered_dir / path.name)
    return written
