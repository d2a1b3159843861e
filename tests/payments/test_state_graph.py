"""The payment's state graph is declared once, by the ``@transition``s on ``Payment``: every
table the services, the event parser and the README read is derived from django-fsm's own
transition metadata, and the README's diagram draws the same graph."""

import re
from pathlib import Path

from payments.events import (
    DISHONOR_EVENT_TYPES,
    EVENT_TARGET_STATE,
    EVENT_TYPES,
    RECORDED_EVENT_TYPES,
    event_target_state,
)
from payments.models import PAYMENT_GRAPH, STATE_RANK, Payment, PaymentState
from payments.services import EVENT_TRANSITIONS, TRANSITIONS

README = Path(__file__).resolve().parents[2] / "README.md"

# Box-drawing wires: the sides of a cell each one joins; an arrowhead ends a wire at its target.
_PORTS = {"─": "lr", "│": "ud", "└": "ur", "┘": "ul", "┌": "dr", "┐": "dl", ">": "l", "<": "r"}
_POINTS = {">": "r", "<": "l"}
_STEP = {"l": (0, -1), "r": (0, 1), "u": (-1, 0), "d": (1, 0)}
_OPPOSITE = {"l": "r", "r": "l", "u": "d", "d": "u"}


def _model_edges() -> set[tuple[str, str]]:
    """The graph as django-fsm itself lists the transitions of ``Payment.state``."""
    field = Payment._meta.get_field("state")
    return {(str(t.source), str(t.target)) for t in field.get_all_transitions(Payment)}


def _readme_diagram() -> list[str]:
    """The code block after the README's sentence introducing the state machine."""
    text = README.read_text()
    start = text.index("Payments move through a django-fsm state machine")
    block = re.search(r"```\n(.*?)```", text[start:], re.DOTALL)
    return block.group(1).splitlines()


def _diagram_edges(lines: list[str]) -> set[tuple[str, str]]:
    """Follow every wire of an ASCII diagram from the state it leaves to the state its
    arrowhead points at (a wire may stand one space apart from a state's name)."""
    width = max(map(len, lines))
    grid = [line.ljust(width) for line in lines]
    labels = {}  # cell -> state name
    pattern = r"\b(" + "|".join(PaymentState.values) + r")\b"
    for row, line in enumerate(grid):
        for match in re.finditer(pattern, line):
            labels.update({(row, col): match.group(1) for col in range(*match.span())})

    def at(cell):
        row, col = cell
        return grid[row][col] if 0 <= row < len(grid) and 0 <= col < width else " "

    def beside(cell, side):
        """The next cell on ``side``, skipping one space left or right."""
        step = _STEP[side]
        near = (cell[0] + step[0], cell[1] + step[1])
        if at(near) == " " and side in "lr":
            near = (near[0] + step[0], near[1] + step[1])
        return near

    def follow(cell, entered, source, edges):
        char = at(cell)
        if char in _POINTS:
            target = labels.get(beside(cell, _POINTS[char]))
            if target is not None:
                edges.add((source, target))
            return
        for side in _PORTS[char].replace(entered, ""):
            step = _STEP[side]
            near = (cell[0] + step[0], cell[1] + step[1])
            if _OPPOSITE[side] in _PORTS.get(at(near), ""):
                follow(near, _OPPOSITE[side], source, edges)

    edges: set[tuple[str, str]] = set()
    for cell, source in labels.items():
        for side in _STEP:
            start = beside(cell, side)
            if start not in labels and _OPPOSITE[side] in _PORTS.get(at(start), ""):
                follow(start, _OPPOSITE[side], source, edges)
    return edges


def test_the_readme_diagram_draws_the_models_state_graph():
    lines = _readme_diagram()
    drawn = _diagram_edges(lines)

    assert drawn == _model_edges()
    named = set(re.findall(r"[a-z]+", "\n".join(lines))) & set(PaymentState.values)
    assert named == set(PaymentState.values)  # every state is in the picture


def test_the_diagram_reader_follows_arrows_both_ways_and_around_corners():
    drawn = _diagram_edges(
        [
            "pending ──> submitted",
            "   │",
            "   └──> failed <── confirmed",
            "                      │",
            "          returned <──┘",
        ]
    )
    assert drawn == {
        ("pending", "submitted"),
        ("pending", "failed"),
        ("confirmed", "failed"),
        ("confirmed", "returned"),
    }


def test_every_table_is_read_from_the_models_transitions():
    assert set(TRANSITIONS) == _model_edges()
    assert TRANSITIONS[(PaymentState.PENDING, PaymentState.FAILED)] == "reject"
    # A 4xx answer to our submission rejects; no processor event may.
    assert EVENT_TRANSITIONS == _model_edges() - {(PaymentState.PENDING, PaymentState.FAILED)}
    assert STATE_RANK == {"pending": 0, "submitted": 1, "confirmed": 2, "failed": 2, "returned": 3}
    # The transitions' event types, then the facts that move no state: a return's dishonor
    # answers (money on a returned payment) and a notification of change (recorded only).
    assert PAYMENT_GRAPH.event_types == ("submitted", "settled", "failed", "returned")
    assert EVENT_TYPES == (
        *PAYMENT_GRAPH.event_types,
        *DISHONOR_EVENT_TYPES,
        *RECORDED_EVENT_TYPES,
    )
    assert not set(DISHONOR_EVENT_TYPES) & set(EVENT_TARGET_STATE)
    assert "notification_of_change" in RECORDED_EVENT_TYPES
    assert EVENT_TARGET_STATE == {
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
    }
    for event_type in ("submitted", "settled", "failed"):
        assert {event_target_state(event_type, s) for s in PAYMENT_GRAPH.states} == {
            EVENT_TARGET_STATE[event_type]
        }


def test_an_event_is_stale_when_its_target_equals_or_lies_behind_the_state():
    assert PAYMENT_GRAPH.is_stale("submitted", "confirmed")
    assert PAYMENT_GRAPH.is_stale("failed", "failed")
    assert PAYMENT_GRAPH.is_stale("failed", "returned")
    assert not PAYMENT_GRAPH.is_stale("failed", "confirmed")  # refused instead: no such move
    assert not PAYMENT_GRAPH.is_stale("confirmed", "submitted")
