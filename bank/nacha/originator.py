"""The originator's identity as ``NACHA_ORIGINATOR`` gives it, read into the writer's type.

Apart from ``bank.nacha.settings`` because ``bank.conf`` checks the setting with it:
this module imports no setting.
"""

from __future__ import annotations

from typing import Any

from bank.nacha.routing import routing_number_problem
from bank.nacha.writer import Originator, clean_text

ORIGINATOR_KEYS = {
    "odfi_routing_number": "the ODFI's routing number (9 digits): traces and batches carry it",
    "odfi_name": "the ODFI's name, the file header's immediate destination name",
    "immediate_destination": "optional: the routing number files are addressed to (the ODFI's)",
    "immediate_origin": "10 characters agreed with the bank, often 1 and the EIN",
    "immediate_origin_name": "our name in the file header",
    "company_name": "the name the receiver's statement shows (16 characters)",
    "company_identification": "10 characters, often 1 and the EIN",
    "company_entry_description": "optional: what the statement says (10 characters; PAYMENT)",
}
_OPTIONAL = {"immediate_destination", "company_entry_description"}


def parse_originator(value: Any) -> Originator | None:
    """``NACHA_ORIGINATOR`` as an ``Originator``; None when unset. ValueError names what is
    wrong (the start-up check calls this too)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError("must be a dict")
    unknown = sorted(set(value) - set(ORIGINATOR_KEYS))
    if unknown:
        raise ValueError(f"unknown key(s) {unknown}")
    missing = sorted(set(ORIGINATOR_KEYS) - _OPTIONAL - set(value))
    if missing:
        raise ValueError(f"missing key(s) {missing}")
    if not all(isinstance(v, str) for v in value.values()):
        raise ValueError("every value is a string")
    odfi = value["odfi_routing_number"]
    destination = value.get("immediate_destination", odfi)
    for key, number in (("odfi_routing_number", odfi), ("immediate_destination", destination)):
        if problem := routing_number_problem(number):
            raise ValueError(f"{key}: {problem}")
    for key, width in (("immediate_origin", 10), ("company_identification", 10)):
        text = value[key]
        if not (1 <= len(text) <= width and text.isascii() and text.isalnum()):
            raise ValueError(f"{key}: 1 to {width} letters or digits")
    for key in ("odfi_name", "immediate_origin_name", "company_name"):
        if not clean_text(value[key], 23):
            raise ValueError(f"{key}: a name is needed")
    return Originator(
        immediate_destination=destination,
        immediate_destination_name=value["odfi_name"],
        immediate_origin=value["immediate_origin"],
        immediate_origin_name=value["immediate_origin_name"],
        company_name=value["company_name"],
        company_identification=value["company_identification"].ljust(10),
        company_entry_description=value.get("company_entry_description", "PAYMENT"),
        odfi_identification=odfi[:8],
    )
