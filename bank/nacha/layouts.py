"""The NACHA record layouts, as data: each field's name, columns (1-based, inclusive, as the
NACHA Operating Rules' tables number them) and what it may hold.

The parser and the writer both read these tables, so a column is written down once. Every
layout covers columns 1 to 94 without a gap or an overlap (checked at import).
"""

from __future__ import annotations

from dataclasses import dataclass

RECORD_LENGTH = 94
BLOCKING_FACTOR = 10
FILLER_RECORD = "9" * RECORD_LENGTH

# What a field may hold: digits only; any printable ASCII (alphanumeric fields are left
# justified and space filled); or one fixed value.
NUMERIC = "numeric"
ALPHANUMERIC = "alphanumeric"
CONSTANT = "constant"


@dataclass(frozen=True)
class Field:
    name: str
    start: int
    end: int
    kind: str = ALPHANUMERIC
    value: str = ""  # the fixed value of a CONSTANT field

    @property
    def width(self) -> int:
        return self.end - self.start + 1

    def cut(self, record: str) -> str:
        return record[self.start - 1 : self.end]


@dataclass(frozen=True)
class Layout:
    name: str  # how a refusal names the record: "entry detail", "addenda 99 (dishonored)"
    fields: tuple[Field, ...]

    def field(self, name: str) -> Field:
        for field in self.fields:
            if field.name == name:
                return field
        raise KeyError(name)


def _c(name: str, start: int, value: str) -> Field:
    return Field(name, start, start + len(value) - 1, CONSTANT, value)


def _n(name: str, start: int, end: int) -> Field:
    return Field(name, start, end, NUMERIC)


def _a(name: str, start: int, end: int) -> Field:
    return Field(name, start, end, ALPHANUMERIC)


FILE_HEADER = Layout(
    "file header",
    (
        _c("record_type", 1, "1"),
        _n("priority_code", 2, 3),
        _a("immediate_destination", 4, 13),
        _a("immediate_origin", 14, 23),
        _n("file_creation_date", 24, 29),
        _a("file_creation_time", 30, 33),
        _a("file_id_modifier", 34, 34),
        _c("record_size", 35, "094"),
        _c("blocking_factor", 38, "10"),
        _c("format_code", 40, "1"),
        _a("immediate_destination_name", 41, 63),
        _a("immediate_origin_name", 64, 86),
        _a("reference_code", 87, 94),
    ),
)

BATCH_HEADER = Layout(
    "batch header",
    (
        _c("record_type", 1, "5"),
        _n("service_class_code", 2, 4),
        _a("company_name", 5, 20),
        _a("company_discretionary_data", 21, 40),
        _a("company_identification", 41, 50),
        _a("standard_entry_class_code", 51, 53),
        _a("company_entry_description", 54, 63),
        _a("company_descriptive_date", 64, 69),
        # Six digits for the originator's entries; other implementations write 000000 or blanks
        # in return and NOC batches, so the field is read as text and interpreted apart.
        _a("effective_entry_date", 70, 75),
        _a("settlement_date", 76, 78),  # Julian day, inserted by the ACH operator
        _a("originator_status_code", 79, 79),
        _n("originating_dfi_identification", 80, 87),
        _n("batch_number", 88, 94),
    ),
)

ENTRY_DETAIL = Layout(
    "entry detail",
    (
        _c("record_type", 1, "6"),
        _n("transaction_code", 2, 3),
        _n("receiving_dfi_identification", 4, 11),
        _n("check_digit", 12, 12),
        _a("dfi_account_number", 13, 29),
        _n("amount", 30, 39),
        _a("identification_number", 40, 54),  # individual (PPD, WEB) or company (CCD) id
        _a("receiver_name", 55, 76),
        _a("discretionary_data", 77, 78),  # WEB: the payment type code
        _a("addenda_record_indicator", 79, 79),
        _n("trace_number", 80, 94),
    ),
)

