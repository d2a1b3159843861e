"""NACHA change codes of a notification of change (NOC), shipped as data, and the corrected
data each one may carry.

A NOC (C01-C14) tells the originator that a detail of an entry was wrong and what it should
be; the originator must apply it within 6 banking days or before the next entry, whichever is
later (``NOC_DEADLINE_BANKING_DAYS``). A refused NOC (C61-C69) says a NOC could not be used;
it is recorded, and nothing has to be applied.

The corrected data is an object of the fields the code names. Account, routing and DFI
numbers are never carried raw (the module accepts and stores no bank number anywhere): a
processor states their last four digits, and for a corrected account the token it now holds
for it (``source_token``). Each value is a short string of a stated form, so a NOC is small
and flat however hostile the sender.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from payments.kernel.bank_numbers import (
    BANK_NUMBER_MESSAGE,
    looks_like_bank_number,
    mask_bank_numbers,
)

NOC_DEADLINE_BANKING_DAYS = 6

_LAST4 = (re.compile(r"[0-9]{4}"), "exactly 4 digits (the last four; never the whole number)")
_TEXT = (
    re.compile(r"[A-Za-z0-9 .,'&/()#-]{1,35}"),
    "1-35 characters of letters, digits, spaces and . , ' & / ( ) # -",
)
# What a value of each key must look like, and how the refusal says so.
CORRECTED_FIELDS: dict[str, tuple[re.Pattern, str]] = {
    "account_number_last4": _LAST4,
    "routing_number_last4": _LAST4,
    "receiving_dfi_identification_last4": _LAST4,
    "source_token": (
        re.compile(r"[A-Za-z0-9_-]{8,128}"),
        "the processor's token for the corrected account: 8-128 of A-Z, a-z, 0-9, _ or -",
    ),
    "account_type": (re.compile(r"checking|savings"), "checking or savings"),
    "transaction_code": (re.compile(r"[0-9]{2}"), "a 2-digit ACH transaction code"),
    "individual_name": _TEXT,
    "individual_identification_number": (
        re.compile(r"[A-Za-z0-9 -]{1,15}"),
        "1-15 characters of letters, digits, spaces or -",
    ),
    "company_name": _TEXT,
    "company_identification": (
        re.compile(r"[A-Za-z0-9 ]{1,10}"),
        "1-10 characters of letters, digits or spaces",
    ),
    "addenda_information": (
        re.compile(r"[A-Za-z0-9 .,'&/()#*:-]{1,80}"),
        "1-80 characters of letters, digits, spaces and . , ' & / ( ) # * : -",
    ),
    "sec_code": (re.compile(r"[A-Z]{3}"), "a 3-letter SEC code"),
}
CORRECTED_DATA_MAX_KEYS = len(CORRECTED_FIELDS)

_ACCOUNT = ("account_number_last4", "source_token")
_ROUTING = ("routing_number_last4", "source_token")
_TRANSACTION = ("transaction_code", "account_type")


@dataclass(frozen=True)
class ChangeCode:
    code: str
    title: str
    fields: tuple[str, ...]  # the corrected_data keys this code may carry
    refused: bool = False  # C61-C69: a refused NOC, nothing to apply


def _fields(*groups: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(name for group in groups for name in group))


_ROWS = [
    ChangeCode("C01", "Incorrect DFI Account Number", _fields(_ACCOUNT)),
    ChangeCode("C02", "Incorrect Routing Number", _fields(_ROUTING)),
    ChangeCode(
        "C03",
        "Incorrect Routing Number and Incorrect DFI Account Number",
        _fields(_ROUTING, _ACCOUNT),
    ),
    ChangeCode("C04", "Incorrect Individual Name/Receiving Company Name", ("individual_name",)),
    ChangeCode("C05", "Incorrect Transaction Code", _TRANSACTION),
    ChangeCode(
        "C06",
        "Incorrect DFI Account Number and Incorrect Transaction Code",
        _fields(_ACCOUNT, _TRANSACTION),
    ),
    ChangeCode(
        "C07",
        "Incorrect Routing Number, Incorrect DFI Account Number, and Incorrect Transaction Code",
        _fields(_ROUTING, _ACCOUNT, _TRANSACTION),
    ),
    ChangeCode(
        "C08",
        "Incorrect Receiving DFI Identification (IAT Only)",
        ("receiving_dfi_identification_last4", "source_token"),
    ),
    ChangeCode(
        "C09", "Incorrect Individual Identification Number", ("individual_identification_number",)
    ),
    ChangeCode("C10", "Incorrect Company Name", ("company_name",)),
    ChangeCode("C11", "Incorrect Company Identification", ("company_identification",)),
    ChangeCode(
        "C12",
        "Incorrect Company Name and Company Identification",
        ("company_name", "company_identification"),
    ),
    ChangeCode("C13", "Addenda Format Error", ("addenda_information",)),
    ChangeCode("C14", "Incorrect SEC Code for Outbound International Payment", ("sec_code",)),
    ChangeCode("C61", "Misrouted Notification of Change", (), refused=True),
    ChangeCode("C62", "Incorrect Trace Number", (), refused=True),
    ChangeCode("C63", "Incorrect Company Identification Number", (), refused=True),
    ChangeCode("C64", "Incorrect Individual Identification Number/Identification Number", (), True),
    ChangeCode("C65", "Incorrectly Formatted Corrected Data", (), refused=True),
    ChangeCode("C66", "Incorrect Discretionary Data", (), refused=True),
    ChangeCode("C67", "Routing Number Not From Original Entry Detail Record", (), refused=True),
    ChangeCode("C68", "DFI Account Number Not From Original Entry Detail Record", (), True),
    ChangeCode("C69", "Incorrect Transaction Code", (), refused=True),
]
CHANGE_CODES: dict[str, ChangeCode] = {row.code: row for row in _ROWS}

# What the contract takes as a change code: a known one is checked against the table; any
# other of this form is recorded and flagged as unknown, never dropped.
CHANGE_CODE_RE = re.compile(r"[A-Z0-9]{1,8}")


def change_code_get(code: str) -> ChangeCode | None:
    return CHANGE_CODES.get(code or "")


def corrected_data_problems(code: str, data: dict) -> dict[str, str]:
    """What is wrong with ``data`` as the corrected data of a NOC with ``code``: key -> problem
    (``""`` for the object as a whole). A known code takes only its own keys; an unknown one
    any key of the table, each value of its stated form. Values are never quoted back, nor a
    key's digits beyond the last 4 of a run (``payments.kernel.bank_numbers``)."""
    row = change_code_get(code)
    allowed = row.fields if row is not None else tuple(CORRECTED_FIELDS)
    problems: dict[str, str] = {}
    if len(data) > CORRECTED_DATA_MAX_KEYS:
        return {"": f"at most {CORRECTED_DATA_MAX_KEYS} keys, got {len(data)}"}
    for key, value in data.items():
        if key not in allowed:
            # A key is named back only as a field name, and a bank number in it never whole.
            label = mask_bank_numbers(key) if re.fullmatch(r"[a-z0-9_]{1,40}", key) else "(a key)"
            if row is not None and not allowed:
                problems[label] = f"a refused NOC ({code}) carries no corrected data"
            else:
                expected = ", ".join(allowed)
                problems[label] = f"not a corrected field of {code}; accepted: {expected}"
            continue
        pattern, form = CORRECTED_FIELDS[key]
        if not isinstance(value, str):
            problems[key] = f"must be a JSON string: {form}"
        elif not pattern.fullmatch(value):
            problems[key] = f"must be {form}"
        elif looks_like_bank_number(value):
            problems[key] = BANK_NUMBER_MESSAGE
    return problems
