"""The worker runs messages without knowing what they are: the handler registry
(``callbacks.handlers``) names the kinds, their gates and their ticks, and the worker package
only calls what the registry gives it. A kind or a payments exception named inside the worker
would be a second place to change when a kind is added."""

import ast
from pathlib import Path

import pytest

from callbacks.handlers import DEFAULT_HANDLERS

WORKER = Path(__file__).resolve().parents[2] / "callbacks" / "worker"
MODULES = sorted(WORKER.glob("*.py"))


def imported_modules(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_the_worker_package_has_modules_to_check():
    assert {path.name for path in MODULES} >= {"loop.py", "batch.py", "outcomes.py"}


@pytest.mark.parametrize("path", MODULES, ids=lambda path: path.name)
def test_a_worker_module_imports_nothing_of_payments(path):
    tree = ast.parse(path.read_text())

    assert not {name for name in imported_modules(tree) if name.split(".")[0] == "payments"}


@pytest.mark.parametrize("path", MODULES, ids=lambda path: path.name)
def test_a_worker_module_names_no_message_kind(path):
    tree = ast.parse(path.read_text())
    strings = {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }
    names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    names |= {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}

    assert not strings & set(DEFAULT_HANDLERS)
    assert not names & {"SUBMIT_PAYMENT", "PROCESSOR_EVENT", "ProcessorCircuitOpen"}
    assert "callbacks.schema" not in imported_modules(tree)
