"""The bank's side of the format: return and NOC files answering entries of ours.

What an RDFI and the ODFI send back, written from the layouts the parser reads: a return
entry (transaction code 26 or 36, the original amount) with its addenda 99, or a NOC entry (the
same codes, zero amount, in a COR batch) with its addenda 98. The development bank
(``sandbox.bank``) writes its answers with it, and the tests build return files with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from bank.nacha import layouts as L
from bank.nacha.parser import Entry
from bank.nacha.routing import check_digit
from bank.nacha.writer import format_record

RETURN_TRANSACTION_CODES = {27: 26, 28: 26, 37: 36, 38: 36, 22: 21, 32: 31}


@dataclass(frozen=True)
class BankAnswer:
    entry: Entry  # the original entry, as the parser read it from our file
    code: str  # R01..., or C01...
    corrected_data: str = ""  # a NOC's, as the 29 columns hold it
    addenda_information: str = ""


def nacha_answer_file_write(
    *,
    answers: list[BankAnswer],
    bank_routing_number: str,
    bank_name: str,
    odfi_routing_number: str,
    odfi_name: str,
    created_at: datetime,
    file_id_modifier: str = "A",
) -> bytes:
    """A file of return and NOC entries, blocked to ten; the bank's own trace numbers."""
    bank8 = bank_routing_number[:8]
    records = [
        format_record(
            L.FILE_HEADER,
            {
                "priority_code": "01",
                "immediate_destination": " " + odfi_routing_number,
                "immediate_origin": " " + bank_routing_number,
                "file_creation_date": created_at.strftime("%y%m%d"),
                "file_creation_time": created_at.strftime("%H%M"),
                "file_id_modifier": file_id_modifier,
                "immediate_destination_name": odfi_name[:23].upper(),
                "immediate_origin_name": bank_name[:23].upper(),
            },
        )
    ]
    groups = [
        ("PPD", [a for a in answers if a.code.startswith("R")]),
        ("COR", [a for a in answers if a.code.startswith("C")]),
    ]
    sequence = batches = count = debit = credit = file_hash = 0
    for sec_code, group in groups:
        if not group:
            continue
        batches += 1
        company = group[0].entry.batch.company_identification
        header = {
            "service_class_code": "200",
            "company_name": "RETURNS" if sec_code == "PPD" else "NOTIFICATIONS",
            "company_identification": company,
            "standard_entry_class_code": sec_code,
            "company_entry_description": "RETURN" if sec_code == "PPD" else "NOC",
            "effective_entry_date": created_at.strftime("%y%m%d"),
            "originator_status_code": "1",
            "originating_dfi_identification": bank8,
            "batch_number": batches,
        }
        records.append(format_record(L.BATCH_HEADER, header))
        b_count = b_hash = b_debit = b_credit = 0
        for answer in group:
            sequence += 1
            original = answer.entry
            trace = f"{bank8}{sequence:07d}"
            odfi8 = original.trace_number[:8]
            code = RETURN_TRANSACTION_CODES.get(original.transaction_code, 26)
            amount = original.amount_cents if sec_code == "PPD" else 0
            records.append(
                format_record(
                    L.ENTRY_DETAIL,
                    {
                        "transaction_code": code,
                        "receiving_dfi_identification": odfi8,
                        "check_digit": check_digit(odfi8),
                        "dfi_account_number": original.record["dfi_account_number"],
                        "amount": amount,
                        "identification_number": original.record["identification_number"],
                        "receiver_name": original.record["receiver_name"],
                        "addenda_record_indicator": "1",
                        "trace_number": trace,
                    },
                )
            )
            rdfi8 = original.record["receiving_dfi_identification"]
            if sec_code == "PPD":
                layout = L.addenda_99_layout(answer.code)
                values = {
                    "return_reason_code": answer.code,
                    "original_entry_trace_number": original.trace_number,
                    "original_receiving_dfi_identification": rdfi8,
                    "addenda_information": answer.addenda_information,
                    "trace_number": trace,
                }
            else:
                layout = L.addenda_98_layout(answer.code)
                values = {
                    "change_code": answer.code,
                    "original_entry_trace_number": original.trace_number,
                    "original_receiving_dfi_identification": rdfi8,
                    "corrected_data": answer.corrected_data,
                    "trace_number": trace,
                }
            records.append(format_record(layout, values))
            b_count += 2
            b_hash += int(odfi8)
            if code in L.DEBIT_CODES:
                b_debit += amount
            else:
                b_credit += amount
        records.append(
            format_record(
                L.BATCH_CONTROL,
                {
                    "service_class_code": "200",
                    "entry_addenda_count": b_count,
                    "entry_hash": b_hash % 10**10,
                    "total_debit_amount": b_debit,
                    "total_credit_amount": b_credit,
                    "company_identification": company,
                    "originating_dfi_identification": bank8,
                    "batch_number": batches,
                },
            )
        )
        count += b_count
        file_hash += b_hash
        debit += b_debit
        credit += b_credit
    blocks = -(-(len(records) + 1) // L.BLOCKING_FACTOR)
    records.append(
        format_record(
            L.FILE_CONTROL,
            {
                "batch_count": batches,
                "block_count": blocks,
                "entry_addenda_count": count,
                "entry_hash": file_hash % 10**10,
                "total_debit_amount": debit,
                "total_credit_amount": credit,
            },
        )
    )
    records += [L.FILLER_RECORD] * (blocks * L.BLOCKING_FACTOR - len(records))
    return ("\n".join(records) + "\n").encode("ascii")
