"""Dependencies point one way, triage -> bank -> callbacks -> payments: each app changes only its
own tables through its own services, and an app lower down never reaches up, not even lazily
inside a function, nor by name through ``apps.get_model`` or ``import_string``. None of them
reaches the project's development app, the sandbox processor, which a host does not install.

The bank-direct path (``bank``) is a plug-in above the queue: the payments core reaches it only
through the processor backend setting (``PROCESSOR_BACKEND``) and the backend's hooks."""

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# What each app may not depend on.
FORBIDDEN = {
    "payments": ("callbacks", "bank", "triage", "sandbox"),
    "callbacks": ("bank", "triage", "sandbox"),
    "bank": ("triage", "sandbox"),
    "triage": ("sandbox",),
}
# History that may not change: payments.0020 (0.1.0) sealed the NACHA files stored in the clear
# with the vault, which has since moved up into the bank app; the migration still needs it.
HISTORY = {"payments/migrations/0020_nacha_file_content_sealed.py": ("bank",)}
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
        if (
            refs := upward_references(
                path.read_text(),
                tuple(
                    name
                    for name in FORBIDDEN[app]
                    if name not in HISTORY.get(str(path.relative_to(ROOT)), ())
                ),
            )
        )
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


# --- no import cycle -------------------------------------------------------------------------

PRODUCT_APPS = ("payments", "callbacks", "bank", "triage")


def product_sources() -> dict[str, str]:
    """Every product module (migrations left out) by dotted name, with its source."""
    sources = {}
    for app in PRODUCT_APPS:
        for path in sorted((ROOT / app).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            sources[".".join(parts)] = path.read_text()
    return sources


@functools.cache
def imported_names(source: str, package: str) -> tuple[str, ...]:
    """Every dotted name ``source`` imports (at the top or inside a function), relative
    imports made absolute from ``package``; what only a type checker reads (``if
    TYPE_CHECKING:``) is left out: it never runs. Kept per source: the tests build the graph
    of the same two hundred modules again and again, with one of them changed (parsing them
    was 5 to 7 s a test on two shared cores)."""
    tree = ast.parse(source)
    skipped = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for inner in ast.walk(node)
    }
    names: list[str] = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package
                for _ in range(node.level - 1):
                    anchor = anchor.rpartition(".")[0]
                base = f"{anchor}.{base}" if base else anchor
            names += [base, *(f"{base}.{alias.name}" for alias in node.names)]
    return tuple(names)