ADDENDA_02 = Layout(
    "addenda 02",
    (
        _c("record_type", 1, "7"),
        _c("addenda_type_code", 2, "02"),
        _a("reference_information_1", 4, 10),
        _a("reference_information_2", 11, 13),
        _a("terminal_identification_code", 14, 19),
        _a("transaction_serial_number", 20, 25),
        _a("transaction_date", 26, 29),
        _a("authorization_code", 30, 35),
        _a("terminal_location", 36, 62),
        _a("terminal_city", 63, 77),
        _a("terminal_state", 78, 79),
        _n("trace_number", 80, 94),
    ),
)

ADDENDA_05 = Layout(
    "addenda 05",
    (
        _c("record_type", 1, "7"),
        _c("addenda_type_code", 2, "05"),
        _a("payment_related_information", 4, 83),
        _n("addenda_sequence_number", 84, 87),
        _n("entry_detail_sequence_number", 88, 94),
    ),
)

# Notification of change (C01-C14).
ADDENDA_98 = Layout(
    "addenda 98",
    (
        _c("record_type", 1, "7"),
        _c("addenda_type_code", 2, "98"),
        _a("change_code", 4, 6),
        _n("original_entry_trace_number", 7, 21),
        _a("reserved_1", 22, 27),
        _n("original_receiving_dfi_identification", 28, 35),
        _a("corrected_data", 36, 64),
        _a("reserved_2", 65, 79),
        _n("trace_number", 80, 94),
    ),
)

# Refused notification of change (C61-C69): the originator's answer to a NOC it refuses.
ADDENDA_98_REFUSED = Layout(
    "addenda 98 (refused)",
    (
        _c("record_type", 1, "7"),
        _c("addenda_type_code", 2, "98"),
        _a("change_code", 4, 6),  # the refused code, C61-C69
        _n("original_entry_trace_number", 7, 21),
        _a("reserved_1", 22, 27),
        _n("original_receiving_dfi_identification", 28, 35),
        _a("corrected_data", 36, 64),
        _a("refused_change_code", 65, 67),  # the NOC's own code, C01-C14
        _a("refused_trace_sequence_number", 68, 74),
        _a("reserved_2", 75, 79),
        _n("trace_number", 80, 94),
    ),
)

# Return (R01-R85 except the dishonored and contested codes below).
ADDENDA_99 = Layout(
    "addenda 99",
    (
        _c("record_type", 1, "7"),
        _c("addenda_type_code", 2, "99"),
        _a("return_reason_code", 4, 6),
        _n("original_entry_trace_number", 7, 21),
        _a("date_of_death", 22, 27),
        _n("original_receiving_dfi_identification", 28, 35),
        _a("addenda_information", 36, 79),
        _n("trace_number", 80, 94),
    ),
)

# Dishonored return (R61-R69): the originator refuses a return that broke the rules.
ADDENDA_99_DISHONORED = Layout(
    "addenda 99 (dishonored)",
    (
        _c("record_type", 1, "7"),
        _c("addenda_type_code", 2, "99"),
        _a("return_reason_code", 4, 6),  # the dishonor's code
        _n("original_entry_trace_number", 7, 21),
        _a("reserved_1", 22, 27),
        _n("original_receiving_dfi_identification", 28, 35),
        _a("reserved_2", 36, 38),
        _a("return_trace_number", 39, 53),
        _a("return_settlement_date", 54, 56),
        _a("original_return_reason_code", 57, 58),  # the dishonored return's R-code, digits only
        _a("addenda_information", 59, 79),
        _n("trace_number", 80, 94),
    ),
)

# Contested dishonored return (R71-R77): the RDFI contests the dishonor.
ADDENDA_99_CONTESTED = Layout(
    "addenda 99 (contested)",
    (
        _c("record_type", 1, "7"),
        _c("addenda_type_code", 2, "99"),
        _a("return_reason_code", 4, 6),  # the contest's code
        _n("original_entry_trace_number", 7, 21),
        _a("date_original_entry_returned", 22, 27),
        _n("original_receiving_dfi_identification", 28, 35),
        _a("original_settlement_date", 36, 38),
        _a("return_trace_number", 39, 53),
        _a("return_settlement_date", 54, 56),
        _a("original_return_reason_code", 57, 58),
        _a("dishonored_return_trace_number", 59, 73),
        _a("dishonored_return_settlement_date", 74, 76),
        _a("dishonored_return_reason_code", 77, 78),
        _a("reserved", 79, 79),
        _n("trace_number", 80, 94),
    ),
)

