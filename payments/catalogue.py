"""The catalogue of processor event types: each type declared once, with everything the
module needs to know about it.

An entry (``EventType``) says what the type is called, what kind of event it is, the fields it
carries beyond the common ones, how it is applied (its handler) and what it does to the ledger.
The callback contract, the OpenAPI schema, the apply path, the admin, the bank file importer
and the chaos invariants read it; no other module spells a type's name.

The kinds:

- a **transition** drives the payment's state machine: the ``@transition``s on ``Payment``
  name the transition types each may take (``payments.state_graph``);
- a **fact** moves money without a transition (a dishonor of a return, a contest of it);
- a **record** moves nothing: it is kept beside the payment (a notification of change).

Handlers and contract fields are named by dotted path and imported on first use, as Django
names its backends: the catalogue sits below every module it names, so the contract, the
models and the services may all read it without an import cycle. A host (or a test) adds a type
with ``event_type_register``; its handler implements ``payments.services.events.EventHandler``.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property

from django.utils.module_loading import import_string


class EventTypeKind(enum.StrEnum):
    TRANSITION = "transition"  # takes a transition of the state machine
    FACT = "fact"  # moves money, no transition
    RECORD = "record"  # moves nothing, kept beside the payment


@dataclass(frozen=True)
class EventField:
    """A field an event type carries beyond the common ones (``payments.events``)."""

    name: str
    # The DRF field that checks it, by dotted path of a callable returning a fresh field.
    contract_field: str
    required: bool = False
    help_text: str = ""

    def contract_field_make(self):
        return import_string(self.contract_field)()


@dataclass(frozen=True)
class EventType:
    name: str
    kind: EventTypeKind
    label: str  # for people: the admin, the dashboard, the docs
    ledger: str  # what it does to the ledger, in words (the docs' reference shows it)
    handler: str  # dotted path of its handler class (``payments.services.events``)
    fields: tuple[EventField, ...] = ()
    # Optional dotted path of ``check(attrs) -> {field: message}``: the contract's rules across
    # this type's fields once each field is valid on its own.
    contract_check: str = ""

    @cached_property
    def handler_instance(self):
        return import_string(self.handler)()

    def contract_check_run(self, attrs: dict) -> dict[str, str]:
        if not self.contract_check:
            return {}
        check: Callable[[dict], dict[str, str]] = import_string(self.contract_check)
        return check(attrs)

    @property
    def moves_state(self) -> bool:
        return self.kind == EventTypeKind.TRANSITION


class UnknownEventType(LookupError):
    """No event type of that name is in the catalogue."""


_CATALOGUE: dict[str, EventType] = {}


def event_type_register(entry: EventType) -> EventType:
    """Add ``entry`` to the catalogue; a second entry under a taken name is refused."""
    if entry.name in _CATALOGUE and _CATALOGUE[entry.name] != entry:
        raise ValueError(f"event type {entry.name!r} is in the catalogue already")
    taken = {f.name for e in _CATALOGUE.values() if e.name != entry.name for f in e.fields}
    clash = taken & {f.name for f in entry.fields}
    if clash:
        raise ValueError(
            f"event type {entry.name!r} reuses another type's field(s) {sorted(clash)}"
        )
    _CATALOGUE[entry.name] = entry
    return entry


def event_type_unregister(name: str) -> None:
    """Take a type out again (a test's own type, after the test)."""
    _CATALOGUE.pop(name, None)


def event_type_get(name: str) -> EventType:
    try:
        return _CATALOGUE[name]
    except KeyError:
        raise UnknownEventType(f"{name!r} is not an event type of the catalogue") from None


def event_types() -> tuple[EventType, ...]:
    """Every entry, in the order registered (the contract's and the docs' order)."""
    return tuple(_CATALOGUE.values())


def event_type_label(name: str) -> str:
    """The type's label for people, with its name; a name the catalogue lacks (a row written
    under a type since retired) as it is."""
    entry = _CATALOGUE.get(name)
    return f"{entry.label} ({name})" if entry is not None else name


def event_type_names(kind: EventTypeKind | None = None) -> tuple[str, ...]:
    return tuple(e.name for e in _CATALOGUE.values() if kind is None or e.kind == kind)


def event_fields() -> Iterator[tuple[EventType, EventField]]:
    """Every type-specific field with the type that carries it."""
    for entry in _CATALOGUE.values():
        for event_field in entry.fields:
            yield entry, event_field


# --- the module's own event types --------------------------------------------------------------

_TRANSITIONS = "payments.services.transitions.TransitionHandler"

SUBMITTED = event_type_register(
    EventType(
        name="submitted",
        kind=EventTypeKind.TRANSITION,
        label="Submitted to the ACH network",
        ledger="Nothing.",
        handler=_TRANSITIONS,
    )
)
SETTLED = event_type_register(
    EventType(
        name="settled",
        kind=EventTypeKind.TRANSITION,
        label="Settled",
        ledger="Credits the merchant the debit's amount.",
        handler="payments.services.returns.SettledHandler",
    )
)
FAILED = event_type_register(
    EventType(
        name="failed",
        kind=EventTypeKind.TRANSITION,
        label="Failed",
        ledger="Nothing: a debit that fails before settlement was never credited.",
        handler=_TRANSITIONS,
    )
)
RETURNED = event_type_register(
    EventType(
        name="returned",
        kind=EventTypeKind.TRANSITION,
        label="Returned",
        ledger=(
            "After settlement, reverses the merchant's credit (a debit of the same amount); "
            "before it, nothing. Counted in the merchant's return rates either way."
        ),
        handler="payments.services.returns.ReturnHandler",
    )
)
RETURN_DISHONORED = event_type_register(
    EventType(
        name="return_dishonored",
        kind=EventTypeKind.FACT,
        label="Return dishonored",
        ledger="Re-credits the merchant the reversed amount (the return did not stand).",
        handler="payments.services.dishonors.DishonorAnswerHandler",
    )
)
DISHONOR_CONTESTED = event_type_register(
    EventType(
        name="dishonor_contested",
        kind=EventTypeKind.FACT,
        label="Dishonor contested",
        ledger="Reverses the re-credit of the dishonor (the return stands after all).",
        handler="payments.services.dishonors.DishonorAnswerHandler",
    )
)
NOTIFICATION_OF_CHANGE = event_type_register(
    EventType(
        name="notification_of_change",
        kind=EventTypeKind.RECORD,
        label="Notification of change",
        ledger="Nothing: recorded beside the payment and its token for a person to apply.",
        handler="payments.services.nocs.NocHandler",
        fields=(
            EventField(
                name="change_code",
                contract_field="payments.processor.contract.change_code_field",
                required=True,
                help_text="C01-C14, or C61-C69 for a refused NOC.",
            ),
            EventField(
                name="corrected_data",
                contract_field="payments.processor.contract.corrected_data_field",
                help_text="The corrected fields the change code names.",
            ),
        ),
        contract_check="payments.processor.contract.noc_contract_check",
    )
)
