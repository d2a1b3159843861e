"""One entry of a parsed file as a plain dict: what ``nacha_inspect`` prints and what a human
reads in the admin, with the account number masked to its last 4 digits.

A NOC's corrected data is left out: for C01, C03, C06 and C07 it is a new account number.
"""

from __future__ import annotations

from typing import Any

from bank.nacha import layouts as L
from bank.nacha.parser import Entry
from payments.catalogue import NOTIFICATION_OF_CHANGE
from payments.kernel.bank_numbers import mask_account


def return_kind(code: str) -> str:
    if code.startswith("C"):
        noc = NOTIFICATION_OF_CHANGE.name
        return f"refused_{noc}" if code in L.REFUSED_CHANGE_CODES else noc
    if code in L.DISHONORED_RETURN_CODES:
        return "dishonored_return"
    if code in L.CONTESTED_RETURN_CODES:
        return "contested_return"
    return "return"


def entry_summary(entry: Entry) -> dict[str, Any]:
    record = entry.record
    summary: dict[str, Any] = {
        "record": record.number,
        "batch_number": entry.batch.number,
        "trace_number": entry.trace_number,
        "sec_code": entry.batch.sec_code,
        "transaction_code": entry.transaction_code,
        "amount_cents": entry.amount_cents,
        "account": mask_account(record["dfi_account_number"]),
        "addenda": [a["addenda_type_code"] for a in entry.addenda],
    }
    addenda = entry.return_addenda
    if addenda is not None:
        is_noc = addenda["addenda_type_code"] == "98"
        code = addenda.text("change_code" if is_noc else "return_reason_code")
        summary["kind"] = return_kind(code)
        summary["change_code" if is_noc else "return_code"] = code
        summary["original_trace_number"] = addenda["original_entry_trace_number"]
    return summary
