"""Write a BAI2 statement, as a bank does: for the sandbox bank and the tests (a reader's
fixtures written by the rules, every control total and record count computed)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime


@dataclass(frozen=True)
class Line:
    type_code: str
    amount_cents: int
    bank_reference: str = ""
    customer_reference: str = ""
    text: str = ""


def bai2_statement_write(
    *,
    sender: str,
    receiver: str,
    account_number: str,
    as_of_date: date,
    created_at: datetime,
    file_id: str,
    lines: list[Line],
    opening_cents: int = 0,
    currency: str = "USD",
    text_width: int = 80,
    as_of_modifier: str = "2",
) -> bytes:
    """One group, one account: the opening ledger (010) and closing ledger (015) summaries, a
    16 per line (a text longer than ``text_width`` goes on in 88 records), and the trailers."""
    closing = opening_cents + sum(
        line.amount_cents if int(line.type_code) < 400 else -line.amount_cents for line in lines
    )
    account = [f"03,{account_number},{currency},010,{opening_cents},,,015,{closing},,/"]
    total = opening_cents + closing
    for line in lines:
        record = (
            f"16,{line.type_code},{line.amount_cents},Z,{line.bank_reference},"
            f"{line.customer_reference},"
        )
        text = line.text
        first = max(text_width - len(record), 0)
        account.append(record + text[:first])
        rest = text[first:]
        while rest:
            account.append("88," + rest[: text_width - 3])
            rest = rest[text_width - 3 :]
        total += line.amount_cents
    account.append(f"49,{total},{len(account) + 1}/")
    group = [
        f"02,{receiver},{sender},1,{as_of_date:%y%m%d},2400,{currency},{as_of_modifier}/",
        *account,
    ]
    group.append(f"98,{total},1,{len(group) + 1}/")
    records = [
        f"01,{sender},{receiver},{created_at:%y%m%d},{created_at:%H%M},{file_id},,,2/",
        *group,
    ]
    records.append(f"99,{total},1,{len(records) + 1}/")
    return ("\n".join(records) + "\n").encode("ascii")
