"""A recorded event type that exists only for the tests: the processor's remittance advice,
which says which invoice a debit paid. It is everything a new recorded type needs, in one
module outside the product: its catalogue entry, its own field and its handler."""

import re

from payments.catalogue import EventField, EventType, EventTypeKind
from payments.processor.contract import PatternField
from payments.services.event_handlers import RecordHandler

INVOICE_RE = re.compile(r"INV-[0-9]{1,12}")

REMITTANCE_ADVICE = EventType(
    name="remittance_advice",
    kind=EventTypeKind.RECORD,
    label="Remittance advice",
    ledger="Nothing.",
    handler="tests.catalogue.remittance.RemittanceHandler",
    fields=(
        EventField(
            name="invoice",
            contract_field="tests.catalogue.remittance.invoice_field",
            required=True,
            help_text="The invoice the debit paid: INV- and 1-12 digits.",
        ),
    ),
)

RECORDED: list[tuple[str, str]] = []  # (payment id, invoice), as the handler saw them


def invoice_field() -> PatternField:
    return PatternField(
        pattern=INVOICE_RE,
        invalid="Must be INV- and 1-12 digits; got {value!r}.",
        max_length=16,
        required=False,
        allow_null=True,
    )


class RemittanceHandler(RecordHandler):
    def record(self, *, event, payment, decision, log) -> None:
        RECORDED.append((str(payment.id), event.details["invoice"]))
