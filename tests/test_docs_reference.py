"""The documentation's references are generated from the code (scripts/docs_reference.py) and
committed: each test here fails when a committed page differs from what the code declares now,
naming the page. ``make docs`` writes them again."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _generator():
    spec = importlib.util.spec_from_file_location(
        "docs_reference", ROOT / "scripts" / "docs_reference.py"
    )
    module = importlib.util.module_from_spec(spec)
    # Registered first, as an import would: its dataclasses look their module up by name.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


docs_reference = _generator()


@pytest.fixture(scope="module")
def codes():
    """``error_codes()`` once for the tests that read it (it parses every module of the apps and
    follows each view's calls: 2 to 3 s a call with every process busy)."""
    return docs_reference.error_codes()


@pytest.mark.parametrize("page", sorted(docs_reference.PAGES))
def test_the_committed_reference_is_what_the_code_declares(page):
    committed = docs_reference.REFERENCE / page
    assert committed.exists(), f"docs/reference/{page} is missing: run make docs"
    assert committed.read_text() == docs_reference.PAGES[page](), (
        f"docs/reference/{page} differs from the code: run make docs and commit it"
    )


def test_every_setting_has_its_meaning_and_every_meaning_a_setting(tmp_path, monkeypatch):
    import yaml

    meanings = yaml.safe_load(docs_reference.MEANINGS.read_text())
    del meanings["TRIAGE"]["ALERT_WEBHOOK_URL"]
    edited = tmp_path / "settings.yml"
    monkeypatch.setattr(docs_reference, "MEANINGS", edited)

    edited.write_text(yaml.safe_dump(meanings))
    with pytest.raises(SystemExit, match=r"no meaning for TRIAGE\['ALERT_WEBHOOK_URL'\]"):
        docs_reference.settings_reference()

    meanings["TRIAGE"]["ALERT_WEBHOOK_URL"] = "back"
    meanings["PAYMENTS"]["NO_SUCH_SETTING"] = "a setting no app declares"
    edited.write_text(yaml.safe_dump(meanings))
    with pytest.raises(SystemExit, match="NO_SUCH_SETTING"):
        docs_reference.settings_reference()


def test_a_setting_added_to_an_app_shows_in_the_reference(monkeypatch):
    from payments.kernel.setting_specs import Flag
    from triage import conf

    monkeypatch.setitem(conf.SPECS, "DOCS_PROBE", Flag(False))
    monkeypatch.setattr(conf.triage_settings, "names", conf.triage_settings.names | {"DOCS_PROBE"})
    with pytest.raises(SystemExit, match=r"no meaning for TRIAGE\['DOCS_PROBE'\]"):
        docs_reference.settings_reference()


def test_the_error_codes_include_every_reinitiation_rule_and_the_envelopes_own(codes):
    from payments.services.reinitiation import RULES

    assert set(RULES) <= set(codes)
    for code, status, error_type in (
        ("database_unavailable", 503, "api_error"),
        ("internal_error", 500, "api_error"),
        ("idempotency_key_reused", 422, "invalid_request_error"),
        ("idempotency_key_in_use", 409, "idempotency_error"),
        ("queue_unavailable", 503, "api_error"),
        ("merchant_forbidden", 403, "permission_error"),
    ):
        assert (codes[code].statuses, codes[code].types) == ({status}, {error_type}), code


def test_each_code_names_the_endpoints_that_answer_it(codes):
    refunds = "POST /api/payments/{payment_id}/refunds/"
    reinitiate = "POST /api/payments/{payment_id}/reinitiate/"

    # A rule is the refusal of the service the view calls: a refund's never on the payout.
    assert codes["refund_exceeds_refundable"].endpoints == {refunds}
    assert codes["insufficient_available_balance"].endpoints == {"POST /api/payouts/"}
    assert codes["credits_unsupported"].endpoints == {refunds, "POST /api/payouts/"}
    assert codes["notification_of_change_past_deadline"].endpoints == {
        "POST /api/payments/",
        reinitiate,
    }
    assert codes["queue_unavailable"].endpoints == {"POST /callbacks/processor/"}
    assert codes["api_version_invalid"].endpoints == {docs_reference.EVERY_API}
    assert codes["not_authenticated"].endpoints == {docs_reference.EVERY}
    assert "GET /api/payments/" not in codes["resource_missing"].endpoints
    assert all(entry.endpoints for entry in codes.values()), "a code no endpoint answers"


def test_the_reference_lists_each_code_once_and_what_a_client_does_with_each_type(codes):
    from payments.api.errors import ErrorType

    text = (ROOT / "docs" / "reference" / "error-codes.md").read_text()
    listed = [line.split("|")[1].strip() for line in text.splitlines() if line.startswith("| `")]
    types = {f"`{t.value}`" for t in ErrorType}

    named = [name for name in listed if name not in types]
    assert len(named) == len(set(named)) == len(codes)
    assert set(listed) & types == types
    assert "`noc_past_deadline` from `PaymentReinitiateApi`" in text


def test_a_type_without_what_a_client_does_stops_the_reference(monkeypatch):
    actions = dict(docs_reference.TYPE_ACTIONS)
    del actions["idempotency_error"]
    monkeypatch.setattr(docs_reference, "TYPE_ACTIONS", actions)

    with pytest.raises(SystemExit, match="idempotency_error"):
        docs_reference.error_codes_reference()


def test_the_settings_reference_counts_and_names_every_apps_dict_and_its_links_lead_to_pages():
    import re

    from payments.kernel.app_settings import AppSettings

    text = (ROOT / "docs" / "reference" / "settings.md").read_text()
    intro = text.split("\n## ")[0]
    words = {3: "three", 4: "four", 5: "five"}

    assert f"are {words[len(AppSettings.every)]} Django settings" in intro
    assert all(f"`{app.setting}`" in intro for app in AppSettings.every)
    # A row points to a page of the site, never to a section of the README.
    assert "README" not in text
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    assert targets and all((ROOT / "docs" / "reference" / t).resolve().exists() for t in targets)


def test_no_module_code_reads_a_settings_dict_outside_the_four_apps_settings():
    """Every setting goes through an app's declared specs: a host dict read by name elsewhere
    (as the books' ``PAYMENTS_BOOKS`` was) stays out of the generated reference."""
    import re

    reads = re.compile(r"getattr\(\s*settings,\s*[\"']([A-Z_]+)[\"']")
    found = {
        (path.relative_to(ROOT).as_posix(), name)
        for app in ("payments", "callbacks", "bank", "triage")
        for path in (ROOT / app).rglob("*.py")
        for name in reads.findall(path.read_text())
    }

    # Django's and Celery's own settings, which the apps read and never declare.
    hosts_own = {"LOGGING", "CELERY_BROKER_TRANSPORT_OPTIONS"}
    assert {name for _, name in found} <= hosts_own, found


def test_a_refusal_whose_rules_the_reference_does_not_know_stops_it():
    """A new service refusal answered by its rule (``ApiError(409, exc.rule, ...)``) must name
    its rules, or its codes would be missing from the reference."""
    import ast

    source = (
        "def _answer():\n"
        "    try:\n"
        "        account_validate()\n"
        "    except AccountRefused as exc:\n"
        "        raise ApiError(409, exc.rule, str(exc))\n"
    )

    with pytest.raises(SystemExit, match="AccountRefused"):
        docs_reference._unit_of(ast.parse(source), "payments.accounts")