BATCH_CONTROL = Layout(
    "batch control",
    (
        _c("record_type", 1, "8"),
        _n("service_class_code", 2, 4),
        _n("entry_addenda_count", 5, 10),
        _n("entry_hash", 11, 20),
        _n("total_debit_amount", 21, 32),
        _n("total_credit_amount", 33, 44),
        _a("company_identification", 45, 54),
        _a("message_authentication_code", 55, 73),
        _a("reserved", 74, 79),
        _n("originating_dfi_identification", 80, 87),
        _n("batch_number", 88, 94),
    ),
)

FILE_CONTROL = Layout(
    "file control",
    (
        _c("record_type", 1, "9"),
        _n("batch_count", 2, 7),
        _n("block_count", 8, 13),
        _n("entry_addenda_count", 14, 21),
        _n("entry_hash", 22, 31),
        _n("total_debit_amount", 32, 43),
        _n("total_credit_amount", 44, 55),
        _a("reserved", 56, 94),
    ),
)

ADDENDA_LAYOUTS = {"02": ADDENDA_02, "05": ADDENDA_05}
ALL_LAYOUTS = (
    FILE_HEADER,
    BATCH_HEADER,
    ENTRY_DETAIL,
    ADDENDA_02,
    ADDENDA_05,
    ADDENDA_98,
    ADDENDA_98_REFUSED,
    ADDENDA_99,
    ADDENDA_99_DISHONORED,
    ADDENDA_99_CONTESTED,
    BATCH_CONTROL,
    FILE_CONTROL,
)

DISHONORED_RETURN_CODES = frozenset(f"R{n}" for n in range(61, 70))
CONTESTED_RETURN_CODES = frozenset(f"R{n}" for n in range(71, 78))
REFUSED_CHANGE_CODES = frozenset(f"C{n}" for n in range(61, 70))


def addenda_99_layout(return_reason_code: str) -> Layout:
    """The return layout a code is written in: a dishonor (R61-R69) and a contest (R71-R77)
    carry the return they answer, in columns an ordinary return uses for other things."""
    if return_reason_code in DISHONORED_RETURN_CODES:
        return ADDENDA_99_DISHONORED
    if return_reason_code in CONTESTED_RETURN_CODES:
        return ADDENDA_99_CONTESTED
    return ADDENDA_99


def addenda_98_layout(change_code: str) -> Layout:
    return ADDENDA_98_REFUSED if change_code in REFUSED_CHANGE_CODES else ADDENDA_98


# Transaction codes (second digit 2-4 credit, 6-9 debit; 3 and 8 prenotes, 4 and 9 zero-dollar
# remittance data): demand (2x), savings (3x), general ledger (4x), loan (5x).
CREDIT_CODES = frozenset({21, 22, 23, 24, 31, 32, 33, 34, 41, 42, 43, 44, 51, 52, 53, 54})
DEBIT_CODES = frozenset({26, 27, 28, 29, 36, 37, 38, 39, 46, 47, 48, 49, 55, 56})
TRANSACTION_CODES = CREDIT_CODES | DEBIT_CODES
SERVICE_CLASS_CODES = {"200": "mixed", "220": "credits only", "225": "debits only"}


def _check(layout: Layout) -> None:
    column = 1
    for field in layout.fields:
        if field.start != column or field.end < field.start:
            raise AssertionError(f"{layout.name}: {field.name} starts at {field.start}")
        if field.kind == CONSTANT and len(field.value) != field.width:
            raise AssertionError(f"{layout.name}: {field.name} is not {field.width} wide")
        column = field.end + 1
    if column != RECORD_LENGTH + 1:
        raise AssertionError(f"{layout.name} ends at column {column - 1}")


for _layout in ALL_LAYOUTS:
    _check(_layout)
