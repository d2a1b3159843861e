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


PRODUCT_APPS = ("payments", "callbacks", "bank", "triage")
# What only the two bases may call: the Idempotency-Key's run and header (CreateApi) and the
# strict cursor's pages (ReadApi). A view that called them itself would be a second copy of
# the create or the list, as the refund view once was of the reinitiation's.
BASE_ONLY = {"idempotency_key_run", "idempotency_key_header", "PaymentPagination"}
BASE = Path("payments/api/base.py")


def calls_of(source: str, names: set[str]) -> set[str]:
    """The names of ``names`` that ``source`` calls."""
    called = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in names:
                called.add(name)
    return called


def test_only_the_bases_run_an_idempotency_key_or_page_a_list():
    root = API.parents[1]
    callers = {
        f"{path.relative_to(root)}: {name}"
        for app in PRODUCT_APPS
        for path in sorted((root / app).rglob("*.py"))
        if "migrations" not in path.parts and path.relative_to(root) != BASE
        for name in calls_of(path.read_text(), BASE_ONLY)
    }
    assert callers == set()
    assert calls_of((root / BASE).read_text(), BASE_ONLY) == BASE_ONLY


def test_the_base_only_check_finds_a_view_that_runs_a_key_itself():
    source = "def post(request):\n    return idempotency.idempotency_key_run(user=None)\n"
    assert calls_of(source, BASE_ONLY) == {"idempotency_key_run"}
