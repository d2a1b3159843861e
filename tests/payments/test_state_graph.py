"""The payment's state graph is declared once, by the ``@transition``s on ``Payment``: every
table the services, the event parser and the docs read is derived from django-fsm's own
transition metadata, and the docs' diagram (docs/explanation/state-machine.md) draws the same
graph."""

import re
from pathlib import Path

from payments.catalogue import EventTypeKind, event_type_names
from payments.events import event_target_state
from payments.models import PAYMENT_GRAPH, STATE_RANK, Payment, PaymentState
from payments.services import EVENT_TRANSITIONS, TRANSITIONS

STATE_MACHINE_PAGE = (
    Path(__file__).resolve().parents[2] / "docs" / "explanation" / "state-machine.md"
)


def _model_edges() -> set[tuple[str, str]]:
    """The graph as django-fsm itself lists the transitions of ``Payment.state``."""
    field = Payment._meta.get_field("state")
    return {(str(t.source), str(t.target)) for t in field.get_all_transitions(Payment)}


def _diagram() -> str:
    """The page's Mermaid state diagram."""
    block = re.search(r"```mermaid\n(.*?)```", STATE_MACHINE_PAGE.read_text(), re.DOTALL)
    assert block is not None, f"{STATE_MACHINE_PAGE} has no mermaid diagram"
    return block.group(1)


def _diagram_edges(diagram: str) -> set[tuple[str, str]]:
    """Every ``a --> b`` of a Mermaid state diagram, leaving out its start and end (``[*]``)."""
    return {
        (source, target)
        for source, target in re.findall(r"^\s*(\S+)\s*-->\s*(\S+)", diagram, re.M)
        if "[*]" not in (source, target)
    }


def test_the_docs_diagram_draws_the_models_state_graph():
    diagram = _diagram()

    assert _diagram_edges(diagram) == _model_edges()
    named = set(re.findall(r"[a-z]+", diagram)) & set(PaymentState.values)
    assert named == set(PaymentState.values)  # every state is in the picture


def test_the_diagram_reader_takes_each_arrow_and_leaves_out_start_and_end():
    drawn = _diagram_edges(
        "stateDiagram-v2\n    [*] --> pending\n    pending --> submitted\n"
        "    submitted-->failed\n    failed --> [*]\n"
    )
    assert drawn == {("pending", "submitted"), ("submitted", "failed")}


def test_every_table_is_read_from_the_models_transitions():
    assert set(TRANSITIONS) == _model_edges()
    assert TRANSITIONS[(PaymentState.PENDING, PaymentState.FAILED)] == "reject"
    assert TRANSITIONS[(PaymentState.PENDING, PaymentState.CANCELED)] == "cancel"
    # A 4xx answer to our submission rejects, the merchant cancels; no processor event may.
    assert EVENT_TRANSITIONS == _model_edges() - {
        (PaymentState.PENDING, PaymentState.FAILED),
        (PaymentState.PENDING, PaymentState.CANCELED),
    }
    assert STATE_RANK == {
        "pending": 0,
        "submitted": 1,
        "canceled": 1,
        "confirmed": 2,
        "failed": 2,
        "returned": 3,
    }
    # The catalogue's transition types are exactly those the transitions take; then the facts
    # that move no state (a return's dishonor answers: money on a returned payment) and a
    # notification of change (recorded only).
    assert PAYMENT_GRAPH.event_types == ("submitted", "settled", "failed", "returned")
    assert event_type_names(EventTypeKind.TRANSITION) == PAYMENT_GRAPH.event_types
    assert event_type_names() == (
        *PAYMENT_GRAPH.event_types,
        "return_dishonored",
        "dishonor_contested",
        "notification_of_change",
    )
    assert event_type_names(EventTypeKind.FACT) == ("return_dishonored", "dishonor_contested")
    assert event_type_names(EventTypeKind.RECORD) == ("notification_of_change",)
    assert PAYMENT_GRAPH.event_targets == {
        "submitted": "submitted",
        "settled": "confirmed",
        "failed": "failed",
        "returned": "failed",
    }


def test_a_return_fails_a_payment_before_settlement_and_returns_it_after():
    targets = {state: event_target_state("returned", state) for state in PAYMENT_GRAPH.states}

    assert targets == {
        "pending": "failed",  # refused: a pending payment cannot fail by an event
        "submitted": "failed",
        "confirmed": "returned",
        "failed": "failed",  # stale, or recorded when the failure had no return yet
        "returned": "returned",  # stale
        "canceled": "failed",  # refused: a canceled payment moved no money to return
    }
    for event_type in ("submitted", "failed"):
        assert {event_target_state(event_type, s) for s in PAYMENT_GRAPH.states} == {
            PAYMENT_GRAPH.event_targets[event_type]
        }


def test_a_settlement_confirms_a_payment_and_returns_one_that_failed_by_a_later_return():
    targets = {state: event_target_state("settled", state) for state in PAYMENT_GRAPH.states}

    assert targets == {
        "pending": "confirmed",  # refused: no path pending -> confirmed
        "submitted": "confirmed",
        "confirmed": "confirmed",  # stale
        # settle_before_return, taken only when the return it failed by came later
        # (payments.services.returns.SettledHandler); refused otherwise.
        "failed": "returned",
        "returned": "returned",  # stale
        "canceled": "confirmed",  # refused
    }
    assert TRANSITIONS[(PaymentState.FAILED, PaymentState.RETURNED)] == "settle_before_return"


def test_an_event_is_stale_when_its_target_equals_or_lies_behind_the_state():
    assert PAYMENT_GRAPH.is_stale("submitted", "confirmed")
    assert PAYMENT_GRAPH.is_stale("failed", "failed")
    assert PAYMENT_GRAPH.is_stale("failed", "returned")
    assert not PAYMENT_GRAPH.is_stale("failed", "confirmed")  # refused instead: no such move
    assert not PAYMENT_GRAPH.is_stale("confirmed", "submitted")
