"""The IAM table (callbacks/sqs_access.py) lists every SQS call site the code has, each with
exactly the operations it uses: read from the code, not trusted."""

import ast

from callbacks.sqs_access import OPERATION_ACTIONS, SQS_CALL_SITES, ProcessRole, role_permissions
from tests.deploy.sqs_calls import (
    DYNAMIC,
    GATEWAY,
    PRODUCT_PACKAGES,
    ROOT,
    SQS_OPERATIONS,
    call_sites_in_source,
    gateway_operations,
    product_call_sites,
)


def declared() -> dict[str, set[str]]:
    return {site.function: set(site.operations) for site in SQS_CALL_SITES if not site.third_party}


def test_every_sqs_call_site_in_the_code_is_declared_with_its_operations():
    found = product_call_sites()
    table = declared()
    undeclared = {site: sorted(ops) for site, ops in found.items() if site not in table}
    assert not undeclared, f"SQS call sites missing from callbacks/sqs_access.py: {undeclared}"
    wrong = {
        site: {"code": sorted(ops), "table": sorted(table[site])}
        for site, ops in found.items()
        if ops != table[site]
    }
    assert not wrong, f"call sites whose operations differ from the table: {wrong}"


def test_every_declared_call_site_still_exists():
    gone = set(declared()) - set(product_call_sites())
    assert not gone, f"declared in callbacks/sqs_access.py but no longer calling SQS: {gone}"


def test_no_call_site_reaches_sqs_in_a_way_the_reader_cannot_follow():
    dynamic = [site for site, ops in product_call_sites().items() if DYNAMIC in ops]
    assert not dynamic


def test_every_declared_operation_is_an_sqs_operation_with_an_iam_action():
    for site in SQS_CALL_SITES:
        assert site.operations <= SQS_OPERATIONS, site.function
        assert site.operations <= set(OPERATION_ACTIONS), site.function
        assert site.roles, f"{site.function} runs under no role"
        assert all(site.access.values()), f"{site.function} declares a queue with no operation"


def test_every_role_calls_something():
    for role in ProcessRole:
        assert role_permissions(role), role


def test_the_reader_finds_direct_gateway_and_dynamic_calls():
    """The scanner is not vacuous: each way of reaching SQS in a module is found."""
    gateway = gateway_operations()
    source = """
from callbacks import sqs
from callbacks.sqs import queue_attributes as attrs

def direct():
    sqs.sqs_client().purge_queue(QueueUrl="u")

def through_gateway():
    sqs.send_messages_now([])

def as_a_value():
    return [sqs.dead_letter_queue_url, attrs]

def _call(operation, **kwargs):
    return getattr(sqs.sqs_client(), operation)(**kwargs)

def caller():
    _call("tag_queue", QueueUrl="u", Tags={})

def unknown(name):
    _call(name)

def unrelated():
    return {"send": 1}.get("send")
"""
    sites = call_sites_in_source("example", source, gateway)
    assert sites == {
        "example:direct": {"purge_queue"},
        "example:through_gateway": {"send_message_batch", "get_queue_url"},
        "example:as_a_value": {"get_queue_url", "get_queue_attributes"},
        "example:_call": {"tag_queue", DYNAMIC},
    }


def test_gateway_operations_follow_the_gateways_own_calls():
    gateway = gateway_operations()
    assert gateway["send_message_now"] == {"send_message", "get_queue_url"}
    assert gateway["main_queue_url"] == {"get_queue_url"}
    # Batch calls go through one chunking helper: the operation is named where the helper is
    # called, and found there.
    assert gateway["change_visibility_batch"] == {"change_message_visibility_batch"}
    assert gateway["delete_messages"] == {"delete_message_batch"}
    assert gateway["receive_messages"] == {"receive_message"}
    assert "sqs_client" not in gateway  # the bare client: calls on it are counted where made


def test_no_product_module_but_the_gateway_touches_the_boto3_client():
    """Every call goes through ``callbacks.sqs``'s typed functions (and its transaction rule);
    the lint keeps boto3 imports out, this keeps the gateway's own client out."""
    reaching = []
    for package in PRODUCT_PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path == GATEWAY or "migrations" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                name = getattr(node, "attr", None) or getattr(node, "id", None)
                if name == "sqs_client":
                    reaching.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert reaching == []
