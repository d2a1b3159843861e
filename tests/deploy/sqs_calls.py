"""Finding every SQS call in the product's code by reading it (ast), for the IAM table's tests.

A call site is a function that uses the boto3 SQS client (any attribute named after an SQS
operation, e.g. ``client.receive_message``), or a function of the gateway ``callbacks.sqs`` that
reaches SQS (``sqs.send_message_now``, ``sqs.main_queue_url`` passed around as a value, ...). A
gateway function stands for the operations it reaches, followed through the gateway's own
calls. ``getattr(<client>, name)`` is followed to the string literals the enclosing function is
called with in its module. Anything else that reaches SQS dynamically is reported as such, so
it cannot slip through.
"""

import ast
from pathlib import Path

import botocore.session
from botocore import xform_name

ROOT = Path(__file__).resolve().parents[2]
PRODUCT_PACKAGES = ("callbacks", "payments", "bank", "triage", "config")
GATEWAY = ROOT / "callbacks" / "sqs.py"
DYNAMIC = "<dynamic>"

SQS_OPERATIONS = frozenset(
    xform_name(name)
    for name in botocore.session.get_session().get_service_model("sqs").operation_names
)


def _functions(tree: ast.AST):
    """(qualname, node) of every function, methods as ``Class.method``."""

    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                yield name, child
                yield from walk(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")
            else:
                yield from walk(child, prefix)

    yield from walk(tree, "")


def _own_nodes(function: ast.AST):
    """The nodes of a function's body, without those of functions nested in it."""
    stack = list(ast.iter_child_nodes(function))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def gateway_operations(source: str | None = None) -> dict[str, frozenset[str]]:
    """Each gateway function's SQS operations, its calls to other gateway functions followed."""
    tree = ast.parse(source if source is not None else GATEWAY.read_text())
    direct: dict[str, set[str]] = {}
    uses: dict[str, set[str]] = {}
    top = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    for name, function in _functions(tree):
        direct[name] = set()
        uses[name] = set()
        for node in _own_nodes(function):
            if isinstance(node, ast.Attribute) and node.attr in SQS_OPERATIONS:
                direct[name].add(node.attr)
            elif isinstance(node, ast.Name) and node.id in top and node.id != name:
                uses[name].add(node.id)
    closed: dict[str, frozenset[str]] = {}
    for name in direct:
        seen, todo, ops = {name}, [name], set()
        while todo:
            current = todo.pop()
            ops |= direct.get(current, set())
            for used in uses.get(current, set()) - seen:
                seen.add(used)
                todo.append(used)
        closed[name] = frozenset(ops)
    return {name: ops for name, ops in closed.items() if ops and "." not in name}


def _gateway_aliases(tree: ast.AST) -> tuple[set[str], dict[str, str]]:
    """Names this module binds to the gateway module, and to gateway functions."""
    modules, functions = set(), {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "callbacks":
            modules |= {a.asname or a.name for a in node.names if a.name == "sqs"}
        elif isinstance(node, ast.ImportFrom) and node.module == "callbacks.sqs":
            functions |= {a.asname or a.name: a.name for a in node.names}.items()
        elif isinstance(node, ast.Import):
            modules |= {a.asname for a in node.names if a.name == "callbacks.sqs" and a.asname}
    return modules, dict(functions)


def call_sites_in_source(module: str, source: str, gateway: dict[str, frozenset[str]]):
    """{``module:qualname``: operations} for one module's source."""
    tree = ast.parse(source)
    modules, imported = _gateway_aliases(tree)
    sites: dict[str, set[str]] = {}
    for qualname, function in _functions(tree):
        ops: set[str] = set()
        for node in _own_nodes(function):
            if isinstance(node, ast.Attribute):
                if node.attr in SQS_OPERATIONS:
                    ops.add(node.attr)
                elif (
                    isinstance(node.value, ast.Name)
                    and node.value.id in modules
                    and node.attr in gateway
                ):
                    ops |= gateway[node.attr]
            elif isinstance(node, ast.Name) and imported.get(node.id) in gateway:
                ops |= gateway[imported[node.id]]
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "getattr"
                and len(node.args) >= 2
                and not isinstance(node.args[1], ast.Constant)
                and "sqs_client" in ast.unparse(node.args[0])
            ):
                ops |= _literal_first_arguments(tree, function.name) or {DYNAMIC}
        if ops:
            sites[f"{module}:{qualname}"] = ops
    return sites


def _literal_first_arguments(tree: ast.AST, function_name: str) -> set[str]:
    found = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == function_name
        ):
            first = node.args[0] if node.args else None
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                found.add(first.value)
            else:
                found.add(DYNAMIC)
    return found


def product_call_sites() -> dict[str, set[str]]:
    """Every SQS call site of the product, outside the gateway itself."""
    gateway = gateway_operations()
    sites: dict[str, set[str]] = {}
    for package in PRODUCT_PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" in path.parts or path == GATEWAY:
                continue
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            sites.update(call_sites_in_source(module, path.read_text(), gateway))
    return sites
