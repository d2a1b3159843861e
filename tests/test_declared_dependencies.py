"""The module declares what it imports: a host installs the wheel with pyproject.toml's
dependencies alone, so an import of a distribution that only requirements.txt names works here
and fails there.

Every import in the four apps is read from the source (no app is imported) and traced to the
distribution that provides it in this environment. An import the module cannot start without (at
a module's top level, outside a ``try`` that catches ``ImportError``) must come from
``[project] dependencies``; one that is guarded, or that sits in the module of an extra, from the
dependencies or that extra. The lock (requirements.txt) pins each declared distribution at a
version inside its declared range, and the paths its comments name exist.
"""

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
APPS = ("payments", "callbacks", "bank", "triage")
# A module a host loads only when it opts into the extra, by naming it in its settings.
EXTRA_MODULES = {"bank/nacha/sftp.py": "sftp"}
IMPORT_ERRORS = {"ImportError", "ModuleNotFoundError"}


def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def declared() -> tuple[dict[str, Requirement], dict[str, set[str]]]:
    """The base dependencies by canonical name, and each extra's distributions."""
    table = project()
    base = {canonicalize_name(r.name): r for r in map(Requirement, table["dependencies"])}
    extras = {
        extra: {canonicalize_name(Requirement(line).name) for line in lines}
        for extra, lines in table["optional-dependencies"].items()
    }
    return base, extras


def guards_import_error(node: ast.Try) -> bool:
    for handler in node.handlers:
        caught = handler.type
        names = caught.elts if isinstance(caught, ast.Tuple) else [caught]
        if any(isinstance(n, ast.Name) and n.id in IMPORT_ERRORS for n in names):
            return True
    return False


def imports(tree: ast.Module) -> list[tuple[str, bool]]:
    """(top-level module name, required) for every absolute import of a module's source.
    Required: run when the module is imported, not behind an ImportError guard, a function or
    ``if TYPE_CHECKING``."""
    found = []

    def visit(nodes: list[ast.stmt], required: bool) -> None:
        for node in nodes:
            if isinstance(node, ast.Import):
                found.extend((alias.name.split(".")[0], required) for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                found.append((node.module.split(".")[0], required))
            elif isinstance(node, ast.Try):
                guarded = guards_import_error(node)
                visit(node.body, required and not guarded)
                for part in (node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                    visit(part, required)
            elif isinstance(node, ast.If):
                type_checking = "TYPE_CHECKING" in ast.unparse(node.test)
                visit(node.body, required and not type_checking)
                visit(node.orelse, required)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                # A class body runs at import; a function's body only when called.
                visit(node.body, required and isinstance(node, ast.ClassDef))
            elif isinstance(node, (ast.With, ast.For, ast.While)):
                visit(node.body, required)

    visit(tree.body, True)
    return found


def app_imports() -> list[tuple[str, str, bool]]:
    """(file, top-level module, required) for every third-party import of the apps."""
    local = {*APPS, "__future__"}
    result = []
    for app in APPS:
        for path in sorted((ROOT / app).rglob("*.py")):
            name = path.relative_to(ROOT).as_posix()
            for module, required in imports(ast.parse(path.read_text(), filename=name)):
                if module not in sys.stdlib_module_names and module not in local:
                    result.append((name, module, required))
    return result


def test_the_scan_sees_required_guarded_and_lazy_imports():
    source = """
import json
import alpha
from beta.sub import x
try:
    import gamma
except ImportError:
    gamma = None
if TYPE_CHECKING:
    import delta
def f():
    import epsilon
class C:
    import zeta
"""
    assert imports(ast.parse(source)) == [
        ("json", True),
        ("alpha", True),
        ("beta", True),
        ("gamma", False),
        ("delta", False),
        ("epsilon", False),
        ("zeta", True),
    ]


def test_every_import_of_the_apps_comes_from_a_declared_distribution():
    base, extras = declared()
    anywhere = set(base).union(*extras.values())
    providers = packages_distributions()
    undeclared = []
    for name, module, required in app_imports():
        dists = {canonicalize_name(d) for d in providers.get(module, [])}
        assert dists, f"{name} imports {module}, which no installed distribution provides"
        allowed = set(base)
        if name in EXTRA_MODULES:
            allowed |= extras[EXTRA_MODULES[name]]
        elif not required:
            allowed = anywhere
        if not dists & allowed:
            where = "[project] dependencies" if required else "the dependencies or an extra"
            undeclared.append(f"{name}: {module} ({', '.join(sorted(dists))}) not in {where}")
    assert not undeclared, "\n".join(undeclared)


def test_the_json_log_formatter_is_a_declared_dependency():
    """The formatter and filter a host's LOGGING names live in a module that imports
    python-json-logger at its top: a host without it cannot configure logging at all."""
    base, _ = declared()
    found = [m for n, m, req in app_imports() if n == "payments/kernel/logformat.py" and req]

    assert "pythonjsonlogger" in found
    assert "python-json-logger" in base


def lock() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            requirement = Requirement(line)
            (spec,) = requirement.specifier
            pins[canonicalize_name(requirement.name)] = spec.version
    return pins


def test_the_lock_pins_every_declared_distribution_inside_its_range():
    base, _ = declared()
    pins = lock()
    table = project()
    extra_requirements = [
        Requirement(r) for rs in table["optional-dependencies"].values() for r in rs
    ]

    for requirement in [*base.values(), *extra_requirements]:
        name = canonicalize_name(requirement.name)
        if name not in pins:
            continue  # an extra the project itself does not run (the otel instrumentations)
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"requirements.txt pins {name}=={pins[name]}, outside pyproject's {requirement}"
        )
    assert not set(base) - set(pins), "a dependency the project's lock does not pin"


@pytest.mark.parametrize(
    "path",
    sorted(set(re.findall(r"\b[a-z_]+/[\w/]+\.py\b", (ROOT / "requirements.txt").read_text()))),
)
def test_a_path_the_lock_names_exists(path):
    assert (ROOT / path).exists(), f"requirements.txt names {path}, which does not exist"
