"""Dependencies point one way, triage -> callbacks -> payments: each app changes only its own
tables through its own services, and an app lower down never reaches up, not even lazily inside
a function, nor by name through ``apps.get_model`` or ``import_string``. None of them reaches the
project's development app, the sandbox processor, which a host does not install."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# What each app may not depend on.
FORBIDDEN = {
    "payments": ("callbacks", "triage", "sandbox"),
    "callbacks": ("triage", "sandbox"),
    "triage": ("sandbox",),
}
# Calls that reach another app by a dotted name or an app label held in a string.
BY_NAME = {"get_model", "import_string", "import_module"}


def upward_references(source: str, forbidden: tuple[str, ...]) -> list[str]:
    """Every import (top-level or inside a function) and by-name lookup of a forbidden app."""

    def hits(name: str) -> bool:
        return name.split(".")[0] in forbidden

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [f"line {node.lineno}: import {a.name}" for a in node.names if hits(a.name)]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module and hits(node.module):
                found.append(f"line {node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in BY_NAME and node.args:
                first = node.args[0]
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    if hits(first.value):
                        found.append(f"line {node.lineno}: {name}({first.value!r})")
    return found


@pytest.mark.parametrize("app", sorted(FORBIDDEN))
def test_an_app_references_nothing_above_it(app):
    files = sorted((ROOT / app).rglob("*.py"))
    assert files, f"no Python files found under {app}/"

    violations = {
        str(path.relative_to(ROOT)): refs
        for path in files
        if (refs := upward_references(path.read_text(), FORBIDDEN[app]))
    }

    assert violations == {}, f"{app} must not depend on {', '.join(FORBIDDEN[app])}"


@pytest.mark.parametrize(
    "source",
    [
        "import triage.services\n",
        "from triage.selectors import hold_release_blockers\n",
        "def f():\n    from triage import services\n",
        "from django.apps import apps\nDeadLetter = apps.get_model('triage', 'DeadLetter')\n",
        "from django.utils.module_loading import import_string\nimport_string('triage.x.y')\n",
    ],
)
def test_the_check_catches_each_way_of_reaching_up(source):
    assert upward_references(source, ("triage",))


@pytest.mark.parametrize(
    "source",
    [
        "import triage_tools\n",
        "from . import triage\n",
        "from callbacks.selectors import payment_active_hold\n",
        "x = 'triage.services:dead_letters_ingest'\n",
    ],
)
def test_the_check_leaves_other_names_alone(source):
    assert upward_references(source, ("triage",)) == []
