"""NACHA return reason codes, shipped as data: one row per code the Rules currently define.

Each code has its title, a category (what the return-rate thresholds count it as) and the time
frame the RDFI has to send it: 2 banking days after settlement, or 60 calendar days for
unauthorized returns. Numbers NACHA leaves unassigned (R48-R49, R54-R60, R63-R66, R78-R79) are
absent: a return carrying one is applied and flagged as an unknown code, as any other unknown
code is.

Banking days skip weekends and the Federal Reserve's holidays (``payments.banking_days``, where
``add_banking_days`` lives; it stays importable from here).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from payments.banking_days import add_banking_days


class ReturnCategory(StrEnum):
    NSF = "nsf"
    ADMINISTRATIVE = "administrative"
    UNAUTHORIZED = "unauthorized"
    OTHER = "other"


class TimeFrameUnit(StrEnum):
    BANKING_DAYS = "banking days"
    CALENDAR_DAYS = "calendar days"


@dataclass(frozen=True)
class ReturnCode:
    code: str
    title: str
    category: ReturnCategory
    time_frame_days: int
    time_frame_unit: TimeFrameUnit

    @property
    def time_frame(self) -> str:
        return f"{self.time_frame_days} {self.time_frame_unit}"

    def deadline(self, settled_at: datetime) -> datetime:
        """The last moment a return of this code is on time, for a debit settled then."""
        if self.time_frame_unit == TimeFrameUnit.CALENDAR_DAYS:
            return settled_at + timedelta(days=self.time_frame_days)
        return add_banking_days(settled_at, self.time_frame_days)


UNAUTHORIZED_CODES = ("R05", "R07", "R10", "R11", "R29", "R51")
ADMINISTRATIVE_CODES = ("R02", "R03", "R04")
NSF_CODES = ("R01", "R09")

# code -> title, as the NACHA Operating Rules (Appendix Four) name them.
_TITLES = {
    "R01": "Insufficient Funds",
    "R02": "Account Closed",
    "R03": "No Account/Unable to Locate Account",
    "R04": "Invalid Account Number Structure",
    "R05": "Unauthorized Debit to Consumer Account Using Corporate SEC Code",
    "R06": "Returned per ODFI's Request",
    "R07": "Authorization Revoked by Customer",
    "R08": "Payment Stopped",
    "R09": "Uncollected Funds",
    "R10": "Customer Advises Originator is Not Known to Receiver and/or Originator is Not "
    "Authorized by Receiver to Debit Receiver's Account",
    "R11": "Customer Advises Entry Not in Accordance with the Terms of the Authorization",
    "R12": "Account Sold to Another DFI",
    "R13": "Invalid ACH Routing Number",
    "R14": "Representative Payee Deceased or Unable to Continue in That Capacity",
    "R15": "Beneficiary or Account Holder (Other Than a Representative Payee) Deceased",
    "R16": "Account Frozen/Entry Returned per OFAC Instruction",
    "R17": "File Record Edit Criteria/Entry with Invalid Account Number Initiated Under "
    "Questionable Circumstances",
    "R18": "Improper Effective Entry Date",
    "R19": "Amount Field Error",
    "R20": "Non-Transaction Account",
    "R21": "Invalid Company Identification",
    "R22": "Invalid Individual ID Number",
    "R23": "Credit Entry Refused by Receiver",
    "R24": "Duplicate Entry",
    "R25": "Addenda Error",
    "R26": "Mandatory Field Error",
    "R27": "Trace Number Error",
    "R28": "Routing Number Check Digit Error",
    "R29": "Corporate Customer Advises Not Authorized",
    "R30": "RDFI Not Participant in Check Truncation Program",
    "R31": "Permissible Return Entry (CCD and CTX only)",
    "R32": "RDFI Non-Settlement",
    "R33": "Return of XCK Entry",
    "R34": "Limited Participation DFI",
    "R35": "Return of Improper Debit Entry",
    "R36": "Return of Improper Credit Entry",
    "R37": "Source Document Presented for Payment",
    "R38": "Stop Payment on Source Document",
    "R39": "Improper Source Document/Source Document Presented for Payment",
    "R40": "Return of ENR Entry by Federal Government Agency (ENR only)",
    "R41": "Invalid Transaction Code (ENR only)",
    "R42": "Routing Number/Check Digit Error (ENR only)",
    "R43": "Invalid DFI Account Number (ENR only)",
    "R44": "Invalid Individual ID Number/Identification Number (ENR only)",
    "R45": "Invalid Individual Name/Company Name (ENR only)",
    "R46": "Invalid Representative Payee Indicator (ENR only)",
    "R47": "Duplicate Enrollment (ENR only)",
    "R50": "State Law Affecting RCK Acceptance",
    "R51": "Item Related to RCK Entry is Ineligible or RCK Entry is Improper",
    "R52": "Stop Payment on Item Related to RCK Entry",
    "R53": "Item and RCK Entry Presented for Payment",
    "R61": "Misrouted Return",
    "R62": "Return of Erroneous or Reversing Debit",
    "R67": "Duplicate Return",
    "R68": "Untimely Return",
    "R69": "Field Error(s)",
    "R70": "Permissible Return Entry Not Accepted/Return Not Requested by ODFI",
    "R71": "Misrouted Dishonored Return",
    "R72": "Untimely Dishonored Return",
    "R73": "Timely Original Return",
    "R74": "Corrected Return",
    "R75": "Return Not a Duplicate",
    "R76": "No Errors Found",
    "R77": "Non-Acceptance of R62 Dishonored Return",
    "R80": "IAT Entry Coding Error",
    "R81": "Non-Participant in IAT Program",
    "R82": "Invalid Foreign Receiving DFI Identification",
    "R83": "Foreign Receiving DFI Unable to Settle",
    "R84": "Entry Not Processed by Gateway",
    "R85": "Incorrectly Coded Outbound International Payment",
}


def _row(code: str, title: str) -> ReturnCode:
    if code in UNAUTHORIZED_CODES:
        return ReturnCode(code, title, ReturnCategory.UNAUTHORIZED, 60, TimeFrameUnit.CALENDAR_DAYS)
    if code in ADMINISTRATIVE_CODES:
        category = ReturnCategory.ADMINISTRATIVE
    elif code in NSF_CODES:
        category = ReturnCategory.NSF
    else:
        category = ReturnCategory.OTHER
    return ReturnCode(code, title, category, 2, TimeFrameUnit.BANKING_DAYS)


RETURN_CODES: dict[str, ReturnCode] = {code: _row(code, t) for code, t in _TITLES.items()}


def return_code_get(code: str) -> ReturnCode | None:
    """The table's row for ``code`` (case and surrounding spaces ignored), or ``None``."""
    return RETURN_CODES.get((code or "").strip().upper())


def return_code_label(code: str) -> str:
    """``R01 Insufficient Funds``; an unknown code is shown as such, never hidden."""
    row = return_code_get(code)
    if row is None:
        return f"{code or '(none)'} (unknown code)"
    return f"{row.code} {row.title}"


# Dishonored returns (Appendix Four, part 4): the codes an originator's bank uses to refuse a
# return it received, and the codes the receiving bank contests that dishonor with.
DISHONOR_CODES = ("R61", "R62", "R67", "R68", "R69")
CONTEST_CODES = ("R71", "R72", "R73", "R74", "R75", "R76", "R77")
# An untimely return: only a return the module flagged late may be dishonored as one.
UNTIMELY_RETURN_CODE = "R68"
# A dishonored return goes out within 5 banking days after the return's settlement.
DISHONOR_WINDOW_BANKING_DAYS = 5


def dishonor_deadline(returned_at: datetime) -> datetime:
    """The last moment a dishonor of a return received at ``returned_at`` may be asked for."""
    return add_banking_days(returned_at, DISHONOR_WINDOW_BANKING_DAYS)
