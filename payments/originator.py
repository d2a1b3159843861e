"""The originator's duties under the NACHA rules: each entry's standard entry class (SEC code),
its company entry description, and which classes a merchant may originate.

One table, read by the create path, the admin's profile form, the API's input and the bank
path's file cut, so a rule is stated once:

- ``SEC_CODES``: the classes the module originates (PPD, CCD, WEB);
- the Standard Company Entry Descriptions the rules mandate, each for one kind of entry only:
  ``RETRY PYMT`` for every reinitiation (overriding all else), ``REFUND`` and ``PAYOUT`` for
  money out, ``PAYROLL`` for wage credits, ``PURCHASE`` for a consumer's online (WEB) debit
  for goods, ``ACCTVERIFY`` for micro-entries, ``REVERSAL`` for a reversal;
- any other description is the merchant's own: 1 to 10 characters of upper-case printable
  ASCII, never a mandated word used for something else.

A description is never cut or upper-cased for the client: a value that does not fit is refused
with the reason, so the receiver's statement shows exactly what was asked for.
"""

from __future__ import annotations

import re

SEC_CODES = ("PPD", "CCD", "WEB")
# WEB credits are for person-to-person payments only: a refund or payout to a consumer's
# account authorized online goes as PPD.
CREDIT_SEC_CODES = {"WEB": "PPD"}

RETRY_PYMT = "RETRY PYMT"
REFUND = "REFUND"
PAYOUT = "PAYOUT"
PAYROLL = "PAYROLL"
PURCHASE = "PURCHASE"
ACCTVERIFY = "ACCTVERIFY"
REVERSAL = "REVERSAL"
MANDATED_DESCRIPTIONS = (RETRY_PYMT, REFUND, PAYOUT, PAYROLL, PURCHASE, ACCTVERIFY, REVERSAL)

# Which mandated word a client may name on which entry: ``PURCHASE`` on a WEB debit, ``PAYROLL``
# on a payout. The others are the module's to set (a reinitiation, a refund...), never the
# client's.
CLIENT_DESCRIPTIONS = {PURCHASE: ("debit", ("WEB",)), PAYROLL: ("payout", SEC_CODES)}

ENTRY_DESCRIPTION_WIDTH = 10
COMPANY_NAME_WIDTH = 16
COMPANY_IDENTIFICATION_WIDTH = 10
# What a batch header's free-text fields take here: upper-case printable ASCII. Lower case is
# refused rather than upper-cased, so what is stored is what the statement shows.
_DESCRIPTION_RE = re.compile(r"[\x20-\x60\x7b-\x7e]+", re.ASCII)
_COMPANY_ID_RE = re.compile(r"[A-Z0-9]{1,10}", re.ASCII)


def sec_code_problem(value: object) -> str | None:
    """Why ``value`` is not a SEC code the module originates, or None."""
    if value in SEC_CODES:
        return None
    return f"must be one of {', '.join(SEC_CODES)} (upper case)"


def text_problem(value: object, width: int) -> str | None:
    """Why ``value`` cannot be a batch header's free text of ``width`` characters, or None."""
    if not isinstance(value, str):
        return "must be a string"
    if not 1 <= len(value) <= width:
        return f"must be 1 to {width} characters"
    if value != value.strip():
        return "must not start or end with a space"
    if not _DESCRIPTION_RE.fullmatch(value):
        return "must be printable ASCII without lower-case letters"
    return None


def company_identification_problem(value: object) -> str | None:
    if not isinstance(value, str) or not _COMPANY_ID_RE.fullmatch(value):
        return f"must be 1 to {COMPANY_IDENTIFICATION_WIDTH} upper-case letters or digits"
    return None


def entry_description_problem(value: object, *, entry: str = "", sec_code: str = "") -> str | None:
    """Why a client may not name ``value`` as the description of an ``entry`` (``debit`` or
    ``payout``; "" for a merchant's default) of class ``sec_code``, or None. A mandated word is
    refused unless it is what the entry is (``PURCHASE`` on a WEB debit, ``PAYROLL`` on a
    payout)."""
    if problem := text_problem(value, ENTRY_DESCRIPTION_WIDTH):
        return problem
    if value in MANDATED_DESCRIPTIONS:
        allowed = CLIENT_DESCRIPTIONS.get(value)
        if allowed is None or entry != allowed[0] or sec_code not in allowed[1]:
            return f"{value} is a description the NACHA rules reserve for {_reserved_for(value)}"
    return None


def _reserved_for(word: str) -> str:
    return {
        RETRY_PYMT: "a reinitiated entry (the module sets it)",
        REFUND: "a refund (the module sets it)",
        PAYOUT: "a payout (the module sets it)",
        PAYROLL: "a payout of wages",
        PURCHASE: "a WEB debit for the purchase of goods",
        ACCTVERIFY: "account-validation micro-entries",
        REVERSAL: "a reversal",
    }[word]


def allowed_sec_codes_problem(value: object) -> str | None:
    """Why ``value`` cannot be a profile's list of allowed classes, or None."""
    if not isinstance(value, list) or not value:
        return f"must be a non-empty list of {', '.join(SEC_CODES)}"
    if any(code not in SEC_CODES for code in value) or len(set(value)) != len(value):
        return f"must be distinct codes of {', '.join(SEC_CODES)}"
    return None


def credit_sec_code(sec_code: str) -> str:
    """The class a credit to an account of class ``sec_code`` goes as."""
    return CREDIT_SEC_CODES.get(sec_code, sec_code)