def import_graph(sources: dict[str, str]) -> dict[str, set[str]]:
    """Module -> the modules it imports (``imported_names``), each import resolved to the
    deepest module of ``sources`` it names."""

    def resolve(name: str) -> str | None:
        while name and name not in sources:
            name = name.rpartition(".")[0]
        return name or None

    packages = {m.rpartition(".")[0] for m in sources}  # the modules others are named under
    graph: dict[str, set[str]] = {name: set() for name in sources}
    for module, source in sources.items():
        package = module if module in packages else module.rpartition(".")[0]
        for name in imported_names(source, package):
            target = resolve(name)
            if target is not None and target != module:
                graph[module].add(target)
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                cycles.append(frozenset(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def test_the_product_apps_have_no_import_cycle():
    assert import_cycles(import_graph(product_sources())) == []


def test_the_cycle_check_finds_an_injected_cycle():
    sources = product_sources()
    sources["payments.catalogue"] += "\nfrom payments.services import events\n"
    cycles = import_cycles(import_graph(sources))
    assert any({"payments.catalogue", "payments.services.events"} <= cycle for cycle in cycles)


def test_the_cycle_check_reads_relative_lazy_and_type_checking_imports():
    graph = import_graph(
        {
            "a": "",
            "a.b": "def f():\n    from . import c\n",
            "a.c": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from a import b\n",
            "a.d": "from .b import f\n",
        }
    )
    assert graph["a.b"] == {"a", "a.c"}  # the package, then its module
    assert graph["a.c"] == set()
    assert graph["a.d"] == {"a.b"}


# --- layers ----------------------------------------------------------------------------------

# What Django, a host or an operator reaches an app through: its API views, admin pages, routes,
# middleware, schema, tasks, commands and start-up checks. The rest of an app is its core
# (models, services, selectors, the worker...), which these build on and which never imports
# them back.
INTERFACE = {"apis", "admin", "admin_base", "views", "urls", "openapi", "tasks", "management"}
INTERFACE |= {"checks", "apps", "dashboard", "api", "middleware"}
# Of the payments API's package, the envelope and the input fields are the core's too: the
# version header's refusal and the webhooks' serializers are written in them.
API_CORE = {"payments.api.errors", "payments.api.fields"}


def layer(module: str) -> int:
    """0 the shared kernel (``payments.kernel``), 2 an interface module (a part named in
    ``INTERFACE``, or ending in ``_admin`` or ``_apis``), 1 the core."""
    parts = module.split(".")
    if parts[:2] == ["payments", "kernel"]:
        return 0
    if module in API_CORE:
        return 1
    if any(part in INTERFACE or part.endswith(("_admin", "_apis")) for part in parts[1:]):
        return 2
    return 1


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Each import of a module of a higher layer, in any app."""
    return sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        for target in targets
        if layer(target) > layer(module)
    )


def test_no_module_imports_a_module_of_a_layer_above_it():
    assert upward_imports(import_graph(product_sources())) == []


@pytest.mark.parametrize(
    ("module", "line"),
    [
        ("payments.kernel.locks", "from payments import models\n"),
        ("payments.services.events", "from payments import admin\n"),
        ("callbacks.worker.loop", "def f():\n    from callbacks.apis import CallbackApi\n"),
        ("bank.nacha.services", "from payments.management.rounds import RoundsCommand\n"),
        ("payments.services.limits", "from payments.api.limits import MerchantLimitsApi\n"),
        ("payments.api.fields", "from payments.api.base import ModuleApiView\n"),
    ],
)
def test_the_layer_check_finds_an_injected_upward_import(module, line):
    sources = product_sources()
    sources[module] += "\n" + line
    assert upward_imports(import_graph(sources))


def test_the_kernel_imports_nothing_of_the_apps_outside_it():
    graph = import_graph(product_sources())
    outside = {
        f"{module} -> {target}"
        for module, targets in graph.items()
        if layer(module) == 0
        for target in targets
        if layer(target) != 0
    }
    assert outside == set()


# --- the worker's calls go one way -----------------------------------------------------------

WORKER_PACKAGE = "callbacks.worker"
WORKER_LOOP = "callbacks.worker.loop"


def loop_imports(source: str, submodules: set[str]) -> list[str]:
    """Every import in ``source`` of the worker's loop, or of the worker package by a name that
    is not one of its ``submodules`` (the package's ``__init__`` imports the loop to export
    ``Worker``): at the top, inside a function, or only for a type checker, which is how a
    runner typed with ``Worker`` would still be written against the loop."""

    def names_the_loop(module: str, names: list[str]) -> bool:
        if module == WORKER_LOOP or module.startswith(f"{WORKER_LOOP}."):
            return True
        return module == WORKER_PACKAGE and any(
            name == "loop" or f"{WORKER_PACKAGE}.{name}" not in submodules for name in names
        )

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [
                f"line {node.lineno}: import {alias.name}"
                for alias in node.names
                if alias.name in (WORKER_PACKAGE, WORKER_LOOP)
            ]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if names_the_loop(node.module, [alias.name for alias in node.names]):
                found.append(f"line {node.lineno}: from {node.module} import ...")
    return found


def import_path(graph: dict[str, set[str]], start: str, goal: str) -> list[str] | None:
    """The shortest chain of imports from ``start`` to ``goal``, or None."""
    previous: dict[str, str | None] = {start: None}
    frontier = [start]
    while frontier:
        following = []
        for module in frontier:
            for imported in sorted(graph[module]):
                if imported in previous:
                    continue
                previous[imported] = module
                if imported == goal:
                    chain = [goal]
                    while (step := previous[chain[-1]]) is not None:
                        chain.append(step)
                    return chain[::-1]
                following.append(imported)
        frontier = following
    return None


def worker_modules_reaching_the_loop(sources: dict[str, str]) -> dict[str, list[str]]:
    """Each module of the worker package but the loop and the package itself that imports the
    loop (``loop_imports``) or reaches it through the imports of other product modules."""
    submodules = {name for name in sources if name.startswith(f"{WORKER_PACKAGE}.")}
    graph = import_graph(sources)
    violations = {}
    for module in sorted(submodules - {WORKER_LOOP}):
        found = loop_imports(sources[module], submodules)
        path = import_path(graph, module, WORKER_LOOP)
        if path is not None:
            found.append(" -> ".join(path))
        if found:
            violations[module] = found
    return violations


def test_no_module_of_the_worker_imports_its_loop():
    """The loop is the worker's top: it builds the messages in hand and the rules and hands
    them down to the runners, which never call back up into it."""
    sources = product_sources()
    assert {WORKER_LOOP, "callbacks.worker.batch", "callbacks.worker.hand"} <= set(sources)

    assert worker_modules_reaching_the_loop(sources) == {}


@pytest.mark.parametrize(
    "module, injected",
    [
        ("callbacks.worker.batch", "from callbacks.worker.loop import Worker\n"),
        ("callbacks.worker.outcomes", "from callbacks.worker import Worker\n"),
        ("callbacks.worker.hand", "def f():\n    import callbacks.worker.loop\n"),
        (
            "callbacks.worker.message",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from callbacks.worker.loop import Worker\n",
        ),
        # Not in the package, but imported by it: the runner reaches the loop through it.
        ("callbacks.handlers", "def f():\n    from callbacks.worker.loop import Worker\n"),
    ],
)
def test_the_loop_check_finds_an_injected_import_of_the_loop(module, injected):
    sources = product_sources()
    sources[module] += "\n" + injected

    violations = worker_modules_reaching_the_loop(sources)

    assert violations
    if module.startswith(f"{WORKER_PACKAGE}."):
        assert module in violations
    else:
        assert any(module in chain for chains in violations.values() for chain in chains)


def test_the_loop_check_leaves_sibling_imports_alone():
    submodules = {"callbacks.worker.hand", "callbacks.worker.outage"}
    source = (
        "import callbacks.worker.hand as hand\n"
        "from callbacks.worker import outage\n"
        "from callbacks.worker.outage import DatabaseDown\n"
    )
    assert loop_imports(source, submodules) == []
