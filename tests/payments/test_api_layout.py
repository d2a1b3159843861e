"""The payments API's layout, held by tests: one module per resource on two bases, and no
function in ``payments/api/`` so long that a reader cannot see it whole."""

import ast
from pathlib import Path

import pytest

API = Path(__file__).resolve().parents[2] / "payments" / "api"
MAX_LINES = 60


def long_functions(source: str, name: str, limit: int = MAX_LINES) -> list[str]:
    """Every function or method in ``source`` longer than ``limit`` lines, decorators and
    docstring included, as ``name:line function (n lines)``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            length = node.end_lineno - start + 1
            if length > limit:
                found.append(f"{name}:{start} {node.name} ({length} lines)")
    return found


def test_no_function_of_the_api_package_is_over_60_lines():
    modules = sorted(API.glob("*.py"))
    assert len(modules) >= 10
    too_long = [
        problem for path in modules for problem in long_functions(path.read_text(), path.name)
    ]
    assert too_long == []


@pytest.mark.parametrize("length", [MAX_LINES, MAX_LINES + 1])
def test_the_length_check_counts_a_function_of_a_given_length(length):
    body = "".join(f"    x{i} = {i}\n" for i in range(length - 2))
    source = f"class View:\n    @staticmethod\n    def post():\n{body}"
    source = source.replace("\n    x", "\n        x")
    found = long_functions(source, "probe.py")
    assert found == ([] if length <= MAX_LINES else [f"probe.py:2 post ({length} lines)"])
