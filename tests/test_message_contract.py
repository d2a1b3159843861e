"""One module builds and reads every queue message (``payments.messages``): no other product
module writes a message kind, or an envelope's key, as a literal."""

import ast
from pathlib import Path

import pytest

from payments.messages import MARK_KEYS, MessageKind

ROOT = Path(__file__).resolve().parent.parent
CONTRACT = ROOT / "payments" / "messages.py"
APPS = ("payments", "callbacks", "bank", "triage")
# The event log's kind of row for a processor event: a column value, not a message kind.
ALLOWED = {("payments/models/events.py", MessageKind.PROCESSOR_EVENT.value)}
ENVELOPE_KEYS = {"kind", "event", "received_at", *MARK_KEYS}


def literal_uses(source: str) -> list[tuple[int, str]]:
    """Each message kind written as a string, and each dict literal shaped like an envelope
    (a ``kind`` key beside another envelope key, or a queue layer's mark as a key)."""
    found = []
    kinds = {kind.value for kind in MessageKind}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and node.value in kinds:
            found.append((node.lineno, node.value))
        elif isinstance(node, ast.Dict):
            keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
            if ("kind" in keys and keys & (ENVELOPE_KEYS - {"kind"})) or keys & set(MARK_KEYS):
                found.append((node.lineno, f"an envelope {{{', '.join(sorted(keys))}}}"))
    return found


def test_no_product_module_but_the_contract_writes_a_message_kind_or_envelope():
    violations = {}
    for app in APPS:
        for path in sorted((ROOT / app).rglob("*.py")):
            if path == CONTRACT or "migrations" in path.parts:
                continue
            rel = str(path.relative_to(ROOT))
            uses = [u for u in literal_uses(path.read_text()) if (rel, u[1]) not in ALLOWED]
            if uses:
                violations[rel] = uses
    assert violations == {}


@pytest.mark.parametrize(
    "source",
    [
        'KIND = "submit_payment"\n',
        'body = {"kind": x, "event": e, "received_at": t}\n',
        'body = {"payment_id": p, "dead_letter": {}}\n',
        'f(kind="processor_event")\n',
    ],
)
def test_the_check_catches_each_way_of_writing_one(source):
    assert literal_uses(source)


def test_the_check_leaves_other_kinds_of_kind_alone():
    assert not literal_uses('extra = {"kind": hold.kind, "rows": 3}\n')
