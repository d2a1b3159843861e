"""The payment's state graph as tables, read from the django-fsm transitions on the model.

The model's ``@transition``s are the one statement of the graph. Each names, in its ``custom``
metadata, the processor event types that may take it (``events``; none when only our own
submission's answer does, as a 4xx rejection). Everything the services, the event parser and
the invariant checks ask of the graph is derived from that metadata once, here: which transition
joins two states, which moves an event may make, how far along a state is, and which state an
event drives a payment to. A new transition on the model changes every table at once.
"""

from dataclasses import dataclass
from functools import cached_property

from django.db import models

Edge = tuple[str, str]  # (source state, target state)


@dataclass(frozen=True)
class StateGraph:
    initial: str
    states: tuple[str, ...]
    names: dict[Edge, str]  # (source, target) -> the model's transition method
    events: dict[Edge, tuple[str, ...]]  # (source, target) -> the event types that may take it

    @classmethod
    def of(cls, model: type[models.Model], field_name: str) -> "StateGraph":
        """Read the graph of ``model``'s FSM field ``field_name`` from django-fsm's own metadata."""
        field = model._meta.get_field(field_name)
        names, events = {}, {}
        for transition in field.get_all_transitions(model):
            move = (str(transition.source), str(transition.target))
            names[move] = transition.name
            events[move] = tuple(transition.custom.get("events", ()))
        states = tuple(str(value) for value, _ in field.choices)
        return cls(initial=str(field.default), states=states, names=names, events=events)

    @cached_property
    def rank(self) -> dict[str, int]:
        """How far along each state is: its longest path from the initial state. An event whose
        target ranks below the payment's state is stale (``failed`` ranks as ``confirmed``: both
        are two steps in, neither behind the other)."""
        rank = {self.initial: 0}
        for _ in self.states:  # a path is at most as long as there are states
            for source, target in self.names:
                if source in rank:
                    rank[target] = max(rank.get(target, 0), rank[source] + 1)
        return rank

    @cached_property
    def _reachable(self) -> dict[str, frozenset[str]]:
        """Each state and every state a path leads to from it."""
        reach = {state: {state} for state in self.states}
        for _ in self.states:
            for source, target in self.names:
                reach[source] |= reach[target]
        return {state: frozenset(reached) for state, reached in reach.items()}

    @cached_property
    def event_moves(self) -> dict[str, tuple[Edge, ...]]:
        """Event type -> the moves it may make, in the graph's order (by the rank of the source,
        then of the target, then the transition's name)."""
        moves: dict[str, list[Edge]] = {}
        for move in sorted(self.names, key=self._order):
            for event_type in self.events[move]:
                moves.setdefault(event_type, []).append(move)
        return {event_type: tuple(found) for event_type, found in moves.items()}

    def _order(self, move: Edge) -> tuple:
        return (self.rank[move[0]], self.rank[move[1]], self.names[move])

    @property
    def event_types(self) -> tuple[str, ...]:
        """Every event type some transition accepts, in the graph's order."""
        return tuple(self.event_moves)

    @cached_property
    def event_transitions(self) -> frozenset[Edge]:
        """The moves a processor event may make; the others belong to our submission's answer."""
        return frozenset(move for move, types in self.events.items() if types)

    @cached_property
    def event_targets(self) -> dict[str, str]:
        """Event type -> the state it drives a payment to from the start of the graph."""
        return {event_type: moves[0][1] for event_type, moves in self.event_moves.items()}

    def event_target(self, event_type: str, current: str) -> str:
        """The state ``event_type`` drives a payment in state ``current`` to: the target of the
        latest of its moves whose source the payment has reached, or of its first move if the
        payment has reached none (then the move is refused or stale). A ``returned`` event thus
        fails a payment before settlement and returns it after."""
        moves = self.event_moves[event_type]
        target = moves[0][1]
        for source, move_target in moves:
            if current in self._reachable[source]:
                target = move_target
        return target

    def is_stale(self, target: str, current: str) -> bool:
        """A target that equals or lies behind the current state: acknowledged, nothing moves."""
        return target == current or self.rank[target] < self.rank[current]
